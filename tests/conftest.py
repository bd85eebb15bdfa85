"""Every test runs with its own home directory, an empty working directory and no API keys.

Requests to hosted model APIs are refused (pydantic-ai's ALLOW_MODEL_REQUESTS); a test that
talks to a real server on 127.0.0.1 turns them on for itself.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_PROVIDER_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "OLLAMA_BASE_URL",
    "OLLAMA_API_KEY",
)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    import os

    from pydantic_ai import models

    home = tmp_path / "home"
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("MASTERPLANNER_HOME", str(home))
    for name in list(os.environ):
        if name.startswith("MASTERPLANNER_") and name != "MASTERPLANNER_HOME":
            monkeypatch.delenv(name)
    for name in _PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(work)
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)
    yield home


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[..., Path]:
    """Write a scripted-model file from a list of call entries and return its path."""
    counter = iter(range(1000))

    def write(calls: list[dict[str, Any]] | Any, raw: str | None = None) -> Path:
        path = tmp_path / f"script{next(counter)}.json"
        path.write_text(raw if raw is not None else json.dumps({"calls": calls}))
        return path

    return write


POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432"


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A fresh Postgres database on the local server (dropped afterwards); skips without a server."""
    import secrets

    psycopg = pytest.importorskip("psycopg")
    name = f"mp_test_{secrets.token_hex(4)}"
    try:
        admin = psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no Postgres server at {POSTGRES_SERVER}: {exc}")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield f"{POSTGRES_SERVER}/{name}"
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, isolated: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The settings' database, once SQLite and once a fresh Postgres database (the CLI uses it too)."""
    from masterplanner import Settings

    if request.param == "postgres":
        monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", request.getfixturevalue("postgres_database"))
    settings = Settings.load()
    settings.ensure_home()
    return settings.database_url
