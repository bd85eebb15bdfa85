"""The integration tests' fixtures: `cluster`, worker processes over a fresh Postgres database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _cluster import Cluster


@pytest.fixture
def cluster(postgres_database: str, tmp_path: Path) -> Iterator[Cluster]:
    started = Cluster(postgres_database, tmp_path / "home")
    try:
        yield started
    finally:
        started.close()
