"""`eval planning` on a small dataset written by the test, with the scripted model: exact scores."""

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner import ConfigError, resolve_model
from masterplanner.evaluation import evaluate_baselines, evaluate_planning, planning
from masterplanner.evaluation.datasets import benchmarks_folder, load_dataset
from masterplanner.evaluation.planning import as_example, f1
from masterplanner.evaluation.results import planning_code_fingerprint
from masterplanner.tools import Catalog, ToolSpec
from masterplanner.tools.selection import preselect

TOOLS = {
    "SearchPeople": "Search for people by name.",
    "GetPersonMovieCredit": "Get the movie credits of a person by ID.",
    "SearchMovie": "Search for a movie by title.",
    "GetMovieCredit": "Get the cast and crew of a movie by ID.",
}
ROWS = [
    {
        "id": 0,
        "user_request": "movies directed by Sofia Coppola",
        "task_steps": ["find her", "list movies"],
        "task_nodes": [{"task": "SearchPeople"}, {"task": "GetPersonMovieCredit"}],
        "task_links": [{"source": "SearchPeople", "target": "GetPersonMovieCredit"}],
    },
    {
        "id": 1,
        "user_request": "who starred in The Dark Knight",
        "task_steps": ["find movie", "get cast"],
        "task_nodes": [{"task": "SearchMovie"}, {"task": "GetMovieCredit"}],
        "task_links": [{"source": "SearchMovie", "target": "GetMovieCredit"}],
    },
]


@pytest.fixture
def benchmarks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "benchmarks" / "tmdb"
    root.mkdir(parents=True)
    (root / "tool_desc.json").write_text(
        json.dumps({"nodes": [{"id": k, "desc": v} for k, v in TOOLS.items()]})
    )
    (root / "split_ids.json").write_text(json.dumps({"test_ids": {"chain": [0], "single": [1]}}))
    (root / "data.json").write_text("\n".join(json.dumps(row) for row in ROWS) + "\n")
    monkeypatch.setenv("MASTERPLANNER_BENCHMARKS", str(root.parent))
    return root.parent


def step(step_id: str, tool: str, *deps: str) -> dict[str, Any]:
    return {
        "id": step_id,
        "title": tool,
        "instruction": f"Use {tool}.",
        "agent_role": "assistant",
        "tools": [tool],
        "depends_on": list(deps),
        "expected_output": "",
    }


PERFECT = {"steps": [step("find", "SearchPeople"), step("credits", "GetPersonMovieCredit", "find")]}
CYCLIC = {"steps": [step("a", "SearchMovie", "b"), step("b", "GetMovieCredit", "a")]}
BASELINE_0 = json.dumps(
    {"plan": [{"agent": "SearchPeople", "prompt": "x"}, {"agent": "GetPersonMovieCredit", "prompt": "y"}]}
)
BASELINE_1 = json.dumps({"plan": [{"agent": "SearchMovie", "prompt": "x"}]})
SCRIPT = [
    {"purpose": "planner", "output": PERFECT},
    {"purpose": "planner", "output": BASELINE_0},
    {"purpose": "planner", "output": CYCLIC},
    {"purpose": "planner", "output": CYCLIC},
    {"purpose": "planner", "output": CYCLIC},
    {"purpose": "planner", "output": BASELINE_1},
]


def test_f1() -> None:
    assert f1(set(), set()) == 1.0
    assert f1({"a"}, set()) == 0.0
    assert f1({"a", "b"}, {"a"}) == pytest.approx(2 / 3)


async def test_exact_scores(benchmarks: Path, write_script: Callable[..., Path]) -> None:
    script = write_script(SCRIPT)
    report = await evaluate_planning("tmdb", model=resolve_model(f"scripted:{script}"), model_spec="scripted")
    payload = report.to_json_dict(per_request=True)
    assert payload["requests"] == 2
    assert (payload["node_f1"], payload["link_f1"], payload["accuracy"], payload["valid_rate"]) == (
        0.5,
        0.5,
        0.5,
        0.5,
    )
    assert payload["baseline"] | {"p50_latency_s": 0} == {
        "node_f1": 0.8333,
        "link_f1": 0.5,
        "accuracy": 0.5,
        "valid_rate": 1.0,
        "p50_latency_s": 0,
    }
    assert payload["baselines"]["design_notes"] == payload["baseline"]
    assert set(payload["baselines"]) == {"design_notes", "single", "clauses"}
    assert set(payload["per_request"]) == {"planner", "baseline", "single", "clauses"}
    assert payload["gold_tools_kept_rate"] == 1.0
    assert payload["usage"]["by_purpose"]["planner"]["calls"] == 4
    assert payload["baseline_usage"]["by_purpose"]["planner"]["calls"] == 2
    assert [row["valid"] for row in payload["per_request"]["planner"]] == [True, False]


