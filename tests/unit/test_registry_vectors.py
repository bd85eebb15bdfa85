"""An OpenAI-compatible server's vectors taken by their `index`.

The embedder is `openai:NAME` at `OPENAI_BASE_URL`: a server on 127.0.0.1 in this file, which
answers each text with a vector of its own (random, seeded by the text) and can be told to answer
as a broken server does.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest

from masterplanner.errors import ModelError
from masterplanner.registry import resolve_embedder

TASKS = {
    "sales": "Read sales.csv and total it by month",
    "haiku": "Write a haiku about the sea",
    "invoice": "Draft an invoice email to Acme for March",
}


def vector_of(text: str) -> list[float]:
    """The vector the server gives `text`: 64 numbers seeded by it (unrelated texts are far apart)."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")
    return [float(x) for x in np.random.default_rng(seed).standard_normal(64)]


def unit(text: str) -> np.ndarray:
    vector = np.asarray(vector_of(text), dtype=np.float32)
    return vector / np.linalg.norm(vector)


class EmbeddingServer:
    """OpenAI's `POST /v1/embeddings` on 127.0.0.1; `answer` says how.

    - `right`: each text's vector, in the texts' order;
    - `reversed`: the same vectors and indexes, `data` listed last first;
    - `shifted`: each text of a batch of several gets the vector of the text after it (a server
      that misplaces a batch's vectors, as llama-cpp-python's per-token one did); one alone is right;
    - `twice`: every vector numbered 0.
    """

    def __init__(self) -> None:
        self.answer = "right"
        self.batches: list[list[str]] = []
        self.base_url = ""

    def reply(self, texts: list[str]) -> dict[str, Any]:
        self.batches.append(texts)
        vectors = [vector_of(text) for text in texts]
        if self.answer == "shifted":
            vectors = vectors[1:] + vectors[:1]
        data = [
            {"object": "embedding", "index": 0 if self.answer == "twice" else n, "embedding": vector}
            for n, vector in enumerate(vectors)
        ]
        if self.answer == "reversed":
            data.reverse()
        usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
        return {"object": "list", "model": "fake", "data": data, "usage": usage}


@contextmanager
def embedding_server() -> Iterator[EmbeddingServer]:
    server = EmbeddingServer()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            texts = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
            data = json.dumps(server.reply(texts)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    server.base_url = f"http://127.0.0.1:{http.server_address[1]}/v1"
    try:
        yield server
    finally:
        http.shutdown()
        http.server_close()


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[EmbeddingServer]:
    from pydantic_ai import models

    with embedding_server() as running:
        monkeypatch.setenv("OPENAI_BASE_URL", running.base_url)
        monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
        yield running


def spec_for(server: EmbeddingServer) -> str:
    """An embedder setting of its own per server (embedders are made once per setting and process)."""
    return f"openai:fake-{server.base_url.rsplit(':', 1)[1].split('/')[0]}"


def test_a_server_that_lists_its_vectors_out_of_order_has_them_taken_by_index(
    server: EmbeddingServer,
) -> None:
    server.answer = "reversed"
    embedder = resolve_embedder(spec_for(server))
    assert embedder is not None
    texts = list(TASKS.values())
    vectors = embedder.embed_sync(texts, "document")
    assert [round(float(row @ unit(text)), 5) for row, text in zip(vectors, texts, strict=True)] == [
        1.0,
        1.0,
        1.0,
    ]


def test_a_server_that_numbers_two_vectors_alike_is_refused(server: EmbeddingServer) -> None:
    server.answer = "twice"
    spec = spec_for(server)
    embedder = resolve_embedder(spec)
    assert embedder is not None
    with pytest.raises(ModelError) as refused:
        embedder.embed_sync(["one", "two"], "document")
    assert str(refused.value) == (
        f"embedder {spec!r} failed: the server numbered its 2 vectors 0, 0: "
        "each text's index (0 to 1) must come once"
    )
