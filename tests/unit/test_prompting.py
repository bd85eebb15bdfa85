"""The Prompt Creator with the scripted model: drafts, critique rounds, concurrency, errors."""

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from masterplanner import ConfigError, UsageLedger, resolve_model, validate_plan
from masterplanner.errors import ModelError
from masterplanner.prompting import AgentPrompt, Critique, cleaned_prompt, create_prompts, prompts_to_json
from masterplanner.tools import builtin_catalog

CATALOG = builtin_catalog()
WriteScript = Callable[..., Path]
PLAN = validate_plan(
    {
        "task": "Report on sales",
        "steps": [
            {
                "id": "load",
                "title": "Load",
                "instruction": "Read sales.csv.",
                "agent_role": "analyst",
                "tools": ["read_file"],
                "depends_on": [],
                "expected_output": "rows",
            },
            {
                "id": "report",
                "title": "Report",
                "instruction": "Write report.md.",
                "agent_role": "writer",
                "tools": ["write_file"],
                "depends_on": ["load"],
                "expected_output": "report.md",
            },
        ],
    },
    CATALOG,
)
CRITIQUE = {
    "clarity": 3,
    "completeness": 2,
    "tool_fit": 4,
    "output_format": 2,
    "defects": ["say what to hand on"],
}


async def test_one_round_per_step(write_script: WriteScript) -> None:
    script = write_script(
        [
            {"purpose": "prompt_creator", "output": "draft A"},
            {"purpose": "prompt_creator", "output": "draft B"},
            {"purpose": "critic", "output": CRITIQUE, "repeat": True},
            {"purpose": "prompt_creator", "output": "final", "repeat": True},
        ]
    )
    ledger = UsageLedger()
    prompts = await create_prompts(PLAN, CATALOG, model=resolve_model(f"scripted:{script}"), ledger=ledger)
    assert list(prompts) == ["load", "report"]
    for prompt in prompts.values():
        assert prompt.draft in ("draft A", "draft B")
        assert prompt.critiques == [Critique.model_validate(CRITIQUE)]
        assert prompt.final == "final"
    assert prompts["load"].critiques[0].score == 2.75
    usage = ledger.by_purpose()
    assert usage["prompt_creator"]["calls"] == 4
    assert usage["critic"]["calls"] == 2
    assert prompts_to_json(prompts)["report"] == {
        "prompt": "final",
        "critique": CRITIQUE,
        "draft": prompts["report"].draft,
        "rounds": [{"critique": CRITIQUE, "revision": "final"}],
    }


async def test_zero_rounds_keeps_the_draft(write_script: WriteScript) -> None:
    script = write_script([{"purpose": "prompt_creator", "output": "just a draft", "repeat": True}])
    ledger = UsageLedger()
    prompts = await create_prompts(
        PLAN, CATALOG, model=resolve_model(f"scripted:{script}"), ledger=ledger, rounds=0
    )
    assert {p.final for p in prompts.values()} == {"just a draft"}
    assert prompts["load"].to_json_dict()["critique"] is None
    assert "critic" not in ledger.by_purpose()


async def test_two_rounds_keep_every_critique(write_script: WriteScript) -> None:
    second = CRITIQUE | {"clarity": 5, "defects": []}
    script = write_script(
        [
            {"purpose": "prompt_creator", "output": "v0"},
            {"purpose": "critic", "output": CRITIQUE},
            {"purpose": "prompt_creator", "output": "v1"},
            {"purpose": "critic", "output": second},
            {"purpose": "prompt_creator", "output": "v2"},
        ]
    )
    one_step = validate_plan({"task": "t", "steps": [PLAN.steps[0].model_dump()]}, CATALOG)
    prompts = await create_prompts(one_step, CATALOG, model=resolve_model(f"scripted:{script}"), rounds=2)
    prompt = prompts["load"]
    assert (prompt.draft, prompt.revisions, prompt.final) == ("v0", ["v1", "v2"], "v2")
    assert [c.clarity for c in prompt.critiques] == [3, 5]


async def test_steps_are_processed_concurrently(write_script: WriteScript) -> None:
    script = write_script(
        [{"purpose": "prompt_creator", "output": "slow draft", "delay_s": 0.5, "repeat": True}]
    )
    loop = asyncio.get_running_loop()
    started = loop.time()
    await create_prompts(PLAN, CATALOG, model=resolve_model(f"scripted:{script}"), rounds=0)
    # Two steps of 0.5 s each: one after the other would take 1.0 s.
    assert loop.time() - started < 0.9


async def test_prompt_sees_role_inputs_and_tools(write_script: WriteScript) -> None:
    script = write_script([{"purpose": "prompt_creator", "output": "x", "repeat": True}])
    model = resolve_model(f"scripted:{script}")
    seen: list[str] = []
    original = model.request

    async def spy(messages: Any, settings: Any, params: Any) -> Any:
        seen.append(str(messages))
        return await original(messages, settings, params)

    model.request = spy  # type: ignore[method-assign]
    one_step = validate_plan(
        {"task": "Report on sales", "steps": [s.model_dump() for s in PLAN.steps]}, CATALOG
    )
    await create_prompts(one_step, CATALOG, model=model, rounds=0, concurrency=1)
    report = next(text for text in seen if "Step report" in text)
    assert "Role: writer" in report
    assert "- load (Load): rows" in report
    assert "- write_file:" in report


