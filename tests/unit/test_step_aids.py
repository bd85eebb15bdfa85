"""Step aids for small models: which steps are one direct tool call, which get their text drafted."""

from pathlib import Path

from masterplanner.engine.step_agent import (
    DirectCall,
    DraftedWrite,
    StepAids,
    direct_call,
    drafted_write,
    shape_text,
    tool_aids,
)
from masterplanner.plan import Plan, Step
from masterplanner.tools.workspace import Workspace


def _step(step_id: str, instruction: str, tools: list[str], *deps: str) -> Step:
    return Step(
        id=step_id,
        title=step_id.replace("-", " ").capitalize(),
        instruction=instruction,
        agent_role="writer",
        tools=tools,
        depends_on=list(deps),
    )


def test_a_step_that_only_reads_or_lists_is_one_direct_call() -> None:
    read = _step("read", "Read notes.txt. Use the result of Find the notes.", ["read_file"])
    assert direct_call(read, ["read_file"], ["notes.txt"]) == DirectCall("read_file", {"path": "notes.txt"})
    assert direct_call(read, ["read_file"], []) is None  # a file that is not there is the model's to handle
    listing = _step("list", "List the CSV files in the workspace.", ["list_files"])
    assert direct_call(listing, ["list_files"], []) == DirectCall("list_files", {})
    assert (
        direct_call(
            _step("more", "Read notes.txt and count its words.", ["read_file"]), ["read_file"], ["notes.txt"]
        )
        is None
    )


def test_a_poem_to_a_new_file_is_drafted_in_its_form() -> None:
    haiku = _step("write", "Write a haiku about the sea to haiku.txt.", ["write_file"])
    assert drafted_write(haiku, ["write_file"], ["haiku.txt"]) == DraftedWrite(
        "haiku.txt", "Write a haiku about the sea.", "A haiku is three short lines.", 3, None
    )
    assert drafted_write(haiku, ["read_file"], ["haiku.txt"]) is None
    invite = _step(
        "invite", "Write a two-sentence email inviting Sam to lunch to invite.txt.", ["write_file"]
    )
    assert drafted_write(invite, ["write_file"], ["invite.txt"]) == DraftedWrite(
        "invite.txt", "Write a two-sentence email inviting Sam to lunch.", sentences=2
    )
    assert shape_text(
        "### Output of step read-article\nBees pollinate. Colonies travel far. More.", sentences=2
    ) == ("Bees pollinate. Colonies travel far.")
    assert shape_text(
        "Here is your haiku:\nWaves fold on the shore, salt wind sings\nthe gulls wheel away", lines=3
    ) == ("Waves fold on the shore,\nsalt wind sings\nthe gulls wheel away")


def test_a_write_after_its_read_step_is_drafted_only_when_it_cannot_read_the_file(tmp_path: Path) -> None:
    (tmp_path / "article.txt").write_text("The harbour reopened after the storm.")
    read = _step("read-the-article", "Read article.txt.", ["read_file"])
    write = _step(
        "summarize",
        "Summarize article.txt in two sentences to summary.txt. Use the result of Read the article.",
        ["write_file"],
        "read-the-article",
    )
    plan = Plan(task="Summarize article.txt in two sentences to summary.txt.", steps=[read, write])
    aids = tool_aids(plan, write, ["write_file"], Workspace(tmp_path))
    assert isinstance(aids, StepAids) and aids.drafted_write is not None
    assert (aids.drafted_write.path, aids.drafted_write.request) == (
        "summary.txt",
        "Summarize article.txt in two sentences.",
    )
    both = tool_aids(plan, write, ["read_file", "write_file"], Workspace(tmp_path))
    assert isinstance(both, StepAids) and both.drafted_write is None  # it can read the file itself