async def test_a_stopped_evaluation_continues_from_its_results_file(
    benchmarks: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    results = tmp_path / "evals" / "tmdb.jsonl"
    first = resolve_model(f"scripted:{write_script(SCRIPT[:2])}")
    partial = await evaluate_planning("tmdb", model=first, model_spec="scripted", limit=1, results=results)
    assert partial.requests == 1
    assert len(results.read_text().splitlines()) == 2  # the header and request 0
    with results.open("a") as handle:
        handle.write('{"id": 1, "kept": tr')  # a record cut short by a crash

    # Only request 1 is scripted now: request 0 must come from the file, or it would fail.
    rest = resolve_model(f"scripted:{write_script(SCRIPT[2:])}")
    seen: list[tuple[int, int]] = []
    report = await evaluate_planning(
        "tmdb",
        model=rest,
        model_spec="scripted",
        results=results,
        progress=lambda done, total, _: seen.append((done, total)),
    )
    payload = report.to_json_dict(per_request=True)
    assert (payload["node_f1"], payload["link_f1"], payload["accuracy"], payload["valid_rate"]) == (
        0.5,
        0.5,
        0.5,
        0.5,
    )
    assert (payload["baseline"]["node_f1"], payload["baseline"]["link_f1"]) == (0.8333, 0.5)
    assert payload["usage"]["by_purpose"]["planner"]["calls"] == 4
    assert payload["baseline_usage"]["by_purpose"]["planner"]["calls"] == 2
    # the no-model baselines are scored for request 0 too, though its record came from the file
    assert [row["id"] for row in payload["per_request"]["clauses"]] == [0, 1]
    assert seen == [(0, 2), (1, 2), (2, 2)]
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert [line.get("id") for line in lines] == [None, 0, 1]
    assert lines[0] == {
        "format": 1,
        "dataset": "tmdb",
        "model": "scripted",
        "preselect_limit": 20,
        "examples": 2,
        "planning_code": planning_code_fingerprint(),
    }
    assert len(planning_code_fingerprint()) == 16


async def test_a_results_file_of_other_settings_or_corrupt_is_refused(
    benchmarks: Path, write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "tmdb.jsonl"
    model = resolve_model(f"scripted:{write_script(SCRIPT[:2])}")
    await evaluate_planning("tmdb", model=model, model_spec="scripted", limit=1, results=results)
    before = results.read_text()
    with pytest.raises(ConfigError, match="measured with model='scripted', not 'local': choose another file"):
        await evaluate_planning("tmdb", model=model, model_spec="local", results=results)
    assert results.read_text() == before
    # only this patch is undone after (`monkeypatch.undo()` also undid the fixtures' settings: the
    # benchmarks folder, then read from ../shared when it is beside the checkout, and the home)
    with monkeypatch.context() as patched:
        patched.setattr(planning, "planning_code_fingerprint", lambda: "0123456789abcdef")
        with pytest.raises(
            ConfigError, match=r"measured with planning_code='[0-9a-f]{16}', not '0123456789abcdef'"
        ):
            await evaluate_planning("tmdb", model=model, model_spec="scripted", results=results)
    lines = before.splitlines()
    results.write_text("\n".join([lines[0], '{"id": 0, "kept": true}', lines[1]]) + "\n")
    with pytest.raises(ConfigError, match=r"tmdb\.jsonl: line 2: field 'planner' is missing"):
        await evaluate_planning("tmdb", model=model, model_spec="scripted", results=results)
    results.write_text(lines[0] + "\n[1, 2]\n")
    with pytest.raises(ConfigError, match="line 2: not a JSON object"):
        await evaluate_planning("tmdb", model=model, model_spec="scripted", results=results)


def test_cli_json_has_the_figures(
    benchmarks: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    script = write_script(SCRIPT)
    results = tmp_path / "results.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "masterplanner",
            "eval",
            "planning",
            "--dataset",
            "tmdb",
            "--model",
            f"scripted:{script}",
            "--json",
            "--results",
            str(results),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    for key in ("node_f1", "link_f1", "accuracy", "valid_rate", "p50_latency_s"):
        assert key in payload
    assert set(payload["baseline"]) >= {"node_f1", "link_f1"}
    assert set(payload["baselines"]) == {"design_notes", "single", "clauses"}
    assert payload["node_f1"] == 0.5
    assert len(results.read_text().splitlines()) == 3  # the header and both requests


BASELINE_ROWS = [
    {
        "id": 0,
        "user_request": "Find the people named Sofia Coppola, then get the person's movie credits",
        "task_nodes": [{"task": "SearchPeople"}, {"task": "GetPersonMovieCredit"}],
        "task_links": [{"source": "SearchPeople", "target": "GetPersonMovieCredit"}],
    },
    {
        # no word of it matches a tool: both baselines take the first tool offered
        "id": 1,
        "user_request": "who starred in The Dark Knight",
        "task_nodes": [{"task": "SearchMovie"}, {"task": "GetMovieCredit"}],
        "task_links": [{"source": "SearchMovie", "target": "GetMovieCredit"}],
    },
]


def test_the_no_model_baselines(benchmarks: Path) -> None:
    (benchmarks / "tmdb" / "data.json").write_text("\n".join(json.dumps(row) for row in BASELINE_ROWS))
    report = evaluate_baselines("tmdb")
    payload = report.to_json_dict(per_request=True)
    assert (payload["model"], payload["requests"], report.planner, report.baseline) == (None, 2, None, None)
    assert "node_f1" not in payload and "baseline" not in payload and "usage" not in payload
    zero_latency = {"p50_latency_s": 0}
    # single: request 0 as one step gets GetPersonMovieCredit (node F1 2/3, no link), request 1 nothing
    assert payload["baselines"]["single"] | zero_latency == {
        "node_f1": 0.3333,
        "link_f1": 0.0,
        "accuracy": 0.0,
        "valid_rate": 1.0,
        "p50_latency_s": 0,
    }
    # clauses: request 0 is two clauses, SearchPeople then GetPersonMovieCredit: exactly the gold plan
    assert payload["baselines"]["clauses"] | zero_latency == {
        "node_f1": 0.5,
        "link_f1": 0.5,
        "accuracy": 0.5,
        "valid_rate": 1.0,
        "p50_latency_s": 0,
    }
    assert [row["exact"] for row in payload["per_request"]["clauses"]] == [True, False]
    assert set(payload["per_request"]) == {"single", "clauses"}
    assert [name for name, _ in report.rows()] == ["single", "clauses"]


def test_cli_baselines_only_needs_no_model(benchmarks: Path) -> None:
    from typer.testing import CliRunner

    from masterplanner.cli.app import app

    runner = CliRunner()
    result = runner.invoke(app, ["eval", "planning", "--dataset", "tmdb", "--baselines-only", "--json"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert set(payload["baselines"]) == {"single", "clauses"}
    assert payload["model"] is None
    table = runner.invoke(app, ["eval", "planning", "--dataset", "tmdb", "--baselines-only"])
    assert table.exit_code == 0, table.output
    assert "no model" in table.stdout and "clause chain" in table.stdout and "single step" in table.stdout
    refused = runner.invoke(
        app, ["eval", "planning", "--dataset", "tmdb", "--baselines-only", "--model", "local"]
    )
    assert isinstance(refused.exception, ConfigError)
    assert "--model has no use with --baselines-only" in str(refused.exception)
    # `--per-request` shapes the JSON only: without `--json` it was taken and silently did nothing
    alone = runner.invoke(app, ["eval", "planning", "--dataset", "tmdb", "--baselines-only", "--per-request"])
    assert isinstance(alone.exception, ConfigError)
    assert str(alone.exception) == (
        "--per-request has no use without --json: it adds every request's scores to the JSON report"
    )


def test_unknown_dataset(benchmarks: Path) -> None:
    with pytest.raises(ConfigError, match="unknown dataset 'imdb'; known: ultratool, tmdb"):
        load_dataset("imdb")


def test_missing_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MASTERPLANNER_BENCHMARKS", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="no such folder"):
        benchmarks_folder()


def test_corrupt_row_names_the_line(benchmarks: Path) -> None:
    data = benchmarks / "tmdb" / "data.json"
    data.write_text(data.read_text() + "{not json\n")
    with pytest.raises(ConfigError, match=r"data.json: line 3"):
        load_dataset("tmdb")


def test_example_from_a_gold_request(benchmarks: Path) -> None:
    _, test, _ = load_dataset("tmdb")
    example = as_example(test[0])
    assert [s["id"] for s in example.steps] == ["search-people", "get-person-movie-credit"]
    assert example.steps[1]["depends_on"] == ["search-people"]
    assert example.steps[0]["instruction"] == "find her"


def test_preselect_keeps_the_best_matches_best_first() -> None:
    catalog = Catalog(ToolSpec(name, desc) for name, desc in TOOLS.items())
    # "cast" is only in GetMovieCredit's description; both match "movie".
    assert preselect("cast of a movie", catalog, limit=2).names == ["GetMovieCredit", "SearchMovie"]
    # A small catalog is kept whole, still best first; the two that match nothing keep catalog order.
    assert preselect("credits of a person", catalog, limit=10).names == [
        "GetPersonMovieCredit",
        "GetMovieCredit",
        "SearchPeople",
        "SearchMovie",
    ]


def test_shared_benchmarks_load() -> None:
    folder = Path(__file__).resolve().parents[3] / "shared" / "benchmarks"
    if not folder.is_dir():
        pytest.skip("../shared/benchmarks is not beside this checkout")
    catalog, test, _ = load_dataset("tmdb", folder)
    assert (len(catalog), len(test)) == (46, 100)
    catalog, test, train = load_dataset("ultratool", folder)
    assert (len(catalog), len(test), len(train)) == (260, 500, 3027)


def test_a_results_header_records_the_embedded_model_output_cap(
    monkeypatch: pytest.MonkeyPatch, write_script: Callable[..., Path]
) -> None:
    from masterplanner.settings import Settings

    monkeypatch.setenv("MASTERPLANNER_LOCAL_MAX_OUTPUT_TOKENS", "1024")
    local = resolve_model("local", Settings.load())
    assert planning._output_cap(local) == {"max_output_tokens": 1024, "context_tokens": 8192}
    assert planning._output_cap(resolve_model(f"scripted:{write_script([])}")) == {}
