"""all-MiniLM-L6-v2 in NumPy: sentence embeddings without torch.

The model is a 6-layer BERT encoder (hidden size 384, 12 heads) followed by mean pooling over the
real tokens and L2 normalisation, as sentence-transformers runs it. Here the tokenizer is the
`tokenizers` package reading the model's `tokenizer.json`, the weights come from its
`model.safetensors` through `safetensors.numpy`, and the forward pass is plain NumPy in float32.
Vectors agree with sentence-transformers' to a cosine above 0.9999 (a test checks it).

The model directory is the one sentence-transformers loads: `config.json`, `tokenizer.json`,
`model.safetensors` and, optionally, `sentence_bert_config.json` (its `max_seq_length` caps the
tokens per text; longer texts are cut, as sentence-transformers cuts them).

`MiniLMEmbeddingModel` serves it to the registry as a pydantic-ai embedding model (setting
`embedder = "local"`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from .in_process import InProcessEmbeddingModel

__all__ = ["MiniLM", "MiniLMEmbeddingModel"]

Matrix = NDArray[np.float32]

_BATCH_TOKENS = 2048
"""Token positions (padding included) per forward pass: short texts go many at a time, so the
weights are read once for all of them; long ones go few at a time, so no short text is padded to
a long one's length."""


def _erf(x: Matrix) -> Matrix:
    """The error function, Abramowitz and Stegun 7.1.26 (absolute error below 1.5e-7)."""
    sign = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    result: Matrix = sign * (1.0 - poly * np.exp(-a * a))
    return result


def _gelu(x: Matrix) -> Matrix:
    """BERT's exact GELU, x * Φ(x), through erf (not the tanh approximation)."""
    result: Matrix = 0.5 * x * (1.0 + _erf(x * np.float32(1 / math.sqrt(2))))
    return result


def _layer_norm(x: Matrix, weight: Matrix, bias: Matrix, eps: float) -> Matrix:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    variance = (centred * centred).mean(axis=-1, keepdims=True)
    result: Matrix = centred / np.sqrt(variance + eps) * weight + bias
    return result


def _norm(weights: dict[str, Matrix], name: str) -> tuple[Matrix, Matrix]:
    """A LayerNorm's scale and shift."""
    return weights[f"{name}.weight"], weights[f"{name}.bias"]


def _batches(lengths: Sequence[int]) -> list[list[int]]:
    """Indices of texts grouped shortest first, each group within `_BATCH_TOKENS` once padded."""
    batches: list[list[int]] = []
    for index in sorted(range(len(lengths)), key=lambda index: lengths[index]):
        # Sorted, so the new text is the group's longest: the group pads to its length.
        if batches and (len(batches[-1]) + 1) * lengths[index] <= _BATCH_TOKENS:
            batches[-1].append(index)
        else:
            batches.append([index])
    return batches


@dataclass(frozen=True)
class _Layer:
    """One encoder layer's weights, transposed for `x @ w` and with query, key and value fused."""

    qkv: Matrix
    qkv_bias: Matrix
    attention_out: Matrix
    attention_out_bias: Matrix
    attention_norm: tuple[Matrix, Matrix]
    intermediate: Matrix
    intermediate_bias: Matrix
    output: Matrix
    output_bias: Matrix
    output_norm: tuple[Matrix, Matrix]


