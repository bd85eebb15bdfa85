"""`masterplanner run` with the embedded model, offline: the whole job, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.local_model


def test_haiku_run_writes_haiku_txt(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "run",
            "Write a haiku about the sea to haiku.txt",
            "--model",
            "local",
            "--yes",
            "--json",
            "--workspace",
            str(workspace),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "succeeded"
    haiku = workspace / "haiku.txt"
    assert haiku.is_file()
    assert haiku.read_text().strip()
    assert any("write_file" in step["tools"] for step in report["plan"]["steps"])
