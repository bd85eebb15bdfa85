"""The registry's vectors made again: stale ones at a search, all of them by `registry reembed`.

And an OpenAI-compatible server's vectors taken by their `index`. The embedder is `openai:NAME`
at `OPENAI_BASE_URL`: a server on 127.0.0.1 in this file, which answers each text with a vector
of its own (random, seeded by the text) and can be told to answer as a broken server does.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import sqlalchemy as sa
from _cli import mp

from _http_server import Received, Reply, http_server, json_reply
from masterplanner.errors import ModelError
from masterplanner.registry import AgentSpec, Cohort, RegistryStore, resolve_embedder
from masterplanner.registry.memory import MemoryStore

TASKS = {
    "sales": "Read sales.csv and total it by month",
    "haiku": "Write a haiku about the sea",
    "invoice": "Draft an invoice email to Acme for March",
}


def vector_of(text: str, size: int = 64, model: str = "") -> list[float]:
    """The vector the server gives `text`: `size` numbers seeded by it (unrelated texts are far apart).

    Another `model` gives every text another vector.
    """
    seed = int.from_bytes(hashlib.sha256((model + text).encode()).digest()[:8], "big")
    return [float(x) for x in np.random.default_rng(seed).standard_normal(size)]


def unit(text: str, size: int = 64) -> np.ndarray:
    vector = np.asarray(vector_of(text, size), dtype=np.float32)
    return vector / np.linalg.norm(vector)


class EmbeddingServer:
    """OpenAI's `POST /v1/embeddings` on 127.0.0.1; `answer` says how.

    - `right`: each text's vector, in the texts' order;
    - `reversed`: the same vectors and indexes, `data` listed last first;
    - `shifted`: each text of a batch of several gets the vector of the text after it (a server
      that misplaces a batch's vectors, as llama-cpp-python's per-token one did); one alone is right;
    - `twice`: every vector numbered 0;
    - `noindex`: no vector numbered (some compatible servers leave `index` out);
    - `short`: the first text's vector left out (the others numbered 1 and up).
    """

    def __init__(self) -> None:
        self.answer = "right"
        self.size = 64
        """How many numbers a vector has (another model served under the same name has others)."""
        self.model = ""
        """Which model answers: another one served under the same name gives other vectors."""
        self.batches: list[list[str]] = []
        self.base_url = ""

    def reply(self, texts: list[str]) -> dict[str, Any]:
        self.batches.append(texts)
        vectors = [vector_of(text, self.size, self.model) for text in texts]
        if self.answer == "shifted":
            vectors = vectors[1:] + vectors[:1]
        data: list[dict[str, Any]] = [
            {"object": "embedding", "index": 0 if self.answer == "twice" else n, "embedding": vector}
            for n, vector in enumerate(vectors)
        ]
        if self.answer == "noindex":
            data = [{key: value for key, value in item.items() if key != "index"} for item in data]
        if self.answer == "short":
            data = data[1:]
        if self.answer == "reversed":
            data.reverse()
        usage = {"prompt_tokens": len(texts), "total_tokens": len(texts)}
        return {"object": "list", "model": "fake", "data": data, "usage": usage}


@contextmanager
def embedding_server() -> Iterator[EmbeddingServer]:
    server = EmbeddingServer()

    def embeddings(request: Received) -> Reply:
        body = request.json()
        texts = [body["input"]] if isinstance(body["input"], str) else list(body["input"])
        return json_reply(server.reply(texts))

    with http_server(embeddings) as http:
        server.base_url = f"{http.url}/v1"
        yield server


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


def store_tasks(store: RegistryStore) -> None:
    for key, task in TASKS.items():
        store.put_cohort(
            Cohort.model_validate({"id": key, "task": task, "plan": {"task": task, "steps": []}})
        )


def stored_vectors(store: RegistryStore, kind: str) -> dict[str, np.ndarray]:
    with store.engine.connect() as connection:
        rows = connection.execute(
            sa.text("SELECT item_id, vector FROM mp_vectors WHERE kind = :kind"), {"kind": kind}
        ).all()
    return {row[0]: np.frombuffer(row[1], dtype=np.float32) for row in rows}


def test_vectors_stored_before_the_fix_are_made_again_by_the_next_search(
    database_url: str, server: EmbeddingServer
) -> None:
    """A registry that stored its vectors before 38838a5 kept the wrong ones.

    Its haiku, second in the batch it was embedded in, found itself at -0.03.
    """
    spec = spec_for(server)
    store = RegistryStore(database_url, spec)
    store_tasks(store)
    # as a registry of before stored them: each task after the first with the one before's vector
    with store.engine.begin() as connection:
        for key, wrong in (("sales", "sales"), ("haiku", "sales"), ("invoice", "haiku")):
            connection.execute(
                sa.text(
                    "INSERT INTO mp_vectors (embedder, kind, item_id, vector) VALUES (:e, 'cohort', :i, :v)"
                ),
                {"e": spec, "i": key, "v": unit(TASKS[wrong]).tobytes()},
            )
    found = store.similar_cohorts(TASKS["haiku"], 3)
    assert found[0][0].id == "haiku" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert sorted(server.batches[1]) == sorted(TASKS.values())  # after the query: every stored task
    vectors = stored_vectors(store, "cohort")
    assert {key: round(float(vectors[key] @ unit(task)), 5) for key, task in TASKS.items()} == {
        "sales": 1.0,
        "haiku": 1.0,
        "invoice": 1.0,
    }
    store.close()
    # made again once: another process's search embeds its query alone
    again = RegistryStore(database_url, spec)
    found = again.similar_cohorts(TASKS["invoice"], 1)
    assert found[0][0].id == "invoice" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert server.batches[2:] == [[TASKS["invoice"]]]
    again.close()


def test_vectors_of_another_size_than_the_embedders_are_made_again_by_a_search(
    database_url: str, server: EmbeddingServer
) -> None:
    """Another model served under the embedder's name: a search failed with NumPy's matmul error."""
    spec = spec_for(server)
    store = RegistryStore(database_url, spec)
    store_tasks(store)
    store.similar_cohorts(TASKS["haiku"], 1)
    store.similar_agents("poet")
    store.close()
    server.size = 32
    store = RegistryStore(database_url, spec)  # a process started after the model changed
    found = store.similar_cohorts(TASKS["haiku"], 3)
    assert found[0][0].id == "haiku" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert {key: vector.shape for key, vector in stored_vectors(store, "cohort").items()} == {
        "sales": (32,),
        "haiku": (32,),
        "invoice": (32,),
    }
    store.close()


def test_registry_reembed_makes_every_vector_again_with_the_configured_embedder(
    database_url: str, server: EmbeddingServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vectors a server made wrongly carry the current version: only `registry reembed` replaces them."""
    spec = spec_for(server)
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", spec)
    store = RegistryStore(database_url, spec)
    store_tasks(store)
    store.put_agent(
        AgentSpec(id="poet", name="poet", role="poet", description="writes poems", system_prompt="x")
    )
    MemoryStore(store).remember("The client prefers invoices in PDF")
    server.answer = "shifted"
    store.similar_cohorts(TASKS["haiku"], 3)  # the three tasks in one batch: each with another's vector
    store.similar_agents("poet")
    wrong = stored_vectors(store, "cohort")
    assert round(float(wrong["haiku"] @ unit(TASKS["haiku"])), 2) < 0.5
    server.answer = "right"  # the server is fixed: a search still trusts what it stored
    assert store.similar_cohorts(TASKS["haiku"], 1)[0][1] < 0.5
    store.close()
    asked = len(server.batches)

    done = mp("registry", "reembed")
    assert done.returncode == 0, done.stderr
    summary = done.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        rf"re-embedded 1 agent, 3 teams and 1 memory with {re.escape(spec)} in [0-9.]+ s",
        summary,
    ), summary
    # every text once (the memory is embedded as it is written)
    embedded = sorted(text for batch in server.batches[asked:] for text in batch)
    assert embedded == sorted(
        [*TASKS.values(), "poet. poet. writes poems", "The client prefers invoices in PDF"]
    )

    store = RegistryStore(database_url, spec)
    found = store.similar_cohorts(TASKS["haiku"], 1)
    assert found[0][0].id == "haiku" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert store.similar_agents("poet. poet. writes poems")[0][1] == pytest.approx(1.0, abs=1e-5)
    store.close()

    as_json = mp("registry", "reembed", "--json")
    assert as_json.returncode == 0, as_json.stderr
    reported = json.loads(as_json.stdout)
    assert reported.pop("seconds") >= 0
    assert reported == {"embedder": spec, "agents": 1, "cohorts": 3, "memories": 1, "changed_meanwhile": 0}


