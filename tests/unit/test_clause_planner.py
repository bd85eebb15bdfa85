"""Plans for small models: structure from the task's clauses, the model fills in titles and roles."""

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner import UsageLedger, resolve_model
from masterplanner.clause_planner import draft_steps, language_caution, role_candidates, step_clauses
from masterplanner.errors import PlanError
from masterplanner.planner import PlanExample, plan
from masterplanner.tools import builtin_catalog

CATALOG = builtin_catalog()
WriteScript = Callable[..., Path]
POEM_IN_CHINESE = "写一首关于大海的短诗\uff0c保存到 poem.txt"


def _small(write_script: WriteScript, *calls: dict[str, Any]) -> Any:
    path = write_script(None, raw=json.dumps({"small_model": True, "calls": list(calls)}))
    return resolve_model(f"scripted:{path}")


def _fills(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {"steps": [{"title": title, "agent_role": role} for title, role in pairs]}


def test_a_clause_that_only_saves_joins_the_clause_before_it() -> None:
    assert step_clauses("Write a haiku about the sea and save it to haiku.txt", 8) == [
        "Write a haiku about the sea and save it to haiku.txt"
    ]
    assert step_clauses("Read notes.txt and write a one-sentence summary of it to summary.txt", 8) == [
        "Read notes.txt",
        "write a one-sentence summary of it to summary.txt",
    ]
    assert step_clauses("Load a.csv, sum the totals, then plot them and write a report", 2) == [
        "Load a.csv",
        "sum the totals, then plot them, then write a report",
    ]


def test_each_step_gets_its_best_matching_tool_and_roles_ranked_for_it() -> None:
    drafts = draft_steps("Read notes.txt and write a one-sentence summary of it to summary.txt", CATALOG, 8)
    assert [(draft.text, draft.tools) for draft in drafts] == [
        ("Read notes.txt", ["read_file"]),
        ("write a one-sentence summary of it to summary.txt", ["write_file"]),
    ]
    assert role_candidates("Write a haiku about the sea to haiku.txt", ["write_file"]) == [
        "poet",
        "writer",
        "assistant",
    ]


def test_a_file_to_file_clause_is_read_first_then_written() -> None:
    drafts = draft_steps("Summarize article.txt in two or three sentences to summary.txt.", CATALOG, 8)
    assert [(draft.text, draft.tools) for draft in drafts] == [
        ("Read article.txt", ["read_file"]),
        ("Summarize article.txt in two or three sentences to summary.txt", ["write_file"]),
    ]
    # at most one step more than the task has clauses, and none past max_steps
    assert len(draft_steps("Translate a.txt to b.txt and summarize c.txt to d.txt", CATALOG, 8)) == 3
    assert len(draft_steps("Summarize article.txt to summary.txt", CATALOG, 1)) == 1


def test_a_clause_about_each_file_may_read_them() -> None:
    drafts = draft_steps(
        "Describe each file in the workspace in one line and save the descriptions to index.md.", CATALOG, 8
    )
    assert [draft.tools for draft in drafts] == [["list_files", "read_file", "write_file"]]
    drafts = draft_steps(
        "List the CSV files in the workspace, then write one sentence about each to notes.md.", CATALOG, 8
    )
    assert [draft.tools for draft in drafts] == [["list_files"], ["write_file", "read_file"]]


def test_a_clause_naming_a_folder_may_list_it_and_read_its_files() -> None:
    # "the three files in ./notes" was planned with read_file and write_file only: nothing could
    # find the notes, and the step wrote a summary of nothing (new-user review)
    for task in (
        "summarise the three files in ./notes into summary.md",
        "Summarise the files in notes/ into summary.md",
        "Summarise the files in the notes folder to summary.txt",
        "summarise the files into summary.md",
    ):
        assert [draft.tools for draft in draft_steps(task, CATALOG, 8)] == [
            ["list_files", "read_file", "write_file"]
        ], task
    # a file in a folder names no folder to list
    assert [draft.tools for draft in draft_steps("Read out/report.md", CATALOG, 8)] == [["read_file"]]


async def test_the_haiku_is_one_step_in_the_tasks_own_words(write_script: WriteScript) -> None:
    ledger = UsageLedger()
    model = _small(
        write_script, {"purpose": "planner", "output": _fills(("Write the haiku about the sea", "poet"))}
    )
    result = await plan("Write a haiku about the sea to haiku.txt", CATALOG, model=model, ledger=ledger)
    assert [
        step.model_dump(include={"id", "title", "agent_role", "tools", "depends_on"}) for step in result.steps
    ] == [
        {
            "id": "write-the-haiku-about-the-sea",
            "title": "Write the haiku about the sea",
            "agent_role": "poet",
            "tools": ["write_file"],
            "depends_on": [],
        }
    ]
    assert result.steps[0].instruction.startswith("Write a haiku about the sea to haiku.txt.")
    assert ledger.by_purpose()["planner"]["calls"] == 1


async def test_a_title_and_its_id_never_end_on_a_dangling_word(write_script: WriteScript) -> None:
    # the model's six words "Write the haiku about autumn to" made the title and the id
    # `write-the-haiku-about-autumn-to`; an id cut at its length limit ended mid-word
    model = _small(
        write_script,
        {
            "purpose": "planner",
            "output": _fills(
                ("Write the haiku about autumn to", "poet"),
                ("Summarise the meeting notes into paragraphs", "assistant"),
                ("List the files in the", "assistant"),
            ),
        },
    )
    result = await plan(
        "write a haiku about autumn to haiku.txt, then summarise the meeting notes into paragraphs "
        "and then list the files in the workspace",
        CATALOG,
        model=model,
    )
    assert [(step.id, step.title) for step in result.steps] == [
        ("write-the-haiku-about-autumn", "Write the haiku about autumn"),
        ("summarise-the-meeting-notes", "Summarise the meeting notes into paragraphs"),
        ("list-the-files", "List the files"),
    ]


async def test_clauses_form_a_chain_and_a_named_file_is_read(write_script: WriteScript) -> None:
    model = _small(
        write_script,
        {
            "purpose": "planner",
            "output": _fills(("Read the notes", "file clerk"), ("Write the summary", "summarizer")),
        },
    )
    result = await plan(
        "Read notes.txt and write a one-sentence summary of it to summary.txt", CATALOG, model=model
    )
    read, write = result.steps
    assert (read.id, read.tools, read.depends_on) == ("read-the-notes", ["read_file"], [])
    assert (write.id, write.agent_role, write.depends_on) == (
        "write-the-summary",
        "summarizer",
        ["read-the-notes"],
    )
    assert write.instruction.startswith(
        "Write a one-sentence summary of it to summary.txt. Use the result of Read the notes."
    )


async def test_stored_teams_never_reach_a_small_models_plan(write_script: WriteScript) -> None:
    haiku_team = PlanExample(
        "Write a haiku about the sea to haiku.txt",
        [
            {
                "id": "poem",
                "title": "The waves roll in",
                "instruction": "The sun rises over haiku.txt",
                "tools": ["write_file"],
            }
        ],
    )
    model = _small(
        write_script,
        {
            "purpose": "planner",
            "output": _fills(("Read the notes", "file clerk"), ("Write the summary", "summarizer")),
        },
    )
    result = await plan(
        "Read notes.txt and write a one-sentence summary of it to summary.txt",
        CATALOG,
        model=model,
        hints=[haiku_team],
    )
    text = result.model_dump_json()
    assert "haiku" not in text and "waves" not in text and "sun rises" not in text


async def test_a_fill_outside_its_choices_goes_back_with_its_problems(write_script: WriteScript) -> None:
    ledger = UsageLedger()
    model = _small(
        write_script,
        {"purpose": "planner", "output": _fills(("The sea is a great place", "1234567890"))},
        {
            "purpose": "planner",
            "output": _fills(("Write a sea haiku", "poet")),
            "expect": [
                "step 1: title: Write and at most five more words",
                "step 1: agent_role: one of poet, writer, assistant",
            ],
        },
    )
    result = await plan("Write a haiku about the sea to haiku.txt", CATALOG, model=model, ledger=ledger)
    assert (result.steps[0].title, result.steps[0].agent_role) == ("Write a sea haiku", "poet")
    assert ledger.by_purpose()["planner"]["calls"] == 2


async def test_fills_that_never_fit_end_in_a_plan_error(write_script: WriteScript) -> None:
    model = _small(write_script, {"purpose": "planner", "output": {"steps": []}, "repeat": True})
    with pytest.raises(PlanError) as caught:
        await plan("Write a haiku about the sea to haiku.txt", CATALOG, model=model)
    assert str(caught.value) == "no valid plan after 2 repairs: steps: give exactly 1 entry, one per step"


@pytest.mark.parametrize(
    ("task", "cautioned"),
    [
        (POEM_IN_CHINESE, True),
        ("Напиши короткое стихотворение о море", True),  # noqa: RUF001 (Cyrillic, as meant)
        ("Écris un poème sur la mer dans poème.txt", False),
        ("Write a haiku about the sea (海) to haiku.txt", False),
        ("123 456", False),
    ],
)
def test_a_task_mostly_in_another_script_is_cautioned(task: str, cautioned: bool) -> None:
    caution = language_caution(task)
    assert (caution is not None) == cautioned
    if caution is not None:
        assert caution.startswith("this model plans from a task's English words and answers in English")


async def test_a_small_model_s_review_and_plan_say_the_caution(
    isolated: Path, write_script: WriteScript
) -> None:
    from masterplanner import Settings
    from masterplanner.engine import Engine, RunOptions

    script = write_script(
        None,
        raw=json.dumps(
            {
                "small_model": True,
                "calls": [
                    {"purpose": "planner", "output": _fills(("Write poem", "poet"))},
                    {"purpose": "prompt_creator", "output": "You are a poet.", "repeat": True},
                ],
            }
        ),
    )
    engine = Engine(Settings.load())
    try:
        record = engine.create_run(
            POEM_IN_CHINESE,
            model=f"scripted:{script}",
            options=RunOptions(prompt_rounds=0),
        )
        running = asyncio.create_task(engine.execute(record.id))
        while True:
            found = engine.store.requests.find(record.id)
            if found:
                break
            await asyncio.sleep(0.05)
        (review,) = found
        engine.store.requests.answer(review.id, {"action": "reject"}, by="test")
        assert (await running).status == "cancelled"
        (ready,) = [event.data for event in engine.store.events(record.id) if event.kind == "plan_ready"]
    finally:
        engine.close()
    caution = language_caution("写")
    assert (review.payload["cautions"], ready["cautions"]) == ([caution], [caution])
