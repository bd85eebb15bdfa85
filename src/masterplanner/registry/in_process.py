"""The pydantic-ai face of an embedder that runs in this process (`minilm`, `smollm2`)."""

from __future__ import annotations

import asyncio
import threading
from abc import abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
from numpy.typing import NDArray
from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult, EmbeddingSettings
from pydantic_ai.embeddings.result import EmbedInputType

__all__ = ["InProcessEmbeddingModel", "Runtime"]


class Runtime(Protocol):
    """A loaded embedder: unit-length float32 rows, one per text."""

    def embed(self, texts: list[str]) -> NDArray[np.float32]:
        """One unit-length row per text."""
        ...


class InProcessEmbeddingModel(EmbeddingModel):
    """An embedder run here: loaded on the first call, not before; one batch at a time, off the loop.

    One batch at a time because a llama.cpp context is not safe to share between threads, and
    NumPy's matrix products already use every core. Subclasses name where it runs (`system`)
    and load the runtime from `path` (`_load`).
    """

    system_name = ""

    def __init__(self, path: Path) -> None:
        """Serve the model at `path`; nothing is read until something is embedded."""
        super().__init__()
        self.path = path
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()

    @property
    def model_name(self) -> str:
        """The model's file or folder."""
        return str(self.path)

    @property
    def system(self) -> str:
        """Where it runs."""
        return self.system_name

    @abstractmethod
    def _load(self) -> Runtime:
        """Load the runtime from `path` (each subclass knows its format)."""

    def _embed_now(self, texts: list[str]) -> NDArray[np.float32]:
        with self._lock:
            if self._runtime is None:
                self._runtime = self._load()
            return self._runtime.embed(texts)

    async def embed(
        self,
        inputs: str | Sequence[str],
        *,
        input_type: EmbedInputType,
        settings: EmbeddingSettings | None = None,
    ) -> EmbeddingResult:
        """Unit-length vectors for `inputs`, computed on a worker thread; queries and documents alike."""
        texts, _ = self.prepare_embed(inputs, settings)
        vectors = await asyncio.to_thread(self._embed_now, texts)
        return EmbeddingResult(
            embeddings=vectors.tolist(),
            inputs=texts,
            input_type=input_type,
            model_name=self.model_name,
            provider_name=self.system,
        )
