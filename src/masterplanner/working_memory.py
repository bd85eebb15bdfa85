"""Working memory: a step agent's context kept within its model's window.

A step agent sees two things that grow: the outputs of the steps it depends on (its inputs), and
its own conversation (its brief, its tool calls and their results). Both are held to a budget in
characters (`ContextBudget`), clamped to the model's window when the window is known:

- Inputs share `inputs_chars`. Short ones are shown whole; the budget left is split evenly among
  the long ones (`input_shares`). A long input is summarised for the step that reads it by the
  `summarizer` model purpose, in pieces that fit the summariser's own window, the pieces'
  summaries summarised again until the whole fits. Only if summarising fails (the model errs, or
  cannot get under the share) is the input cut, and the cut is marked. Every input that was not
  shown whole says so, and how long it was.
- The conversation is held to `history_chars` by `trim_history`: the oldest tool results are
  replaced by a note saying what was dropped, the brief and the newest exchange are never touched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic_ai.messages import ModelMessage, ModelRequest, ToolReturnPart

from .errors import ModelError
from .prompts import render

if TYPE_CHECKING:
    from pydantic_ai.models import Model

    from .plan import Step

__all__ = [
    "CHARS_PER_TOKEN",
    "ContextBudget",
    "FittedInput",
    "HistoryProcessor",
    "Summarizer",
    "estimated_tokens",
    "fit_inputs",
    "history_processor",
    "input_shares",
    "trim_history",
    "trimmer",
    "untrimmed",
]

CHARS_PER_TOKEN = 3
"""Characters per token assumed when a window in tokens becomes a budget in characters.

