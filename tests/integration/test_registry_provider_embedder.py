"""A provider embedder over a real protocol: OpenAI's embeddings API served by llama-cpp-python."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from _llama_server import llama_server

from masterplanner.registry import Cohort, RegistryStore, resolve_embedder

pytestmark = [pytest.mark.server, pytest.mark.local_model]


@pytest.fixture(scope="module")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("embedding-server")
    with llama_server(folder, "--n_ctx", "2048", "--embedding", "true") as base_url:
        yield base_url


def test_openai_embeddings_from_a_compatible_server_index_the_registry(
    embedding_server: str, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pydantic_ai import models

    monkeypatch.setenv("OPENAI_BASE_URL", embedding_server)
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
    embedder = resolve_embedder("openai:smollm2")
    assert embedder is not None
    # SmolLM2 has no pooling layer: the server answers a vector per token; they are mean-pooled,
    # and the texts are sent one per request, as the server's batches misplace all but the first
    vectors = embedder.embed_sync(["Read sales.csv", "Write a haiku about the sea"], "document")
    assert vectors.shape == (2, 576)
    assert [round(float(v @ v), 4) for v in vectors] == [1.0, 1.0]
    # each text's vector is the one it gets alone, the second as well as the first
    alone = embedder.embed_sync(["Write a haiku about the sea"], "document")[0]
    assert float(vectors[1] @ alone) == pytest.approx(1.0, abs=1e-4)
    isolated.mkdir(parents=True, exist_ok=True)
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", embedder)
    for key, task in (
        ("sales", "Read sales.csv and total it by month"),
        ("haiku", "Write a haiku about the sea"),
    ):
        store.put_cohort(
            Cohort.model_validate({"id": key, "task": task, "plan": {"task": task, "steps": []}})
        )
    found = store.similar_cohorts("Read sales.csv and total it by month", 2)
    assert found[0][0].id == "sales" and found[0][1] == pytest.approx(1.0, abs=1e-4)
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM mp_vectors").scalar_one() == 2


def test_a_registry_opened_with_the_setting_makes_the_provider_embedder_on_first_search(
    embedding_server: str, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the CLI and the engine open it: the setting is checked at open, the embedder made when needed."""
    from pydantic_ai import models

    monkeypatch.setenv("OPENAI_BASE_URL", embedding_server)
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
    isolated.mkdir(parents=True, exist_ok=True)
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", "openai:smollm2")
    for key, task in (
        ("sales", "Read sales.csv and total it by month"),
        ("haiku", "Write a haiku about the sea"),
    ):
        store.put_cohort(
            Cohort.model_validate({"id": key, "task": task, "plan": {"task": task, "steps": []}})
        )
    with store.engine.connect() as connection:  # stored by their words: nothing embedded yet
        assert connection.exec_driver_sql("SELECT count(*) FROM mp_vectors").scalar_one() == 0
    found = store.similar_cohorts("Read sales.csv and total it by month", 2)
    assert found[0][0].id == "sales" and found[0][1] == pytest.approx(1.0, abs=1e-4)
    assert store.embedder is not None and store.embedder.spec == "openai:smollm2"
    with store.engine.connect() as connection:
        assert connection.exec_driver_sql("SELECT count(*) FROM mp_vectors").scalar_one() == 2


def test_a_text_that_is_not_first_in_its_batch_finds_itself(
    embedding_server: str, isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stored teams are embedded in one batch at the first search; the haiku is second in it.

    Before, llama-cpp-python's server misplaced the token vectors of every text after the first
    in a batch: the haiku scored -0.03 against itself and 0.79 against the sales task.
    """
    from pydantic_ai import models

    monkeypatch.setenv("OPENAI_BASE_URL", embedding_server)
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # loopback server only
    isolated.mkdir(parents=True, exist_ok=True)
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", "openai:smollm2")
    for key, task in (
        ("sales", "Read sales.csv and total it by month"),
        ("haiku", "Write a haiku about the sea"),
        ("invoice", "Draft an invoice email to Acme for March"),
    ):
        store.put_cohort(
            Cohort.model_validate({"id": key, "task": task, "plan": {"task": task, "steps": []}})
        )
    found = store.similar_cohorts("Write a haiku about the sea", 3)
    assert found[0][0].id == "haiku" and found[0][1] == pytest.approx(1.0, abs=1e-4)
    found = store.similar_cohorts("Draft an invoice email to Acme for March", 3)
    assert found[0][0].id == "invoice" and found[0][1] == pytest.approx(1.0, abs=1e-4)
