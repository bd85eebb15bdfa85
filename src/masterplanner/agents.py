"""Running pydantic-ai agents with masterplanner's error handling, and its failures in our words."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, MasterplannerError, ModelError, problem_in_our_words
from .redaction import redacted

if TYPE_CHECKING:
    from pydantic_ai.settings import ModelSettings

__all__ = ["failure_text", "retry_settings", "run_agent"]

_TOOL_RETRIES = re.compile(r"Tool '(?P<tool>[^']+)' exceeded max retries count of (?P<limit>\d+)")
_OUTPUT_RETRIES = re.compile(r"Exceeded maximum (?:output )?retries \((?P<limit>\d+)\)")
_TOKEN_LIMIT = re.compile(
    r"Model token limit \((?P<limit>[^)]*)\) exceeded (?P<where>while generating a tool call|"
    r"while generating structured output|before any response was generated)"
)
_CUT_OFF = {
    "while generating a tool call": "the model's reply was cut off at {} while it wrote a tool call",
    "while generating structured output": "the model's reply was cut off at {} while it wrote its answer",
    "before any response was generated": "the model reached {} before it wrote anything",
}
_ADVICE = re.compile(r"https?://|\bConsider\b|\bsee the docs\b|For further information|\bIncrease the\b")
_PROBLEM_CHARS = 300


def retry_settings(attempt: int) -> ModelSettings:
    """Model settings for a retry: sampled, seeded with `attempt` so runs stay reproducible.

    A greedy model given the same input writes the same failing reply again (seen with the
    embedded model: invalid plans repeated word for word, a step's tool call cut off at the
    output cap three times in a row).
    """
    return {"temperature": 0.7, "seed": attempt}


async def run_agent(agent: Any, prompt: str, **options: Any) -> Any:
    """Run a pydantic-ai agent (`options` go to `agent.run`) and return its output.

    Provider and protocol failures become masterplanner errors.
    """
    from pydantic_ai.exceptions import AgentRunError, ModelAuthenticationError, UserError

    try:
        result = await agent.run(prompt, **options)
    except MasterplannerError:
        raise
    except UserError as exc:
        raise ConfigError(str(exc)) from exc
    except ModelAuthenticationError as exc:
        # its body may echo the key it was sent ("Incorrect API key provided: …"): printed by
        # `plan` and `chat`, and in a run's error, without it
        raise ConfigError(f"the model provider rejected the credentials: {redacted(str(exc))}") from exc
    except AgentRunError as exc:
        raise ModelError(f"model call failed: {redacted(failure_text(exc))}") from exc
    except OSError as exc:
        raise ModelError(f"model call failed: {redacted(str(exc))}") from exc
    return result.output


def failure_text(exc: BaseException) -> str:
    """A failed model run in masterplanner's words, keeping the underlying problem.

    pydantic-ai words its failures for the developer who wrote the agent ("Tool 'x' exceeded max
    retries count of 2. Consider raising the retry limit, or see the docs … https://…"); the
    person running a plan can act on neither the advice nor the link. Retries that ran out say
    what the model kept doing wrong, how often, and the last problem; any other message of the
    library loses its advice and links. A provider's own error is kept, less any credential in it
    (a proxy answering 401 may echo the key it was sent: `redaction.redacted`).
    """
    from pydantic_ai.exceptions import ModelAPIError, UnexpectedModelBehavior, UsageLimitExceeded

    message = exc.message if isinstance(exc, UnexpectedModelBehavior) else str(exc)
    if match := _TOOL_RETRIES.search(message):
        return _tool_failures(match["tool"], int(match["limit"]) + 1, exc.__cause__)
    if match := _OUTPUT_RETRIES.search(message):
        times = int(match["limit"]) + 1
        problem = _problem(exc.__cause__, "field") or "an answer in the wrong form"
        return f"the model gave no usable answer {times} times in a row (last problem: {problem})"
    if match := _TOKEN_LIMIT.search(message):
        limit = match["limit"]
        cap = f"its output token limit ({limit} tokens)"
        if limit == "provider default":
            cap = "the provider's output token limit"
        return _CUT_OFF[match["where"]].format(cap)
    if isinstance(exc, ModelAPIError):
        return redacted(message)  # a server's error body may echo the key it was sent
    plain = _without_advice(message).removesuffix(".")
    if isinstance(exc, UsageLimitExceeded):
        return f"the model run reached its limit: {_lower_first(plain)}"
    if isinstance(exc, UnexpectedModelBehavior):
        return f"the model's reply was unusable: {plain}"
    return plain or type(exc).__name__


def _tool_failures(tool: str, times: int, cause: BaseException | None) -> str:
    from pydantic import ValidationError
    from pydantic_ai.exceptions import ToolRetryError

    if cause is not None and str(cause).startswith("Unknown tool name"):
        return f"the model called {tool}, a tool this step does not have, {times} times in a row"
    bad_arguments = isinstance(cause, ValidationError) or (
        isinstance(cause, ToolRetryError) and isinstance(cause.tool_retry.content, list)
    )
    problem = _problem(cause, "argument") or "no reason given"
    if bad_arguments:
        return f"the model called {tool} with bad arguments {times} times in a row (last problem: {problem})"
    return f"{tool} failed {times} times in a row (last problem: {problem})"


def _problem(cause: BaseException | None, kind: str) -> str:
    """The last problem behind a retry that ran out, in one line (`kind`: argument or field)."""
    from pydantic import ValidationError
    from pydantic_ai import ModelRetry
    from pydantic_ai.exceptions import ToolRetryError

    text = ""
    if isinstance(cause, ValidationError):
        text = _details(cause.errors(include_url=False), kind)
    elif isinstance(cause, ModelRetry):
        text = cause.message
    elif isinstance(cause, ToolRetryError):
        if cause.__cause__ is not None:
            return _problem(cause.__cause__, kind)
        part = cause.tool_retry
        if getattr(getattr(part, "retry", None), "cause", None) == "no_output":
            return "its reply was empty"
        text = _details(part.content, kind) if isinstance(part.content, list) else str(part.content)
    elif cause is not None:
        text = _without_advice(str(cause))
    text = " ".join(text.split())
    return text if len(text) <= _PROBLEM_CHARS else text[: _PROBLEM_CHARS - 1] + "…"


def _agreeing(whole: str, problem: str) -> str:
    """`problem` ("is not valid JSON (…)") said of `whole`: "its arguments are not valid JSON (…)"."""
    return f"are{problem[2:]}" if whole.endswith("s") and problem.startswith("is ") else problem


def _details(errors: Any, kind: str) -> str:
    """Pydantic error details as `missing argument 'path'; argument 'n': should be text, got a number`.

    In our words (`problem_in_our_words`): pydantic's ("input should be a valid string") and its
    JSON reader's ("invalid JSON: expected ident at line 1 column 2") reached the person before.
    """
    problems = []
    for item in errors[:5]:
        where = ".".join(str(part) for part in item.get("loc", ()))
        if item.get("type") == "missing":
            problems.append(f"missing {kind} {where!r}")
        elif item.get("type") == "extra_forbidden":
            problems.append(f"unexpected {kind} {where!r}")
        elif "type" in item:
            whole = "its arguments" if kind == "argument" else "its answer"
            problem = problem_in_our_words(item)
            said = f"{kind} {where!r}: {problem}" if where else f"{whole} {_agreeing(whole, problem)}"
            problems.append(said)
        else:
            message = _lower_first(str(item.get("msg", "")))
            problems.append(f"{kind} {where!r}: {message}" if where else message)
    return "; ".join(problems)


def _without_advice(message: str) -> str:
    """`message` without its sentences and lines of advice or links (pydantic-ai's, pydantic's)."""
    lines = [line for line in message.splitlines() if not _ADVICE.search(line) or ". " in line]
    sentences = re.split(r"(?<=[.!?])\s+", " ".join(" ".join(lines).split()))
    return " ".join(sentence for sentence in sentences if not _ADVICE.search(sentence)).strip()


def _lower_first(text: str) -> str:
    return text[:1].lower() + text[1:]
