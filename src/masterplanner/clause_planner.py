"""Plans for small models: the structure comes from the task's words, the model fills in the rest.

Measured with the embedded 135M model (issue 14): left to structure a plan itself, it planned
"Write a haiku about the sea to haiku.txt" as four unconnected steps titled with lines of the
poem, with every `agent_role` "1234567890", and on TMDB its plans scored below plans that need no
model (the task as one step; the task cut at its clauses into a chain). So for models whose
profile sets `masterplanner_structured_plans` (`models.local.STRUCTURED_PLANS`), structure is not
asked for:

- one step per clause of the task (`plan_structure.clauses`); a clause that only saves the
  previous clause's result ("save it to out.md") joins that clause's step;
- each step depends on the one before (a chain scored link F1 0.101 on UltraTool without a
  model, against 0.036 for depending only where a clause says "it" or names the file the
  previous one writes);
- its tool is the one that best matches its clause (BM25, `best_tools`): asked to choose among
  its clause's best three, the embedded model scored node F1 0.327 on TMDB against 0.359 for
  the best match, and once the roles were listed too it took the first offered 35 times in 36;
- a step whose tool works on an identifier ("… based on its ID") the clause does not give is
  preceded by one step that finds it, with the best-matching tool that needs none (at most one
  such step per plan, so a plan has at most one step more than the task has clauses);
- its instruction is its clause, word for word, plus "Use the result of <title>." when it
  follows a step; never text the model wrote;
- one model call, held by a JSON-schema grammar to exactly one entry per step, fills in each
  step's `title` (it must start with its clause's first word, then one to five words of letters
  and digits) and `agent_role` (one of the roles of `prompts/planner_roles.json` that best match
  the clause). A title's last words that leave it dangling (an article, a preposition, a
  conjunction: "Write the haiku about autumn to") are dropped, and titles are made distinct
  afterwards by adding a word of the clause. A step's id is its title's words, cut at a word
  within 36 characters and never on a dangling one.

Stored teams shown as examples (`hints`) are not used: the structure needs none, so none of their
content can reach the plan. Hosted and larger models keep the free-form planner (`planner.plan`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .agents import retry_settings, run_agent
from .errors import ModelError, PlanError
from .plan import Plan
from .plan_structure import clauses, named_folders
from .prompts import load_examples, render
from .tools.catalog import Catalog
from .tools.selection import STOP_WORDS, best_tools, rank, words
from .usage import UsageLedger

if TYPE_CHECKING:
    from pydantic_ai.models import Model

__all__ = [
    "LOOKUP_CHOICES",
    "ROLE_CHOICES",
    "ROLE_PATTERN",
    "TITLE_PATTERN",
    "DraftStep",
    "clause_plan",
    "draft_steps",
    "fill_schema",
    "language_caution",
    "needs_identifier",
    "role_candidates",
    "step_clauses",
    "title_pattern",
    "tool_candidates",
    "uses_clause_plans",
]

ROLE_PATTERN = r"^[A-Za-z]+( [A-Za-z]+){0,2}$"
"""An `agent_role`: one to three words of letters (every role offered matches it too)."""
TITLE_PATTERN = r"^[A-Za-z0-9]+( [A-Za-z0-9]+){0,5}$"
"""A `title`: at most six words of letters and digits."""
ROLE_CHOICES = 4
"""How many roles, best matches of its clause first, a step chooses from (and `assistant`)."""
LOOKUP_CHOICES = 5
"""How many of a clause's best-matching tools are searched for one that finds an identifier."""

_FILE = r"[\w./-]*\w\.[A-Za-z][A-Za-z0-9]{0,7}"
_SAVE_ONLY = re.compile(
    rf"(?:save|write|store|put|export|copy|output)\s+"
    rf"(?:(?:it|them|this|that|these|those|everything|(?:the|this|that|your|my)\s+\w+(?:\s+\w+)?)\s+)?"
    rf"(?:to|in|into|as)\s+(?:(?:a|the)\s+file\s+(?:named|called)?\s*)?['\"`]?{_FILE}['\"`]?",
    re.IGNORECASE,
)
_NEEDS_ID = re.compile(
    r"\b(?:by|based on|using|with|given|from|for)\s+(?:its|their|the|a|an)?\s*(?:\w+\s+)?ids?\b",
    re.IGNORECASE,
)
_GIVES_ID = re.compile(r"\bids?\b|\d{3,}", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9]+")