@pytest.mark.parametrize("rounds", [-1, 6])
async def test_round_bounds(write_script: WriteScript, rounds: int) -> None:
    with pytest.raises(ConfigError, match="between 0 and 5"):
        await create_prompts(
            PLAN, CATALOG, model=resolve_model(f"scripted:{write_script([])}"), rounds=rounds
        )


def test_agent_prompt_final_without_revisions() -> None:
    assert AgentPrompt("x", "draft").final == "draft"


async def test_a_step_whose_prompt_fails_stops_the_others(write_script: WriteScript) -> None:
    """Before, the other steps' prompts went on calling the model after the failure was raised."""
    script = write_script([{"purpose": "prompt_creator", "output": "slow draft", "delay_s": 0.5}])
    ledger = UsageLedger()
    with pytest.raises(Exception, match="prompt_creator"):  # the second draft finds no entry left
        await create_prompts(
            PLAN, CATALOG, model=resolve_model(f"scripted:{script}"), ledger=ledger, rounds=0
        )
    await asyncio.sleep(0.8)  # past the slow draft's end, had it gone on
    # the one call counted is the draft that failed: the slow one was stopped, not answered
    assert ledger.by_purpose()["prompt_creator"] == {
        "calls": 1,
        "failed_calls": 1,
        "input_tokens": 0,
        "output_tokens": 0,
        "seconds": ledger.by_purpose()["prompt_creator"]["seconds"],
        "cost_usd": 0.0,
        "unpriced_calls": 0,
    }


async def test_a_prompt_is_stored_without_the_writers_tags_and_commentary(write_script: WriteScript) -> None:
    # the embedded model's revisions kept the template's tags and its own words to the reviewer,
    # and the review showed them (and the team stored them) as the agent's prompt
    script = write_script(
        [
            {
                "purpose": "prompt_creator",
                "output": "Here is the prompt:\n\nYou read sales.csv.\nHand on its rows.",
            },
            {"purpose": "critic", "output": CRITIQUE},
            {
                "purpose": "prompt_creator",
                "output": "To improve clarity, I've rewritten the prompt. Here's the revised version:\n\n"
                "<prompt>\nYou read sales.csv with read_file.\nHand on its rows as they are.\n</prompt>\n\n"
                "I made minor adjustments to the wording for the reviewer.",
            },
            {"purpose": "critic", "output": CRITIQUE},
            # the closing tag missing: the prompt runs to the end
            {
                "purpose": "prompt_creator",
                "output": "<prompt>\nYou read sales.csv with read_file.\nHand on every row.",
            },
            {"purpose": "critic", "output": CRITIQUE},
            # nothing left once cleaned: the prompt before it is kept
            {"purpose": "prompt_creator", "output": "Here's the revised version:\n<prompt>\n</prompt>"},
        ]
    )
    one_step = validate_plan({"task": "t", "steps": [PLAN.steps[0].model_dump()]}, CATALOG)
    prompts = await create_prompts(one_step, CATALOG, model=resolve_model(f"scripted:{script}"), rounds=3)
    prompt = prompts["load"]
    assert prompt.draft == "You read sales.csv.\nHand on its rows."
    assert prompt.revisions == [
        "You read sales.csv with read_file.\nHand on its rows as they are.",
        "You read sales.csv with read_file.\nHand on every row.",
        "You read sales.csv with read_file.\nHand on every row.",
    ]
    assert prompt.final == "You read sales.csv with read_file.\nHand on every row."


async def test_a_draft_of_only_the_writers_own_words_fails_as_an_empty_one(write_script: WriteScript) -> None:
    script = write_script(
        [{"purpose": "prompt_creator", "output": "Here's the prompt:\n<prompt>\n</prompt>"}]
    )
    one_step = validate_plan({"task": "t", "steps": [PLAN.steps[0].model_dump()]}, CATALOG)
    with pytest.raises(
        ModelError, match=r"^the prompt_creator call returned no prompt, only words about one$"
    ):
        await create_prompts(one_step, CATALOG, model=resolve_model(f"scripted:{script}"), rounds=0)


@pytest.mark.parametrize(
    "prompt",
    [
        "Here is your task: write a haiku about autumn and save it to haiku.md.\nKeep it to three lines.",
        "Here is the data you will receive: a CSV of sales.\nSummarise it.",
        "Okay so first read input.csv.\nThen summarise.",
        "Write the poem.\nThe final version must be saved to haiku.md.",
        "Write the poem.\nI have to stress: do not invent facts.",
        "Write the poem.\nI have 3 rules: be brief, be kind, be done.",
        "Write the poem.\nChanges: list what changed in CHANGES.md",
        "Print the total as:\n```python\nprint(total)\n```",
        "Write code. Use </prompt> carefully.",
    ],
)
def test_a_prompt_s_own_lines_are_not_taken_for_the_writer_s(prompt: str) -> None:
    # a review found each of these cut (the task's line, a rule, a closing fence, the text after
    # a `</prompt>` the prompt itself names) by a cleaning that took any "Here is…" or "I have…"
    assert cleaned_prompt(prompt) == prompt