class MiniLM:
    """A BERT sentence encoder with mean pooling, loaded from a sentence-transformers model folder."""

    def __init__(self, directory: Path) -> None:
        """Load the tokenizer, configuration and weights from `directory` (about 0.2 s for MiniLM)."""
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        if config.get("hidden_act", "gelu") != "gelu" or config.get("model_type", "bert") != "bert":
            raise ValueError(f"{directory}: not a BERT model with GELU activations")
        pooling = directory / "1_Pooling" / "config.json"
        if pooling.is_file() and not json.loads(pooling.read_text("utf-8")).get("pooling_mode_mean_tokens"):
            raise ValueError(f"{directory}: the model pools other than by the mean of its tokens")
        self.heads: int = config["num_attention_heads"]
        self.eps: float = config["layer_norm_eps"]
        self.max_tokens = self._max_tokens(directory, config["max_position_embeddings"])
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.no_padding()  # tokenizer.json may pad every text to a fixed length; batches pad here
        self.tokenizer.enable_truncation(max_length=self.max_tokens)

        weights = {
            name.removeprefix("bert."): array.astype(np.float32)
            for name, array in load_file(str(directory / "model.safetensors")).items()
        }
        self.word = weights["embeddings.word_embeddings.weight"]
        self.position = weights["embeddings.position_embeddings.weight"]
        self.token_type = weights["embeddings.token_type_embeddings.weight"][0]
        self.embedding_norm = _norm(weights, "embeddings.LayerNorm")
        layers = range(config["num_hidden_layers"])
        self.layers = [self._layer(weights, f"encoder.layer.{n}.") for n in layers]
        self.dimensions: int = self.word.shape[1]

    @staticmethod
    def _max_tokens(directory: Path, positions: int) -> int:
        settings = directory / "sentence_bert_config.json"
        if settings.is_file():
            limit = json.loads(settings.read_text(encoding="utf-8")).get("max_seq_length")
            if isinstance(limit, int) and 0 < limit:
                return min(limit, positions)
        return int(positions)

    @staticmethod
    def _layer(weights: dict[str, Matrix], prefix: str) -> _Layer:
        def w(name: str) -> Matrix:
            return np.ascontiguousarray(weights[f"{prefix}{name}.weight"].T)

        def b(name: str) -> Matrix:
            return weights[f"{prefix}{name}.bias"]

        parts = ("attention.self.query", "attention.self.key", "attention.self.value")
        return _Layer(
            qkv=np.ascontiguousarray(np.concatenate([w(part) for part in parts], axis=1)),
            qkv_bias=np.concatenate([b(part) for part in parts]),
            attention_out=w("attention.output.dense"),
            attention_out_bias=b("attention.output.dense"),
            attention_norm=_norm(weights, f"{prefix}attention.output.LayerNorm"),
            intermediate=w("intermediate.dense"),
            intermediate_bias=b("intermediate.dense"),
            output=w("output.dense"),
            output_bias=b("output.dense"),
            output_norm=_norm(weights, f"{prefix}output.LayerNorm"),
        )

    def embed(self, texts: Sequence[str]) -> Matrix:
        """One L2-normalised float32 row per text, in the order given."""
        vectors = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(list(texts))
        for batch in _batches([len(encoding.ids) for encoding in encodings]):
            longest = len(encodings[batch[-1]].ids)
            ids = np.zeros((len(batch), longest), dtype=np.int64)
            mask = np.zeros((len(batch), longest), dtype=np.float32)
            for row, index in enumerate(batch):
                tokens = encodings[index].ids
                ids[row, : len(tokens)] = tokens
                mask[row, : len(tokens)] = 1
            vectors[batch] = self._forward(ids, mask)
        return vectors

    def _forward(self, ids: NDArray[np.int64], mask: Matrix) -> Matrix:
        """Mean-pooled, normalised sentence vectors for a padded batch of token ids."""
        x = self.word[ids] + self.position[: ids.shape[1]] + self.token_type
        x = _layer_norm(x, *self.embedding_norm, self.eps)
        # Padding gets a large negative score, so softmax gives it no weight.
        padding = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in self.layers:
            x = self._layer_forward(layer, x, padding)
        pooled = (x * mask[:, :, None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        result: Matrix = pooled / np.maximum(norms, 1e-12)
        return result

    def _layer_forward(self, layer: _Layer, x: Matrix, padding: Matrix) -> Matrix:
        batch, length, width = x.shape
        size = width // self.heads
        qkv = (x @ layer.qkv + layer.qkv_bias).reshape(batch, length, 3, self.heads, size)
        query, key, value = (qkv[:, :, part].transpose(0, 2, 1, 3) for part in range(3))
        scores = query @ key.transpose(0, 1, 3, 2) * np.float32(1 / math.sqrt(size)) + padding
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        scores /= scores.sum(axis=-1, keepdims=True)
        context = (scores @ value).transpose(0, 2, 1, 3).reshape(batch, length, width)
        attended = context @ layer.attention_out + layer.attention_out_bias
        x = _layer_norm(attended + x, *layer.attention_norm, self.eps)
        hidden = _gelu(x @ layer.intermediate + layer.intermediate_bias)
        return _layer_norm(hidden @ layer.output + layer.output_bias + x, *layer.output_norm, self.eps)


class MiniLMEmbeddingModel(InProcessEmbeddingModel):
    """`MiniLM` as a pydantic-ai embedding model, run in NumPy."""

    system_name = "numpy"

    def _load(self) -> MiniLM:
        return MiniLM(self.path)