def uses_clause_plans(model: Model) -> bool:
    """Whether `model`'s profile asks for plans built from the task's clauses (small models)."""
    from .models.local import STRUCTURED_PLANS

    return bool(model.profile.get(STRUCTURED_PLANS, False))


def language_caution(task: str) -> str | None:
    """What to tell the person when most of the task's letters are not Latin (None: they are).

    The clause rules and the tool and role matching read English words, and the embedded 135M
    model answers in English. Measured on a Chinese task ("write a short poem about the sea,
    save it to poem.txt", stop 34): the plan was one step with `read_file` and no `write_file`,
    and the run "succeeded" with text that was no poem.
    """
    letters = [char for char in task if char.isalpha()]
    latin = sum(1 for char in letters if unicodedata.name(char, "").startswith("LATIN"))
    if not letters or latin * 2 >= len(letters):
        return None
    return (
        "this model plans from a task's English words and answers in English; this task is "
        "written mostly in another script, so its plan and its answers are likely to make little "
        "sense. Write the task in English, or use a larger model (--model; README, 'Models')"
    )


def step_clauses(task: str, max_steps: int) -> list[str]:
    """The task's clauses as steps: save-only clauses joined to the one before, at most `max_steps`."""
    steps: list[str] = []
    for clause in clauses(task) or [task.strip()]:
        if steps and _SAVE_ONLY.fullmatch(clause.strip()):
            steps[-1] = f"{steps[-1]} and {clause}"
        else:
            steps.append(clause)
    if len(steps) > max_steps:
        steps[max_steps - 1 :] = [", then ".join(steps[max_steps - 1 :])]
    return steps


_ASKED_FOR = {
    "delete_file": re.compile(r"\b(?:delete|remove|erase|clean)", re.IGNORECASE),
    "generate_image": re.compile(
        r"\b(?:image|picture|drawing|illustration|photo|logo|icon|draw)|\.(?:png|jpe?g)\b", re.IGNORECASE
    ),
}
"""Built-in tools a clause gets only when it asks for what they do: measured on the everyday
suite, word overlap gave "Find the largest file in the workspace" and "run it" `delete_file`
("file", "run's workspace") and "Translate hello.txt into French" `generate_image` ("save")."""
_CLAUSE_TOOLS = (
    (re.compile(r"\b(?:run|execute)\b", re.IGNORECASE), "code_execution"),
    (re.compile(r"\bfiles?\b.*\bworkspace\b|\bworkspace\b.*\bfiles?\b", re.IGNORECASE), "list_files"),
)
"""Built-in tools a clause's words call for outright ("run it": the code it wrote; "the files
in the workspace": their list), before any match of descriptions."""
_ABOUT_EACH = re.compile(r"\b(?:about|describe|describing|summari[sz]e)\s+(?:each|every)\b", re.IGNORECASE)
"""A clause about each of several files ("Describe each file in the workspace", "one sentence
about each") also gets `read_file`: what a file is about is in it, not in its name (the embedded
model, given trip.csv's name alone, described a trip to the Amazon)."""


def tool_candidates(clause: str, catalog: Catalog, limit: int) -> list[str]:
    """The `limit` tools that best match `clause`, best first.

    Tools the clause calls for outright (`_CLAUSE_TOOLS`, and `list_files` for a clause about
    the files of a folder: `plan_structure.named_folders`) come first; then the best matches of
    the tools' descriptions, leaving out tools the clause shares no word with and those that
    it does not ask for (`_ASKED_FOR`).
    """
    called = [tool for pattern, tool in _CLAUSE_TOOLS if tool in catalog and pattern.search(clause)]
    if "list_files" in catalog and named_folders(clause):  # "the three files in ./notes": their list
        called = list(dict.fromkeys(["list_files", *called]))
    wanted = set(words(clause))
    matched = [
        name
        for name in best_tools(clause, catalog, limit + len(_ASKED_FOR))
        if wanted & set(words(name) + words(catalog[name].description))
        and (name not in _ASKED_FOR or _ASKED_FOR[name].search(clause))
    ]
    return list(dict.fromkeys([*called, *matched]))[:limit]


def needs_identifier(tool: str, catalog: Catalog) -> bool:
    """Whether the tool's description says it works on an identifier ("… based on its ID")."""
    return bool(_NEEDS_ID.search(catalog[tool].description))


@dataclass(frozen=True)
class DraftStep:
    """A step before the model fills it in: its text (the instruction) and its tools."""

    text: str
    tools: list[str]


