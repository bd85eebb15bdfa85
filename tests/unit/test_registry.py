"""The agent registry store and its CLI: versions, search, stats under concurrency, export/import."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from masterplanner.errors import AgentEditError, ConfigError, NotFoundError, RunError
from masterplanner.registry import AgentSpec, Cohort, RegistryStore


def _agent(agent_id: str, role: str, prompt: str, **extra: object) -> AgentSpec:
    return AgentSpec.model_validate(
        {"id": agent_id, "name": agent_id, "role": role, "system_prompt": prompt, **extra}
    )


@pytest.fixture
def store(database_url: str) -> RegistryStore:
    return RegistryStore(database_url)


def test_versions_search_and_delete(store: RegistryStore) -> None:
    store.put_agent(_agent("csv", "data analyst", "You read CSV files and compute monthly totals."))
    store.put_agent(_agent("poet", "poet", "You write haiku about the sea.", keywords=["poetry", "haiku"]))
    edited = store.put_agent(_agent("csv", "data analyst", "You read CSV files and compute weekly totals."))
    assert edited.version == 2
    assert store.versions("csv") == [1, 2]
    assert store.get_agent("csv").system_prompt.endswith("weekly totals.")
    assert store.get_agent("csv", version=1).system_prompt.endswith("monthly totals.")
    assert [agent.id for agent, _ in store.search_agents("write a haiku about waves")] == ["poet"]
    assert [agent.id for agent, _ in store.search_agents("totals from a csv")] == ["csv"]
    assert store.search_agents("monthly") == []  # only the current version is indexed
    store.delete_agent("poet")
    with pytest.raises(NotFoundError, match="no agent 'poet'"):
        store.get_agent("poet")
    assert store.search_agents("haiku") == []


def test_bulk_put_is_one_transaction(store: RegistryStore) -> None:
    assert store.put_agents([_agent("x", "role", "You x."), _agent("y", "role", "You y.")]) == 2
    assert sorted(agent.id for agent in store.list_agents()) == ["x", "y"]


def test_track_record_breaks_ties(store: RegistryStore) -> None:
    store.put_agent(_agent("a", "summarizer", "You summarize reports."))
    store.put_agent(_agent("b", "summarizer", "You summarize reports."))
    for _ in range(4):
        store.record_outcome("b", succeeded=True, rating=5)
        store.record_outcome("a", succeeded=False, rating=1)
    assert [agent.id for agent, _ in store.search_agents("summarize reports")] == ["b", "a"]
    assert store.get_agent("b").stats.success_rate == 1.0
    assert store.get_agent("a").stats.mean_rating == 1.0


def test_a_run_is_rated_once_with_its_lessons_each_taught_once(store: RegistryStore) -> None:
    store.put_agent(_agent("w", "writer", "You write."))
    applied = store.apply_rating("r1", 2, by="a", agent_ids=["w"], lessons={"w": ["Say the totals."]})
    assert (applied.cohort_rated, applied.lessons) == (False, {"w": ["Say the totals."]})
    with pytest.raises(RunError, match=r"run r1 was rated 2 already \(by a at .*\): a run is rated once"):
        store.apply_rating("r1", 1, by="b", agent_ids=["w"], lessons={"w": ["Another lesson."]})
    # from threads at once (two processes' raters): one rating is applied
    with ThreadPoolExecutor(4) as pool:
        tries = [
            pool.submit(store.apply_rating, "r2", 1, by=f"t{n}", agent_ids=["w"], lessons={})
            for n in range(4)
        ]
        refused = [future.exception() for future in tries]
    assert sum(isinstance(error, RunError) for error in refused) == 3 and refused.count(None) == 1
    again = store.apply_rating("r3", 1, by="a", agent_ids=["w"], lessons={"w": ["Say the totals."]})
    assert again.lessons == {}  # nothing added: the lesson is not reported as one
    # nor one differing only in spacing, case or closing punctuation (as an import compares them)
    alike = store.apply_rating("r4", 1, by="a", agent_ids=["w"], lessons={"w": ["say  the TOTALS"]})
    assert alike.lessons == {}
    agent = store.get_agent("w")
    assert (agent.stats.ratings, agent.stats.rating_sum) == (4, 5.0)
    assert agent.lessons == ["Say the totals."] and agent.version == 2  # taught once: no new version


def _bump(url: str, times: int) -> None:
    store = RegistryStore(url)
    for _ in range(times):
        store.record_outcome("shared", succeeded=True, rating=4)


def test_query_terms_are_chosen_rarest_first_within_the_postings_budget() -> None:
    from masterplanner.registry.store import _selective_terms, _TermChoice

    counts = {"aa": 10, "bb": 3000, "cc": 3000, "dd": 0, "ee": 2000, "ff": 2500}
    assert _selective_terms(list(counts), counts.__getitem__) == _TermChoice(["aa", "ee"])
    common = {"xx": 3000, "yy": 3000, "zz": 0}
    assert _selective_terms(list(common), common.__getitem__) == _TermChoice(["xx", "yy"], common=True)
    assert _selective_terms(["qq"], {"qq": 0}.__getitem__) == _TermChoice(["qq"])


def test_words_split_identifiers_and_keep_the_letters_of_every_script() -> None:
    """Words were ASCII only: "Ärger" gave "rger", a Japanese or Hindi text no word at all, so
    keywords and lexical similarity (tool choice, agent reuse without an embedder) lost them.
    """
    from masterplanner.registry.store import lexical_similarity
    from masterplanner.tools.selection import words

    assert words("parseHTTPResponse read_csv getX2Files of 12 ids") == [
        "parse", "http", "response", "read", "csv", "get", "file", "12", "ids"
    ]  # fmt: skip
    assert words("Ärger über Straßenbahn-Fahrplänen, ÄrgerBericht; A\u0308rger") == [
        "ärger", "über", "straßenbahn", "fahrplänen", "ärger", "bericht", "ärger"
    ]  # fmt: skip
    assert words("報告書を書く。猫、2 cats") == ["報告書を書く", "猫", "cat"]
    assert words("हिन्दी में रिपोर्ट लिखें") == ["हिन्दी", "में", "रिपोर्ट", "लिखें"]
    assert lexical_similarity("報告書を書く", "報告書を書く。") == 1.0
    assert lexical_similarity("Ärger melden", "Über Ärger") == 0.5


def test_an_agent_is_found_by_keywords_of_any_script(store: RegistryStore) -> None:
    """The words a run gives a new agent as keywords are the terms both text indexes find it by."""
    from masterplanner.tools.selection import words

    keywords = sorted(set(words("Melde den Ärger, 報告書を書く, हिन्दी में")))
    store.put_agent(_agent("clerk", "clerk", "You file reports.", keywords=keywords))
    store.put_agent(_agent("poet", "poet", "You write haiku."))
    for query in ("Ärger", "ärger melden", "報告書を書く", "हिन्दी"):
        assert [agent.id for agent, _ in store.search_agents(query)] == ["clerk"], query


def test_a_query_of_only_common_terms_ranks_texts_holding_all_of_them(
    store: RegistryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from masterplanner.registry import store as store_module

    monkeypatch.setattr(store_module, "COMMON_TERM_DOCS", 2)  # every term below is "common"
    store.put_agents(
        [
            _agent("both-1", "reader", "Read the csv and write the totals."),
            _agent("only-read", "reader", "Read the csv."),
            _agent("both-2", "reader", "Read notes, then write a summary."),
            _agent("only-write", "writer", "Write a poem."),
            _agent("sea", "poet", "A poem about the sea."),
        ]
    )
    found = [spec.id for spec, _ in store.search_agents("read write", limit=5)]
    assert sorted(found) == ["both-1", "both-2"]
    # No text holds every term: any of them will do.
    found = [spec.id for spec, _ in store.search_agents("poem csv", limit=5)]
    assert sorted(found) == ["both-1", "only-read", "only-write", "sea"]


def test_concurrent_writers_lose_no_update(store: RegistryStore) -> None:
    store.put_agent(_agent("shared", "worker", "You work."))
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_bump, args=(store.url, 50)) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    stats = store.get_agent("shared").stats
    assert (stats.uses, stats.successes, stats.ratings, stats.rating_sum) == (200, 200, 200, 800.0)


def test_an_import_past_the_lessons_limit_drops_the_files_lessons_never_the_stored_ones(
    store: RegistryStore, tmp_path: Path
) -> None:
    stored = [f"Lesson {n}." for n in range(48)]
    store.put_agent(_agent("full", "worker", "You work.", lessons=stored))
    exported = tmp_path / "agents.jsonl"
    store.export_agents(exported)
    line = json.loads(exported.read_text())
    exported.write_text(json.dumps(line | {"lessons": ["New 1.", "Lesson 0.", "New 2.", "New 3."]}) + "\n")
    done = store.import_agents([spec for _, spec in store.read_agents(exported)])
    assert (done.updated, store.get_agent("full").lessons) == (["full"], ["New 2.", "New 3.", *stored])
    store.put_agent(store.get_agent("full").model_copy(update={"lessons": [f"Mine {n}." for n in range(50)]}))
    assert store.import_agents([spec for _, spec in store.read_agents(exported)]).unchanged == ["full"]
    assert store.get_agent("full").lessons == [f"Mine {n}." for n in range(50)]


def test_an_import_takes_a_lesson_differing_only_in_spacing_case_or_end_punctuation_as_the_same(
    store: RegistryStore, tmp_path: Path
) -> None:
    """Before, `name  the OUTPUT file` beside a stored `Name the output file.` was a second lesson."""
    stored = ["Name the output file.", "Check the units"]
    store.put_agent(_agent("clerk", "clerk", "You file things.", lessons=[*stored, "Sign each letter."]))
    store.put_agent(store.get_agent("clerk").model_copy(update={"lessons": stored}))  # one removed
    exported = tmp_path / "agents.jsonl"
    store.export_agents(exported)
    line = json.loads(exported.read_text())
    same = ["name  the OUTPUT file", "Check the units!", " sign each\tletter. "]
    exported.write_text(json.dumps(line | {"lessons": same}) + "\n")
    done = store.import_agents([spec for _, spec in store.read_agents(exported)])
    assert (done.updated, done.unchanged, store.get_agent("clerk").lessons) == ([], ["clerk"], stored)
    # a new one is added as the file has it (once, though the file has it twice), the others not
    new = ["Keep a log;", "keep a LOG", *same]
    exported.write_text(json.dumps(line | {"lessons": new}) + "\n")
    done = store.import_agents([spec for _, spec in store.read_agents(exported)])
    assert (done.updated, store.get_agent("clerk").lessons) == (["clerk"], ["Keep a log;", *stored])


def test_export_import_round_trips_and_a_corrupt_file_imports_nothing(
    store: RegistryStore, tmp_path: Path
) -> None:
    store.put_agent(
        _agent("one", "planner", "You plan.", lessons=["Name the output file."], tools=["write_file"])
    )
    store.put_agent(_agent("two", "critic", "You critique."))
    store.record_outcome("one", succeeded=True, rating=4)
    exported = tmp_path / "agents.jsonl"
    assert store.export_agents(exported) == 2
    before = {agent.id: agent for agent in store.list_agents()}
    store.delete_agent("one")
    store.delete_agent("two")
    done = store.import_agents([spec for _, spec in store.read_agents(exported)])
    assert (sorted(done.added), done.updated, done.unchanged) == (["one", "two"], [], [])
    after = {agent.id: agent for agent in store.list_agents()}
    assert after == before
    # imported over agents stored since: a new version of the one that changed, history kept
    store.put_agent(before["one"].model_copy(update={"system_prompt": "You plan better."}))
    store.record_outcome("one", succeeded=True, rating=5)
    again = store.import_agents([spec for _, spec in store.read_agents(exported)])
    assert (again.added, again.updated, again.unchanged) == ([], ["one"], ["two"])
    one = store.get_agent("one")
    assert (one.version, one.system_prompt, store.versions("one")) == (3, "You plan.", [1, 2, 3])
    assert store.get_agent("one", 2).system_prompt == "You plan better."
    assert (one.stats.uses, one.stats.ratings) == (2, 2)  # its track record here, not the file's

    lines = exported.read_text().splitlines()
    broken = json.loads(lines[1])
    broken["role"] = ""
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_text(lines[0].replace('"one"', '"three"', 1) + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(
        ConfigError, match=r"corrupt\.jsonl: line 2: role: must not be empty; nothing was imported"
    ):
        store.read_agents(corrupt)
    # an unknown field is said with the fields an agent has: before, only "colour: unknown field"
    corrupt.write_text(json.dumps(json.loads(lines[0]) | {"colour": "red"}) + "\n")
    with pytest.raises(ConfigError) as unknown:
        store.read_agents(corrupt)
    assert str(unknown.value) == (
        f"{corrupt}: line 1: colour: unknown field; known: description, id, keywords, lessons, model, "
        "name, origin, prompt_by_person, role, stats, system_prompt, tools, version; nothing was imported"
    )
    corrupt.write_text(lines[1] + "\n" + lines[1] + "\n")
    with pytest.raises(ConfigError, match=r"line 2: agent '\w+' is on line 1 too; nothing was imported"):
        store.read_agents(corrupt)
    assert sorted(agent.id for agent in store.list_agents()) == ["one", "two"]
    corrupt.write_bytes(b"\xe9\n")
    with pytest.raises(ConfigError) as latin:
        store.read_agents(corrupt)
    assert (
        str(latin.value)
        == f"{corrupt}: not UTF-8 text (byte 1 is not): save it as UTF-8; nothing was imported"
    )
    with pytest.raises(ConfigError) as folder:
        store.export_agents(tmp_path)
    assert str(folder.value) == f"cannot write {tmp_path}: Is a directory"
    with pytest.raises(ConfigError) as nowhere:
        store.read_agents(tmp_path / "missing.jsonl")
    assert str(nowhere.value) == f"{tmp_path / 'missing.jsonl'} does not exist; nothing was imported"


def test_cohorts_and_the_cli(store: RegistryStore) -> None:
    store.put_agent(_agent("poet", "poet", "You write haiku."))
    store.put_cohort(
        Cohort(
            id="c1", task="Write a haiku", plan={"steps": [{"id": "w"}]}, agents={"w": "poet"}, run_id="r1"
        )
    )

    def mp(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "masterplanner", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=dict(os.environ),
        )

    listed = json.loads(mp("agents", "list", "--json").stdout)
    assert [agent["id"] for agent in listed] == ["poet"]
    shown = json.loads(mp("agents", "show", "poet", "--json").stdout)
    assert (shown["system_prompt"], shown["versions"]) == ("You write haiku.", [1])
    found = json.loads(mp("agents", "search", "haiku", "--json").stdout)
    assert [agent["id"] for agent in found] == ["poet"]
    assert [c["id"] for c in json.loads(mp("cohorts", "list", "--json").stdout)] == ["c1"]
    missing = mp("agents", "show", "nobody")
    assert (missing.returncode, missing.stderr.strip()) == (
        2,  # an id that names nothing is a usage error, as for runs
        "error: no agent 'nobody' in the registry (see `masterplanner agents list`)",
    )
    assert mp("cohorts", "rm", "c1").returncode == 0
    assert store.list_cohorts() == []


async def test_a_prompt_a_person_writes_is_marked_theirs_and_no_edit_clears_the_mark(
    store: RegistryStore, tmp_path: Path
) -> None:
    from masterplanner import Settings
    from masterplanner.service import RegistryService

    service = RegistryService(Settings.load())
    try:
        store.put_agent(_agent("csv", "data analyst", "You read CSV files."))
        form = (await service.agent("csv")).model_dump(mode="json", exclude={"stats", "version"})
        assert form["prompt_by_person"] is False  # shown in the JSON form `agents edit` opens
        described = await service.edit_agent("csv", form | {"description": "Reads CSV files."})
        assert (described.version, described.prompt_by_person) == (2, False)  # the prompt left alone
        # the form as it was read (false) with the prompt rewritten: the prompt is the person's
        mine = "Read the CSV file and reply with its header line only."
        rewritten = await service.edit_agent("csv", form | {"system_prompt": mine})
        assert (rewritten.version, rewritten.prompt_by_person) == (3, True)
        # false sent back (a stale form, or set by hand) does not clear it: the shortcuts of a
        # small model's step aids would skip the person's prompt again
        current = rewritten.model_dump(mode="json")
        kept = await service.edit_agent("csv", current | {"prompt_by_person": False})
        assert (kept.version, kept.prompt_by_person) == (3, True)  # nothing else changed: no version
        renamed = await service.edit_agent("csv", current | {"prompt_by_person": False, "name": "csv reader"})
        assert (renamed.version, renamed.prompt_by_person, renamed.system_prompt) == (4, True, mine)
        # a person may mark the prompt they keep as theirs: the model then works under it
        store.put_agent(_agent("poet", "poet", "You write haiku."))
        poet = (await service.agent("poet")).model_dump(mode="json")
        marked = await service.edit_agent("poet", poet | {"prompt_by_person": True})
        assert (marked.version, marked.prompt_by_person) == (2, True)
        # an edit with an unknown field names the fields an agent has (before: only "unknown field")
        with pytest.raises(AgentEditError) as unknown:
            await service.edit_agent("poet", poet | {"colour": "red"})
        assert unknown.value.problems == [
            "colour: unknown field; known: description, id, keywords, lessons, model, name, origin, "
            "prompt_by_person, role, stats, system_prompt, tools, version"
        ]

        # an import follows the same rule: a file's prompt that differs is a person's, and a
        # file's false does not clear the mark here
        store.put_agent(_agent("clerk", "clerk", "You file things."))
        exported = tmp_path / "agents.jsonl"
        await service.export_agents(exported)
        lines = [json.loads(line) for line in exported.read_text().splitlines()]
        for line in lines:
            if line["id"] == "clerk":
                line["system_prompt"] = "File each thing by its date."
            line["prompt_by_person"] = False
        exported.write_text("".join(json.dumps(line) + "\n" for line in lines))
        done = await service.import_agents(exported)
        assert (done.added, done.updated, sorted(done.unchanged)) == ([], ["clerk"], ["csv", "poet"])
        assert {agent.id: agent.prompt_by_person for agent in await service.agents()} == {
            "clerk": True,
            "csv": True,
            "poet": True,
        }
    finally:
        service.close()


def test_agents_stored_before_the_mark_are_marked_where_a_person_wrote_their_prompt(
    database_url: str,
) -> None:
    # a registry from before `prompt_by_person`: its specs lack the field, and reading them gives
    # false, so a run reusing an agent whose prompt a person wrote would skip that prompt again
    import sqlalchemy as sa

    from masterplanner.database import create_engine
    from masterplanner.engine import RunOptions
    from masterplanner.engine.records import AgentBrief
    from masterplanner.engine.store import RunStore

    runs = RunStore(database_url)
    for run_id, edited in (("r-edited", True), ("r-written", False)):
        runs.create_run(run_id, "Read notes.txt.", model="scripted", workspace=".", options=RunOptions())
        runs.update_run(run_id, agents={"read": AgentBrief(prompt=f"prompt of {run_id}", edited=edited)})
    runs.close()
    store = RegistryStore(database_url)
    origin = {"step_id": "read"}
    store.put_agent(
        _agent("r-edited.read", "reader", "prompt of r-edited", origin=origin | {"run_id": "r-edited"})
    )
    store.put_agent(
        _agent("r-written.read", "reader", "prompt of r-written", origin=origin | {"run_id": "r-written"})
    )
    store.put_agent(_agent("rewritten", "reader", "You read files."))
    store.put_agent(_agent("rewritten", "reader", "Read the file; reply with its first line only."))
    store.put_agent(_agent("rewritten", "reader", "Read the file; reply with its first line only.", name="r"))
    store.put_agent(_agent("described", "reader", "You read files."))
    store.put_agent(_agent("described", "reader", "You read files.", description="Reads files."))
    store.close()
    engine = create_engine(database_url)
    with engine.begin() as connection:  # as the version before the mark stored them
        for table, key in (("mp_agents", "id"), ("mp_agent_versions", "agent_id")):
            for row in connection.execute(sa.text(f"SELECT {key}, spec FROM {table}")).all():
                spec = json.loads(row[1])
                assert spec.pop("prompt_by_person") is False
                connection.execute(
                    sa.text(f"UPDATE {table} SET spec = :spec WHERE {key} = :id AND spec = :old"),
                    {"spec": json.dumps(spec), "id": row[0], "old": row[1]},
                )
        connection.execute(sa.text("DELETE FROM mp_migrations WHERE name = 'registry_0005_prompt_by_person'"))
    engine.dispose()

    store = RegistryStore(database_url)
    try:
        assert {agent.id: agent.prompt_by_person for agent in store.list_agents()} == {
            "r-edited.read": True,  # its run's step had the prompt edited at review
            "r-written.read": False,
            "rewritten": True,  # a version changed the prompt
            "described": False,  # its versions changed only the description
        }
        versions = [store.get_agent("rewritten", number).prompt_by_person for number in (1, 2, 3)]
        assert versions == [False, True, True]
    finally:
        store.close()
