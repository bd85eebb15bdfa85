"""Embedders in the registry: hybrid ranking, similarity for reuse, vectors kept in step with edits."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from masterplanner.errors import ConfigError
from masterplanner.registry import AgentSpec, Cohort, RegistryStore, resolve_embedder
from masterplanner.registry.store import fuse

TASKS = {
    "sales": "Read sales.csv, compute monthly revenue totals, plot them to chart.png and write a summary",
    "churn": "Load customers.csv and build a quarterly churn table by region in churn.md",
    "haiku": "Write a haiku about the sea and save it to haiku.txt",
    "invoice": "Email the client a polite reminder that invoice 2291 is overdue",
    "deploy": "Add a GitHub Actions workflow that runs the tests and deploys to staging",
}
PARAPHRASE = "Using the figures in sales.csv, work out how much money came in each month and draw a graph"


def _local() -> object:
    try:
        import sentence_transformers  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the embeddings extra must be installed in CI (pip install -e '.[dev,embeddings]')")
        pytest.skip("the embeddings extra (sentence-transformers) is not installed")
    return resolve_embedder("local")


def _cohort(key: str) -> Cohort:
    task = TASKS[key]
    return Cohort.model_validate(
        {"id": key, "task": task, "plan": {"task": task, "steps": []}, "run_id": key}
    )


def test_reciprocal_rank_fusion_adds_one_over_k_plus_rank() -> None:
    fused = fuse([["a", "b"], ["b", "c"]])
    assert fused == pytest.approx({"a": 1 / 61, "b": 1 / 62 + 1 / 61, "c": 1 / 62})


def test_embedder_settings_are_checked() -> None:
    assert resolve_embedder("none") is None
    with pytest.raises(
        ConfigError, match="expected none, local, sentence-transformers:NAME or PROVIDER:MODEL"
    ):
        resolve_embedder("minilm")
    with pytest.raises(ConfigError, match="needs a model name or path after the colon"):
        resolve_embedder("sentence-transformers:")
    with pytest.raises(ConfigError, match="embedder 'nosuchprovider:model'"):
        resolve_embedder("nosuchprovider:model")


@pytest.mark.embeddings
def test_a_paraphrase_finds_its_task_by_meaning(isolated: Path) -> None:
    embedder = _local()
    url = f"sqlite:///{isolated / 'registry.sqlite'}"
    isolated.mkdir(parents=True, exist_ok=True)
    lexical = RegistryStore(url)
    for key in TASKS:
        lexical.put_cohort(_cohort(key))
    # few shared words: lexically the paraphrase is too far from its task to reuse it
    best, similarity = lexical.similar_cohorts(PARAPHRASE, 1)[0]
    assert best.id == "sales" and similarity < 0.6
    # the same rows with the embedder: vectors are made on the first search, and cosine clears the bar
    hybrid = RegistryStore(url, embedder)  # type: ignore[arg-type]
    found = hybrid.similar_cohorts(PARAPHRASE, 3)
    assert found[0][0].id == "sales" and found[0][1] >= 0.6
    assert all(similarity < 0.5 for _, similarity in found[1:])  # the churn table, also a csv, is nearest
    assert hybrid.similar_cohorts("a short poem about the ocean", 1)[0][0].id == "haiku"


@pytest.mark.embeddings
def test_vectors_follow_edits_and_deletions(isolated: Path) -> None:
    embedder = _local()
    isolated.mkdir(parents=True, exist_ok=True)
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", embedder)  # type: ignore[arg-type]
    store.put_agent(
        AgentSpec(id="poet", name="poet", role="poet", description="writes poems", system_prompt="You write.")
    )
    store.put_agent(
        AgentSpec(
            id="bookkeeper",
            name="bookkeeper",
            role="accountant",
            description="reconciles ledgers",
            system_prompt="You count.",
        )
    )
    assert store.similar_agents("compose verse about love", 1)[0][0].id == "poet"
    store.put_agent(
        AgentSpec(
            id="poet",
            name="tax clerk",
            role="accountant",
            description="files tax returns",
            system_prompt="You file taxes.",
        )
    )
    ranked = store.similar_agents("compose verse about love", 2)
    assert {spec.id for spec, _ in ranked} == {"poet", "bookkeeper"}
    assert max(similarity for _, similarity in ranked) < 0.4  # the poet's old vector is gone
    store.delete_agent("bookkeeper")
    assert [spec.id for spec, _ in store.similar_agents("balance the ledgers", 5)] == ["poet"]
    with store.engine.connect() as connection:
        kept = connection.exec_driver_sql("SELECT item_id, vector FROM mp_vectors WHERE kind = 'agent'").all()
    assert [row[0] for row in kept] == ["poet"]
    assert np.frombuffer(kept[0][1], dtype=np.float32).shape == (384,)