def draft_steps(task: str, catalog: Catalog, max_steps: int) -> list[DraftStep]:
    """The plan's steps in order, from the task's clauses, each with its best-matching tool.

    A clause that names a file to read gets `read_file`, one that writes to a file ("… to
    summary.txt") `write_file`; one about the files of a folder ("the three files in ./notes",
    "the files") `list_files` and `read_file`: planned with `read_file` alone, the embedded
    model's step could find none of them and wrote a summary of nothing. At most one step is
    added to the clauses' (when `max_steps` leaves room), the first that applies of:

    - a step that finds the identifier a step's tool needs ("… based on its ID") when its clause
      gives none, with the best-matching tool that needs none;
    - a step that reads the file a file-to-file clause works on ("Summarize article.txt to
      summary.txt" becomes "Read article.txt", then the clause with `write_file` alone): measured
      with the embedded model, a step given both tools read the file and then answered with the
      tool call's text instead of writing; split, the read is the file itself (`DirectCall`) and
      the write is drafted from it (`DraftedWrite`).
    """
    texts = step_clauses(task, max_steps)
    drafts: list[DraftStep] = []
    added = len(texts) >= max_steps
    for position, text in enumerate(texts):
        tools = tool_candidates(text, catalog, 1)
        if not added and tools and needs_identifier(tools[0], catalog) and not _GIVES_ID.search(text):
            finders = [
                name
                for name in tool_candidates(text, catalog, LOOKUP_CHOICES)
                if not needs_identifier(name, catalog)
            ]
            if finders:
                drafts.append(DraftStep(f"Find what this needs: {text}", finders[:1]))
                added = True
        writes = _written_files(text, follows=position > 0)
        reads = [name for name in _read_files(text) if name not in writes]
        file_work = not tools or set(tools) <= _FILE_TOOLS
        if (
            not added
            and reads
            and writes
            and file_work
            and "read_file" in catalog
            and "write_file" in catalog
        ):
            drafts += [DraftStep(f"Read {reads[0]}", ["read_file"]), DraftStep(text, ["write_file"])]
            added = True
            continue
        # what each of several files is about is in the files ("one sentence about each"), as
        # is what the files of a folder hold ("summarise the three files in ./notes")
        about_files = reads or _ABOUT_EACH.search(text) or named_folders(text)
        wanted = {"read_file": bool(about_files), "write_file": bool(writes)}
        tools = [*tools, *(t for t, on in wanted.items() if on and t in catalog and t not in tools)]
        drafts.append(DraftStep(text, tools))
    return drafts


def role_candidates(clause: str, tools: Sequence[str], limit: int = ROLE_CHOICES) -> list[str]:
    """Roles from `prompts/planner_roles.json` that best match the clause (else its tools), then `assistant`.

    Left free to name a role, the embedded model wrote "write to file", "compute" or a tool's
    name; from a list it takes the first entry, so the list is ranked for the step (BM25).
    """
    roles = {
        item["role"]: words(f"{item['role']} {item['about']}") for item in load_examples("planner_roles.json")
    }
    ranked: list[str] = []
    for query in (clause, " ".join(tools)):
        wanted = set(words(query))
        ranked = [role for role in rank(query, roles) if wanted & set(roles[role])][:limit]
        if ranked:
            break
    return [*ranked, "assistant"] if "assistant" not in ranked else ranked


def title_pattern(clause: str) -> str:
    """`TITLE_PATTERN`, held to start with the clause's first word (its verb, mostly).

    Free to title a step, the embedded model wrote "The sea is a great place" for "Write a haiku
    about the sea to haiku.txt"; made to start with "Write", it wrote "Write the haiku about the sea".
    """
    first = _WORD.match(clause.strip())
    if first is None:
        return TITLE_PATTERN
    word = first.group()
    return rf"^{word[:1].upper()}{word[1:]}( [A-Za-z0-9]+){{1,5}}$"


def fill_schema(titles: Sequence[str], roles: Sequence[Sequence[str]]) -> dict[str, Any]:
    """The schema the model fills in: exactly one entry per step, with its title pattern and roles.

    Under a grammar, a role of digits or a title that is a line of prose cannot be written.
    """
    entries = [
        {
            "type": "object",
            "properties": {
                "title": {"type": "string", "pattern": title},
                "agent_role": {"type": "string", "pattern": ROLE_PATTERN, "enum": list(choices)},
            },
            "required": ["title", "agent_role"],
            "additionalProperties": False,
        }
        for title, choices in zip(titles, roles, strict=True)
    ]
    steps = {"type": "array", "prefixItems": entries, "minItems": len(entries), "maxItems": len(entries)}
    return {
        "type": "object",
        "title": "Steps",
        "properties": {"steps": steps},
        "required": ["steps"],
        "additionalProperties": False,
    }