def test_registry_reembed_without_an_embedder_says_there_is_nothing_to_make(database_url: str) -> None:
    refused = mp("registry", "reembed", env={"MASTERPLANNER_EMBEDDER": "none"})
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: the embedder is 'none': the registry ranks by words alone and keeps no vectors to make "
        "again; set embedder (e.g. smollm2) to rank by meaning"
    )


@pytest.mark.parametrize(
    "answer",
    [
        "reversed",  # its vectors were taken in the reply's order, not by index: texts got each other's
        "noindex",  # such servers worked before vectors were taken by index, then failed with Python's `<`
    ],
)
def test_a_servers_vectors_are_each_its_texts_listed_out_of_order_or_unnumbered(
    server: EmbeddingServer, answer: str
) -> None:
    server.answer = answer
    embedder = resolve_embedder(spec_for(server))
    assert embedder is not None
    texts = list(TASKS.values())
    vectors = embedder.embed_sync(texts, "document")
    assert [round(float(row @ unit(text)), 5) for row, text in zip(vectors, texts, strict=True)] == [
        1.0,
        1.0,
        1.0,
    ]


@pytest.mark.parametrize(
    ("answer", "texts", "problem"),
    [
        (
            "twice",
            ["one", "two"],
            "the server numbered its 2 vectors 0, 0: each text's index (0 to 1) must come once",
        ),
        (  # it was told its indexes 1, 2 should have been 0 to 1: the texts sent are counted, not the vectors
            "short",
            list(TASKS.values()),
            "the server answered 2 vectors for 3 texts: each text must get one",
        ),
    ],
)
def test_a_server_that_numbers_vectors_alike_or_answers_too_few_is_refused(
    server: EmbeddingServer, answer: str, texts: list[str], problem: str
) -> None:
    server.answer = answer
    spec = spec_for(server)
    embedder = resolve_embedder(spec)
    assert embedder is not None
    with pytest.raises(ModelError) as refused:
        embedder.embed_sync(texts, "document")
    assert str(refused.value) == f"embedder {spec!r} failed: {problem}"