English prose runs about four characters a token; code, JSON and other languages fewer. Three
errs on the side of fitting."""


def estimated_tokens(text: str) -> int:
    """About the most tokens `text` takes: `CHARS_PER_TOKEN` ASCII characters a token, a byte any other.

    Any other character counts a token for each of its UTF-8 bytes. Chinese and Japanese run
    about a token a character even in a tokenizer made for them; in one made for English, more
    (SmolLM2's: 47 tokens for 27 Japanese characters, 81 bytes), and a byte-level tokenizer
    never makes more than a token a byte. At `CHARS_PER_TOKEN` for every character, Japanese
    notes shown to a model with a 2,048-token window overflowed it, and llama.cpp refused the
    request.
    """
    ascii_chars = len(text.encode("ascii", "ignore"))
    other_bytes = len(text.encode("utf-8", "surrogatepass")) - ascii_chars
    return -(-ascii_chars // CHARS_PER_TOKEN) + other_bytes


_CUT = "\n[… cut: {cut:,} more characters not shown]"
_UNTRIMMED = "masterplanner_untrimmed"
"""The `metadata` key (kept here, never sent to a model) under which a tool result `trim_history`
dropped or cut keeps what the call returned (`untrimmed`)."""
_MIN_SHARE = 200
"""No input is squeezed below this many characters, however many there are."""


@dataclass(frozen=True)
class ContextBudget:
    """How many characters a step agent's inputs and whole conversation may take."""

    inputs_chars: int
    history_chars: int

    def within(self, window_tokens: int | None, output_tokens: int = 0) -> ContextBudget:
        """This budget clamped to a model window of `window_tokens` that must also hold the reply.

        The conversation gets what the window leaves after the reply; the inputs at most half of
        that (the brief's other parts, the instructions and the tools' schemas need the rest).
        """
        if window_tokens is None:
            return self
        history = max(2 * _MIN_SHARE, (window_tokens - output_tokens) * CHARS_PER_TOKEN)
        return ContextBudget(
            inputs_chars=min(self.inputs_chars, history // 2), history_chars=min(self.history_chars, history)
        )


INPUT_HEADING = "### Output of step "
"""How the heading above a dependency's output in a step's brief begins (the step id follows)."""


@dataclass(frozen=True)
class FittedInput:
    """One dependency's output as a step sees it."""

    step_id: str
    text: str
    original_chars: int
    how: Literal["whole", "summarized", "cut"]
    reason: str = ""
    """Why an input was cut instead of summarised."""

    @property
    def heading(self) -> str:
        """The section heading the brief shows above this input."""
        if self.how == "summarized":
            return f"{INPUT_HEADING}{self.step_id} (summarised from {self.original_chars:,} characters)"
        return f"{INPUT_HEADING}{self.step_id}"


def input_shares(lengths: Mapping[str, int], budget: int) -> dict[str, int]:
    """Characters each input may keep: all of it if it fits its fair share, else an even split of the rest.

    Inputs are settled shortest first; whatever a short one leaves goes to the longer ones.
    """
    shares: dict[str, int] = {}
    left, open_inputs = budget, sorted(lengths, key=lambda key: (lengths[key], key))
    while open_inputs:
        fair = max(_MIN_SHARE, left // len(open_inputs))
        key = open_inputs[0]
        if lengths[key] <= fair:
            shares[key] = lengths[key]
            left -= lengths[key]
            open_inputs.pop(0)
            continue
        for key in open_inputs:
            shares[key] = fair
        break
    return {key: shares[key] for key in lengths}


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + _CUT.format(cut=len(text) - limit)


class Summarizer:
    """Summarises a long input for the step that reads it, with a model labelled `summarizer`."""

    def __init__(self, model: Model, *, chunk_chars: int = 12_000, max_rounds: int = 3) -> None:
        """`chunk_chars`: the most characters one summariser call reads (keep it within its window)."""
        self.model = model
        self.chunk_chars = max(chunk_chars, 4 * _MIN_SHARE)
        self.max_rounds = max_rounds

    async def summarize(self, text: str, *, limit: int, source: str, reader: Step) -> str:
        """A summary of `text` (step `source`'s output) of at most `limit` characters, for `reader`.

        Raises `ModelError` when the model fails, or when its summaries stop getting shorter or are
        still over `limit` after `max_rounds` rounds. A budget overrun or a configuration error
        (not the model's fault) propagates as it is.
        """
        for _ in range(self.max_rounds):
            if len(text) <= limit:
                return text
            before = len(text)
            size = self.chunk_chars
            pieces = [text[start : start + size] for start in range(0, len(text), size)]
            each = max(_MIN_SHARE, limit // len(pieces))
            summaries = [
                await self._call(piece, limit=each, source=source, reader=reader, part=(n, len(pieces)))
                for n, piece in enumerate(pieces, start=1)
            ]
            text = "\n\n".join(summaries)
            if len(text) >= before:
                raise ModelError(
                    f"the summary of step {source}'s output ({len(text):,} characters) was no shorter "
                    f"than the text ({before:,})"
                )
        if len(text) > limit:
            raise ModelError(
                f"the summaries of step {source}'s output stayed over {limit:,} characters "
                f"after {self.max_rounds} rounds"
            )
        return text

    async def _call(self, piece: str, *, limit: int, source: str, reader: Step, part: tuple[int, int]) -> str:
        from pydantic_ai import Agent

        from .agents import run_agent

        agent: Agent[None, str] = Agent(self.model, instructions=render("summarizer_system.j2"))
        prompt = render(
            "summarizer_user.j2",
            source=source,
            reader=reader,
            text=piece,
            limit=limit,
            words=max(20, limit // 7),
            part=part,
        )
        summary = str(await run_agent(agent, prompt)).strip()
        if not summary:
            raise ModelError(f"the summary of step {source}'s output came back empty")
        return summary


async def fit_inputs(
    step: Step,
    outputs: Mapping[str, str],
    budget_chars: int,
    summarizer: Summarizer,
) -> list[FittedInput]:
    """`step`'s dependencies' outputs, in `depends_on` order, fitted to `budget_chars` together."""
    texts = {dependency: outputs.get(dependency, "") for dependency in step.depends_on}
    shares = input_shares({key: len(text) for key, text in texts.items()}, budget_chars)
    fitted = []
    for dependency, text in texts.items():
        share = shares[dependency]
        if len(text) <= share:
            fitted.append(FittedInput(dependency, text, len(text), "whole"))
            continue
        try:
            summary = await summarizer.summarize(text, limit=share, source=dependency, reader=step)
        except ModelError as error:
            fitted.append(FittedInput(dependency, _cut(text, share), len(text), "cut", str(error)))
            continue
        fitted.append(FittedInput(dependency, summary, len(text), "summarized"))
    return fitted


def _part_chars(part: object) -> int:
    content = getattr(part, "content", None)
    if isinstance(content, str):
        return len(content)
    args = getattr(part, "args", None)
    if args is not None:
        return len(args) if isinstance(args, str) else len(str(args))
    return len(str(content)) if content is not None else 0


def _message_chars(message: ModelMessage) -> int:
    return sum(_part_chars(part) for part in message.parts)


def trim_history(messages: Sequence[ModelMessage], budget_chars: int) -> list[ModelMessage]:
    """The conversation with its oldest tool results dropped until it fits `budget_chars`.

    The first request (the brief) and the last two messages (the newest call and its results)
    are kept; a dropped result is replaced by a note naming the tool and its size, so the agent
    knows it can call the tool again. If it still does not fit, a newest result longer than half
    the budget is cut to that half, with a note saying so: before, one program printing 2 MB went
    to the model whole (209,800 input tokens in one request, against an 8,192-token window).
    """
    kept = list(messages)
    total = sum(_message_chars(message) for message in kept)
    if total <= budget_chars:
        return kept
    for index in range(1, max(1, len(kept) - 2)):
        message = kept[index]
        if not isinstance(message, ModelRequest):
            continue
        parts = list(message.parts)
        for number, part in enumerate(parts):
            if type(part) is not ToolReturnPart:  # not its subclasses, whose content is structured
                continue
            size = _part_chars(part)
            note = (
                f"[earlier result of {part.tool_name}, {size:,} characters, dropped to keep within "
                "the context window; call the tool again if you need it]"
            )
            if size <= len(note):
                continue
            parts[number] = _trimmed(cast("ToolReturnPart[Any]", part), note)
            total -= size - len(note)
            if total <= budget_chars:
                break
        kept[index] = replace(message, parts=parts)
        if total <= budget_chars:
            break
    if total > budget_chars and kept and isinstance(kept[-1], ModelRequest):
        kept[-1] = _cut_newest_results(kept[-1], max(1_000, budget_chars // 2))
    return kept


def _cut_newest_results(request: ModelRequest, keep: int) -> ModelRequest:
    """`request` with each text tool result longer than `keep` characters cut to its first `keep`."""
    parts = list(request.parts)
    for number, part in enumerate(parts):
        if type(part) is not ToolReturnPart or not isinstance(part.content, str) or len(part.content) <= keep:
            continue
        note = (
            f"\n[cut here: this result of {part.tool_name} is {len(part.content):,} characters; the first "
            f"{keep:,} are shown to keep within the context window. Ask for less, e.g. a part or a summary]"
        )
        parts[number] = _trimmed(cast("ToolReturnPart[Any]", part), part.content[:keep] + note)
    return replace(request, parts=parts)


def _trimmed(part: ToolReturnPart[Any], content: str) -> ToolReturnPart[Any]:
    """`part` showing the model `content`, what the call returned kept with it (`untrimmed`)."""
    kept = part.metadata if isinstance(part.metadata, dict) else {}
    whole = kept.get(_UNTRIMMED, part.content)  # cut again on a later turn: still the call's own
    return replace(part, content=content, metadata={**kept, _UNTRIMMED: whole})


def untrimmed(part: ToolReturnPart[Any]) -> str:
    """What a tool call returned, as the model was shown it before `trim_history` dropped or cut it.

    An engine's step aid works out its answer from this ("Count the names in names.txt"), not
    from the cut copy: before, it counted the lines the conversation still showed (2,180 of a
    file of 20,000 names), and a file holding the text of the trimmer's note was taken as cut.
    """
    kept = part.metadata.get(_UNTRIMMED) if isinstance(part.metadata, dict) else None
    return kept if isinstance(kept, str) else part.model_response_str()


HistoryProcessor = Callable[[list[ModelMessage]], Awaitable[list[ModelMessage]]]
"""What `ProcessHistory` calls before each model request of an agent."""


def history_processor(processor: HistoryProcessor) -> HistoryProcessor:
    """`processor` as pydantic-ai calls it cheaply: async, its annotations types, not strings.

    pydantic-ai reads a history processor's signature before every model request (does it take
    the run context?) and runs a plain `def` on a worker thread; with this module's postponed
    annotations each read evaluated them again. Measured in bench/engine.py's load figure.
    """
    processor.__annotations__ = {"messages": list[ModelMessage], "return": list[ModelMessage]}
    return processor


def trimmer(budget_chars: int) -> HistoryProcessor:
    """`trim_history` at `budget_chars`, as a history processor for a pydantic-ai agent."""

    async def trim(messages: list[ModelMessage]) -> list[ModelMessage]:
        return trim_history(messages, budget_chars)

    return history_processor(trim)