def _fill_problems(fills: object, titles: Sequence[str], roles: Sequence[Sequence[str]]) -> list[str]:
    """What is wrong with the model's fill-in (possible only without a grammar: scripted, hosted)."""
    if not isinstance(fills, list) or len(fills) != len(titles):
        entries = "1 entry" if len(titles) == 1 else f"{len(titles)} entries"
        return [f"steps: give exactly {entries}, one per step"]
    problems = []
    for number, (fill, title, choices) in enumerate(zip(fills, titles, roles, strict=True), start=1):
        if not isinstance(fill, dict):
            problems.append(f"step {number}: expected an object with title and agent_role")
            continue
        if not re.fullmatch(title, str(fill.get("title", ""))):
            first = title.removeprefix("^").split("(")[0]
            problems.append(
                f"step {number}: title: {first} and at most five more words of letters and digits"
            )
        if fill.get("agent_role") not in choices:
            problems.append(f"step {number}: agent_role: one of {', '.join(choices)}")
    return problems


def _sentence(text: str) -> str:
    text = text.strip()
    text = text[:1].upper() + text[1:]
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _key_words(text: str) -> list[str]:
    """Words of a step's text that could tell two titles apart, likeliest first (files, then last words)."""
    files = [re.sub(r"\W+", " ", name).split()[0] for name in re.findall(_FILE, text)]
    plain = [word for word in _WORD.findall(text) if word.lower() not in STOP_WORDS and len(word) > 2]
    return list(dict.fromkeys([*files, *reversed(plain)]))


def distinct_titles(titles: Sequence[str], texts: Sequence[str]) -> list[str]:
    """`titles` with repeats told apart by a word of their step's text (or a number), still six words."""
    taken: set[str] = set()
    result = []
    for title, text in zip(titles, texts, strict=True):
        candidate = title
        extras = [word for word in _key_words(text) if word.lower() not in title.lower().split()]
        for extra in [*extras, *(str(number) for number in range(2, 100))]:
            if candidate.lower() not in taken:
                break
            candidate = " ".join([*title.split()[:5], extra])
        taken.add(candidate.lower())
        result.append(candidate)
    return result


_DANGLING = frozenset(
    """a an the and or but nor then so to into onto in on at of for from by with about as over under
    than via per its their his her my our your this that these those""".split()
)
"""Words a title or an id never ends on: cut after them, it reads as a clause cut short."""
_SLUG_CHARS = 36


def _without_dangling(words: Sequence[str]) -> list[str]:
    """`words` without the articles, prepositions and conjunctions that end them (the first word kept)."""
    kept = list(words)
    while len(kept) > 1 and kept[-1].lower() in _DANGLING:
        kept.pop()
    return kept


def _trimmed_title(title: str) -> str:
    """The model's title without a dangling last word: "Write the haiku about autumn to" ends on "autumn".

    The title pattern lets the model stop after any word, and at its six words it stopped on "to".
    """
    return " ".join(_without_dangling(title.split())) or title


def _slug_base(title: str) -> str:
    """The title's words joined by "-", cut at a word within 36 characters, not on a dangling one."""
    kept: list[str] = []
    for word in _WORD.findall(title.lower()):
        if len("-".join([*kept, word])) > _SLUG_CHARS:
            break
        kept.append(word)
    if not kept:  # one word over the limit
        return "-".join(_WORD.findall(title.lower()))[:_SLUG_CHARS].strip("-") or "step"
    return "-".join(_without_dangling(kept))


def _slugs(titles: Sequence[str]) -> list[str]:
    taken: set[str] = set()
    slugs = []
    for title in titles:
        base = _slug_base(title)
        slug, number = base, 2
        while slug in taken:
            slug, number = f"{base}-{number}", number + 1
        taken.add(slug)
        slugs.append(slug)
    return slugs


_FILE_TOOLS = {"read_file", "write_file", "list_files"}
_WRITTEN = re.compile(rf"\b(?:to|into|as)\s+['\"`]?({_FILE})", re.IGNORECASE)


_LAST_IN = re.compile(rf"\bin\s+['\"`]?({_FILE})['\"`]?[.!]?\s*$", re.IGNORECASE)
_WRITING = re.compile(r"^\s*(?:write|save|put|store|record|create|make|draft|compose)\b", re.IGNORECASE)