def test_a_search_text_kept_from_the_model_before_is_embedded_again(
    database_url: str, server: EmbeddingServer
) -> None:
    """A long-running process kept a search text's vector of the model before another size's.

    Each search of it had every item embedded again at the new size, then read back none at the
    old one: it found nothing.
    """
    spec = spec_for(server)
    store = RegistryStore(database_url, spec)
    store_tasks(store)
    assert store.similar_cohorts(TASKS["haiku"], 1)[0][0].id == "haiku"
    server.size = 32  # another model under the same name; the process keeps running
    embedded = []
    for query in ("invoice", "haiku", "haiku"):
        asked = len(server.batches)
        found = store.similar_cohorts(TASKS[query], 3)
        assert found[0][0].id == query and found[0][1] == pytest.approx(1.0, abs=1e-5)
        embedded.append(sorted(text for batch in server.batches[asked:] for text in batch))
    assert embedded == [
        sorted([TASKS["invoice"], *TASKS.values()]),  # the first search after the change: every task
        [TASKS["haiku"]],  # the kept one, made again once
        [],
    ]
    assert {key: vector.shape for key, vector in stored_vectors(store, "cohort").items()} == {
        "sales": (32,),
        "haiku": (32,),
        "invoice": (32,),
    }
    store.close()


def test_a_search_text_kept_by_another_process_is_embedded_again_after_reembed(
    database_url: str, server: EmbeddingServer
) -> None:
    """`reembed` forgot its own process's search texts alone: a server still ranked with the old model's."""
    spec = spec_for(server)
    serving = RegistryStore(database_url, spec)
    store_tasks(serving)
    assert serving.similar_cohorts(TASKS["haiku"], 1)[0][1] == pytest.approx(1.0, abs=1e-5)
    server.model = "v2"  # another model of the same size under the same name
    other = RegistryStore(database_url, spec)
    assert other.reembed().made["cohort"] == 3
    other.close()
    asked = len(server.batches)
    found = serving.similar_cohorts(TASKS["haiku"], 1)
    assert found[0][0].id == "haiku" and found[0][1] == pytest.approx(1.0, abs=1e-5)
    assert server.batches[asked:] == [[TASKS["haiku"]]]
    asked = len(server.batches)
    serving.similar_cohorts(TASKS["haiku"], 1)  # kept again, now of the new model
    assert server.batches[asked:] == []
    serving.close()


def test_a_team_rated_while_reembed_runs_gets_its_new_vector(
    database_url: str, server: EmbeddingServer
) -> None:
    """Its rating rewrote its stored column: it was counted 'changed' and kept its wrong vector."""
    spec = spec_for(server)
    store = RegistryStore(database_url, spec)
    store_tasks(store)
    server.answer = "shifted"
    store.similar_cohorts(TASKS["haiku"], 3)  # each task with another's vector
    server.answer = "right"

    def rate(done: int, total: int) -> None:
        if done == 0:  # the texts are read, none embedded yet: a person rates the haiku's run
            store.apply_rating("haiku", 5, by="tester", agent_ids=[], lessons={})

    done = store.reembed(rate)
    assert (done.made, done.changed) == ({"agent": 0, "cohort": 3, "memory": 0}, 0)
    assert store.get_cohort("haiku").rating == 5
    vectors = stored_vectors(store, "cohort")
    assert {key: round(float(vectors[key] @ unit(task)), 5) for key, task in TASKS.items()} == {
        "sales": 1.0,
        "haiku": 1.0,
        "invoice": 1.0,
    }
    store.close()


def test_a_search_stores_the_vectors_it_makes_in_id_order(database_url: str, server: EmbeddingServer) -> None:
    """As `reembed` does: in the table's order, a search and a reembed could lock Postgres rows crosswise."""
    spec = spec_for(server)
    store = RegistryStore(database_url, spec)
    store_tasks(store)  # sales, haiku, invoice
    store.similar_cohorts("poem", 1)
    assert server.batches[1] == [TASKS["haiku"], TASKS["invoice"], TASKS["sales"]]
    store.close()