def _written_files(text: str, *, follows: bool = False) -> list[str]:
    """Files the text writes to: "to/into/as FILE", and sometimes a last "in FILE".

    A last "in FILE" is written after another file, after a writing verb, or in a clause that
    works on the one before it (`follows`):
    "Translate greeting.txt to Spanish in greeting_es.txt", "Write a note …, in note.txt" and
    "…, then translate the summary into French in resume.txt" write to their last file;
    "Summarize the complaint in email.txt" reads its only one.
    """
    written = _WRITTEN.findall(text)
    last = _LAST_IN.search(text)
    if last is not None:
        before = re.findall(_FILE, text[: last.start()])
        if before or follows or _WRITING.match(text):
            written.append(last.group(1))
    return list(dict.fromkeys(written))


def _read_files(text: str) -> list[str]:
    """Files the text names but does not write to."""
    written = set(_written_files(text))
    return [name for name in dict.fromkeys(re.findall(_FILE, text)) if name not in written]


def build_steps(drafts: Sequence[DraftStep], fills: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Public-form steps: instructions from the clauses, a chain of dependencies, the model's fill-ins."""
    titles = distinct_titles(
        [_trimmed_title(str(fill["title"])) for fill in fills], [draft.text for draft in drafts]
    )
    ids = _slugs(titles)
    steps = []
    for index, (draft, fill) in enumerate(zip(drafts, fills, strict=True)):
        instruction = _sentence(draft.text)
        if index:
            instruction = f"{instruction} Use the result of {titles[index - 1]}."
        tools = list(draft.tools)
        steps.append(
            {
                "id": ids[index],
                "title": titles[index],
                "instruction": instruction[:4000],
                "agent_role": str(fill["agent_role"]),
                "tools": tools,
                "depends_on": [ids[index - 1]] if index else [],
                "expected_output": "",
            }
        )
    return steps


async def clause_plan(
    task: str,
    catalog: Catalog,
    *,
    model: Model,
    accept: Callable[[object], Plan],
    ledger: UsageLedger | None = None,
    max_steps: int,
    repairs: int,
) -> Plan:
    """Plan `task` (already validated) from its clauses; `accept` validates the public-form steps.

    One `planner` call fills in every step. A fill-in that breaks the schema (possible only
    without a grammar) goes back to the model with its problems, and a reply cut off at the
    output limit is asked for again, sampled; each at most `repairs` times.
    """
    from pydantic_ai import Agent, ModelRetry, NativeOutput, StructuredDict
    from pydantic_ai.exceptions import OutputTokenLimitExceeded, UnexpectedModelBehavior

    from .models import labelled

    drafts = draft_steps(task, catalog, max_steps)
    titles = [title_pattern(draft.text) for draft in drafts]
    roles = [role_candidates(draft.text, draft.tools) for draft in drafts]
    output: Any = StructuredDict(
        fill_schema(titles, roles), name="steps", description="each step's title and role"
    )
    if model.profile.get("supports_json_schema_output", False):
        output = NativeOutput(output)
    agent: Agent[None, dict[str, Any]] = Agent(
        labelled(model, "planner", ledger or UsageLedger()),
        output_type=output,
        instructions=render("planner_clauses.j2"),
        retries=repairs,
    )
    accepted: list[Plan] = []
    last_problems: list[str] = []

    @agent.output_validator
    def check(output: dict[str, Any]) -> dict[str, Any]:
        fills = output.get("steps")
        problems = _fill_problems(fills, titles, roles)
        if not problems:
            assert isinstance(fills, list)
            try:
                accepted.append(accept(build_steps(drafts, fills)))
            except PlanError as error:
                problems = error.problems
        if problems:
            last_problems[:] = problems
            raise ModelRetry(render("planner_repair.j2", problems=problems))
        return output

    shown = [(draft.text, step_roles) for draft, step_roles in zip(drafts, roles, strict=True)]
    prompt = render("planner_clauses_user.j2", task=task, steps=shown)
    for attempt in range(repairs + 1):
        try:
            # A title's words have no length bound in the grammar (bounded repeats cost more
            # grammar states per token), so a reply can run to the output cap: ask again, sampled.
            await run_agent(agent, prompt, model_settings=retry_settings(attempt) if attempt else {})
            break
        except ModelError as error:
            if last_problems and isinstance(error.__cause__, UnexpectedModelBehavior):
                raise PlanError(last_problems, context=f"no valid plan after {repairs} repairs") from None
            if not isinstance(error.__cause__, OutputTokenLimitExceeded) or attempt == repairs:
                raise
    return accepted[-1]
