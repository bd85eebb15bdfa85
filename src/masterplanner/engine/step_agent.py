"""What a step agent is given: its prompt, a brief with its dependencies' outputs, its tools, its model."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache, partial
from pathlib import Path
from typing import cast

from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.output import OutputObjectDefinition
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RequestUsage

from ..errors import RunError, ToolError
from ..models import context_window
from ..models.labelled import made_and_failed
from ..models.local import STRUCTURED_PLANS, ToolAids
from ..models.pricing import request_cost
from ..plan import Plan, Step, sinks
from ..plan_structure import named_folders
from ..prompts import load_examples, render
from ..purpose import current_purpose
from ..tools.code_execution import succeeded_output
from ..tools.results import TOOL_FAILED, TOOL_OUTPUT
from ..tools.workspace import Workspace
from ..working_memory import INPUT_HEADING, ContextBudget, FittedInput, estimated_tokens, untrimmed
from .budget import RequestBudget, Reservation, RunLedger, reservation_for
from .file_questions import (
    CountedFile,
    FolderFiles,
    FolderReading,
    FolderTexts,
    ListingQuestion,
    counted_file,
    listing_question,
)
from .records import RunOptions
from .table_queries import DraftedQuery, drafted_query

__all__ = [
    "BudgetedModel",
    "DirectCall",
    "DraftedWrite",
    "PaidToolCalls",
    "StepAids",
    "context_budget",
    "dependency_context",
    "direct_call",
    "drafted_write",
    "grounding_call",
    "listed_names",
    "mentioned_file_names",
    "program_text",
    "resolved_references",
    "shape_text",
    "step_brief",
    "step_instructions",
    "tool_aids",
    "written_tool_call",
]

_UNGROUNDED_CALLS = 2
"""Tool calls (failed ones included) after which an ungrounded small model must answer."""
MAX_EACH = 20
"""A text with a line for each file is written for at most this many files (a model request each)."""
EACH_CONTENT_CHARS = 400
"""Of each file a text has a line about, the model is shown this much."""
MAX_TRANSLATED_LINES = 60
"""A translation is asked for at most this many lines of its input (a model request a sentence)."""
MAX_COUNTED_LINES = 50
"""A text with "that many lines" is held to a count it is given up to this."""

_FILE_NAME = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w/-])")


def mentioned_file_names(*texts: str) -> tuple[str, ...]:
    """File names like `haiku.txt` or `out/report.md` that the texts mention, in order, without repeats."""
    names: dict[str, None] = {}
    for text in texts:
        for match in _FILE_NAME.finditer(text):
            name = match.group(1)
            if not re.fullmatch(r"\d+\.\d+", name):
                names.setdefault(name, None)
    return tuple(names)


_WRITTEN_CALL = re.compile(r'\s*\{\s*"(?:tool|name)"\s*:\s*"([A-Za-z0-9_-]+)"\s*,\s*"(?:arguments|args)"\s*:')


def written_tool_call(text: str, tools: Sequence[str]) -> str | None:
    """The tool an answer calls in words (`{"tool": "read_file", "arguments": …}`), or None.

    A model that writes a call as its answer instead of making it (the embedded one did, for a
    task in Chinese) ended its step "succeeded" with that text as the output. Only the step's
    own tools count: an answer that is JSON with a `tool` field of another kind is an answer.
    """
    found = _WRITTEN_CALL.match(text)
    return found[1] if found is not None and found[1] in tools else None


def listed_names(text: str) -> list[str]:
    """The file names a text lists one a line (a `list_files` listing's files, or plain names), else none.

    Every non-blank line must be a file name (or a listing's line of a file): otherwise the text
    is not a list of files, and nothing is returned.
    """
    names: list[str] = []
    for line in (line.strip() for line in text.splitlines()):
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) == 3 and fields[1] != "file":
            continue  # a directory or link of a listing
        name = fields[0].strip().lstrip("-*\u2022 ").strip()
        if not _FILE_NAME.fullmatch(name):
            return []
        names.append(name)
    return names


@dataclass(frozen=True)
class DraftedWrite:
    """A step aid: the step's text file is written from the model's plain answer, not a tool call.

    Measured with the embedded 135M model: asked to call `write_file` with a haiku as `content`,
    it wrote one prose sentence into haiku.txt. Asked for the text alone in a short prompt (the
    request and, for a poem, its form: "A haiku is three short lines."), it writes lines of verse;
    `shape_text` holds them to the form, and the engine then calls `write_file` itself, through
    the step's normal tool path (approval policy, checkpoint, `tool_called` / `tool_result`).
    """

    path: str
    """The file to write (one the step names that does not exist yet)."""
    request: str
    """What to write: the step's instruction without the file and the save instruction."""
    form: str = ""
    """A note on the form, e.g. "A haiku is three short lines."."""
    lines: int | None = None
    """The form's line count (the text is cut or split to it)."""
    sentences: int | None = None
    """The form's sentence count (the text is cut to it)."""
    language: str = ""
    """For a program file (`.py`, `.sh`): its language; the model is asked for the program alone."""
    numbered: bool = False
    """The form is a numbered list ("as a short numbered list"): one item per line, numbered."""
    counted_lines: bool = False
    """The text has as many lines as the number it is given ("a poem with that many lines")."""
    translate_to: str = ""
    """The text is its one input translated into this language ("Translate hello.txt into
    French"), a sentence at a time, after example pairs (`prompts/translation_examples.json`).
    Asked for the whole text, the 135M model wrote French of its own ("Je suis le début de la
    nuit") or copied the English; a sentence at a time after examples, it gets short common
    sentences right ("Bonjour.", "Hola, mi amigo.") and longer ones still wrong."""
    labelled: str = ""
    """The text is the lines of its one input that this label opens ("Decision: …"): asked for
    "the three decisions recorded in meeting.txt", the 135M model copied the whole of the notes.
    Only lines the label opens are taken (a line that mentions it in passing, "no decision
    needed", is not one); with none, the text is drafted."""
    each: bool = False
    """The text has a line for each file it is given ("one sentence about each", "describe each
    file"): the model writes one sentence per file, asked about that file alone, and the line
    names it. Asked for all of them at once, the 135M model copied the listing."""
    copy: bool = False
    """The request writes a result it refers to ("write only the total", "write its name", "… and
    write it"): the file gets that result as it is when it is one line (the step's own query's
    one value, or its one input), with no model call. The 135M model, given "COUNT(*) = 4" and
    "write the count", wrote "This is a count that counts the number of people …"."""


@dataclass(frozen=True)
class DirectCall:
    """A step aid: a step that only reads a file, or only lists the workspace, is that tool's result.

    No model call is made for it.

    Measured with the embedded 135M model on "Read notes.txt": it called `read_file` (held to it
    by the grammar) and then answered with a sentence about the task instead of the notes, so the
    next step summarised nothing; on "List the files in the workspace" it called `list_files`
    with a made-up path. Here the engine makes the one call through the normal tool path and the
    step's result is what it returned. "Run it." after a step that wrote `hello.py` is the same:
    `code_execution` of that one script (the model asked to run it wrote a program of its own).

    Not for a step whose prompt a person wrote (edited at review, or the prompt of a reused agent
    a person wrote: `AgentBrief.persons_prompt`): with no model turn, the prompt would be ignored
    (it may say what to do with what is read, or that the script must not run), so the model
    works under it and makes its calls itself.
    """

    tool: str
    arguments: dict[str, str]


Grounding = DirectCall | DraftedQuery | ListingQuestion | CountedFile | FolderFiles
"""A call the engine makes before the model works (see `StepAids.grounding`)."""


@dataclass(frozen=True)
class StepAids(ToolAids):
    """`ToolAids` and the step aids that need more than a grammar (only for small models)."""

    drafted_write: DraftedWrite | None = None
    direct_call: DirectCall | None = None
    grounding: Grounding | None = None
    """A call the engine makes first so the model works from what it returned: the workspace's
    listing for "Describe each file in the workspace …" (the 135M model, left to call
    `list_files` itself, gave it a made-up path and answered from nothing), the SQL query that
    computes what the step asks of a CSV file (`table_queries`), or the call whose result
    answers a question about files (`file_questions`: how many, the largest, those of a type), or
    the listing of the folder whose files the step works on (`FolderFiles`), which are then read."""
    reads_each: bool = False
    """The step may read files: a text about each of several files is drafted from their contents
    (read by one `read_file` call each, before the drafts), not from their names alone."""
    prompt: str = ""
    """The step's prompt when a person wrote it (edited at review, or a reused agent's prompt a
    person wrote: `AgentBrief.persons_prompt`), else empty. A drafted text is asked without the
    agent's prompt (the short draft request is what the 135M model follows), so an edit would
    never reach the model: every text drafted for the step is asked with that prompt in its
    system text, and none is copied or taken from labelled lines in its stead."""


_TEXT_FILE = re.compile(r"\.(?:txt|md|markdown|rst|text)$", re.IGNORECASE)
_PROGRAM_FILES = {".py": "python", ".sh": "bash"}
"""Program files whose text is drafted as a program, by extension, and the language that runs them."""


def _program_language(name: str) -> str:
    return _PROGRAM_FILES.get(Path(name).suffix.lower(), "")


_FORMS = (
    (re.compile(r"\bhaikus?\b", re.IGNORECASE), "A haiku is three short lines.", 3, None),
    (re.compile(r"\blimericks?\b", re.IGNORECASE), "A limerick is five lines.", 5, None),
    (re.compile(r"\b(?:one|single)[- ]sentence\b|\bin one sentence\b", re.IGNORECASE), "", None, 1),
)
_NUMBERED = re.compile(r"\bnumbered\s+list\b", re.IGNORECASE)
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6}
_SENTENCES = re.compile(
    r"\b(one|two|three|four|five|six)(?:\s+or\s+(one|two|three|four|five|six))?[- ]sentences?\b",
    re.IGNORECASE,
)
_TRANSLATE = re.compile(r"\btranslat(?:e|es|ed|ing|ion)\b", re.IGNORECASE)
_INTO = re.compile(r"\b(?:in|into|to)\s+([A-Za-z]+)\b", re.IGNORECASE)


@cache
def _translation_examples() -> dict[str, list[tuple[str, str]]]:
    """Example pairs (English, the language) by language, shown before each sentence to translate."""
    return {
        entry["language"]: [(english, other) for english, other in entry["pairs"]]
        for entry in load_examples("translation_examples.json")
    }


_PICKED = re.compile(
    r"^(?:write|list|copy|extract|collect|put)\s+(?:down\s+)?(?:all\s+|only\s+)?(?:the\s+)?(?:\w+\s+)?"
    r"(?P<noun>[a-z]+?)s\s+(?:that\s+are\s+|that\s+were\s+)?(?:recorded|listed|noted|written|made|taken)\s+"
    r"(?:in|from)\s+\S+\.\w+\s*[.!]?$",
    re.IGNORECASE,
)
_THAT_MANY_LINES = re.compile(r"\b(?:that|as)\s+many\s+lines\b", re.IGNORECASE)
_EACH = re.compile(r"\b(?:about|describe|describing|for)\s+(?:each|every)\b", re.IGNORECASE)
_EACH_OBJECT = re.compile(
    r"\b(?:each|every)\b(?:\s+of)?(?:\s+(?:the|these|those))?(?:\s+[\w.]+)?\s+files?\b"
    r"(?:\s+(?:in|of|from)\s+(?:(?:the|this)\s+workspace|\./[\w/-]*\w/?|[\w-]+(?:/[\w-]+)*/"
    r"|the\s+[\w-]+\s+(?:folder|directory)))?|\b(?:each|every)(?:\s+(?:one|item|file))?\b",
    re.IGNORECASE,
)
_SAVE_CLAUSE = re.compile(r"\s+(?:and|then)\s+(?:save|write|put|store)\b[^.]*", re.IGNORECASE)
_SAVE_NOTE = re.compile(r"\s*Save the result to [^.]*? with write_file\.")
_USE_NOTE = re.compile(r"\s*Use the result of [^.]*\.")


_PROGRAM_WORDS = r"(?:\w+\s+){0,2}(?:script|program|file|code)"
_COPY = re.compile(
    r"(?:^|\band\s+|,\s*)write\s+(?:only\s+|just\s+)?(?:it|its\s+\w+|the\s+(?:\w+\s+)?"
    r"(?:total|count|number|sum|average|mean|result|name|answer|value))\s*[.!]?$",
    re.IGNORECASE,
)


_OBJECT = re.compile(
    r"^\s*[A-Za-z]+\s+(?P<object>the\s+[^,;]+?)(?:\s+(?:and|then|to|into)\b.*)?[.!]?\s*$", re.I
)
_REFERENCES = (
    (re.compile(r"\b(?:their|its)\s+(names?)\b", re.IGNORECASE), r"the \1 of {object}"),
    (re.compile(r"\beach\b(?!\s+(?:of|one)\b)", re.IGNORECASE), "each of {object}"),
    (re.compile(r"\b(?:it|them)\b", re.IGNORECASE), "{object}"),
)


def resolved_references(request: str, before: str) -> str:
    """`request` with "it", "them", "their names", "each" naming what the step before it worked on.

    "Write a sentence about it." after "Compute the total of the amount column in expenses.csv."
    becomes "Write a sentence about the total of the amount column in expenses.csv."; the
    135M model, asked to write "a sentence about it" from "246.75", wrote about something else.
    Only a step before whose instruction is a verb and a definite object ("the …") is used.
    """
    found = _OBJECT.match(_USE_NOTE.sub("", before))
    if found is None:
        return request
    thing = found["object"].strip()
    for pattern, replacement in _REFERENCES:
        if pattern.search(request):
            return pattern.sub(replacement.format(object=thing.replace("\\", "\\\\")), request, count=1)
    return request


def drafted_write(
    step: Step, tools: Sequence[str], fresh: Sequence[str], before: Sequence[str] = ()
) -> DraftedWrite | None:
    """The drafted-write aid for a step that must write one new text or program file, else None.

    A text file is named after "to", "into", "as" or "in" ("… to haiku.txt"); a program file
    after what it is ("a Python script hello.py", "the program primes.py"). A step that writes a
    program drafts the program, even when it names the file the program writes. With one step
    `before` it, what its text refers to ("it", "their names") is named (`resolved_references`).
    """
    if "write_file" not in tools:
        return None
    targets = [
        name
        for name in fresh
        if _TEXT_FILE.search(name)
        and re.search(rf"\b(?:to|into|as|in)\s+['\"`]?{re.escape(name)}", step.instruction)
    ]
    programs = [
        name
        for name in fresh
        if _program_language(name)
        and re.search(rf"\b(?:a|an|the)\s+{_PROGRAM_WORDS}\s+['\"`]?{re.escape(name)}", step.instruction)
    ]
    request = _USE_NOTE.sub("", _SAVE_NOTE.sub("", step.instruction))
    if len(programs) == 1:  # a text file it names is the program's to write ("… to primes.txt")
        return DraftedWrite(programs[0], request.strip(), language=_program_language(programs[0]))
    if len(targets) != 1 or programs:
        return None
    path = targets[0]
    request = re.sub(
        rf"\s+(?:to|into|as|in)\s+(?:(?:a|the)\s+file\s+(?:named|called\s+)?)?['\"`]?{re.escape(path)}['\"`]?",
        "",
        request,
    ).strip()
    request = re.sub(r"[,;:]\s*([.!?])$", r"\1", request)  # "…, one per line, to fruits.txt." lost its file
    request = request if request.endswith((".", "!", "?")) else f"{request.rstrip(',;: ')}."
    if _TRANSLATE.search(request):  # "… into French": a language there are examples of
        languages = [word.capitalize() for word in _INTO.findall(request)]
        known = [language for language in languages if language in _translation_examples()]
        if known:
            return DraftedWrite(path, request, translate_to=known[0])
    if (picked := _PICKED.match(request)) is not None:
        return DraftedWrite(path, request, labelled=picked["noun"].lower())
    if _EACH.search(request):
        if len(before) == 1:
            request = resolved_references(request, before[0])
        return DraftedWrite(path, request, each=True)
    for pattern, form, lines, sentences in _FORMS:
        if pattern.search(request):
            return DraftedWrite(path, request, form, lines, sentences)
    if _NUMBERED.search(request):
        return DraftedWrite(path, request, "Put each item on its own line: 1., 2., 3.", numbered=True)
    if _THAT_MANY_LINES.search(request):
        return DraftedWrite(path, request, counted_lines=True)
    # "Translate it into Klingon and write it" is no copy, even in a language without examples
    copy = _COPY.search(request) is not None and not _TRANSLATE.search(request)
    if len(before) == 1:
        request = resolved_references(request, before[0])
    counted = _SENTENCES.search(request)
    if counted is not None:  # "in two or three sentences": at most the larger count
        most = max(_NUMBERS[word.lower()] for word in counted.groups() if word)
        return DraftedWrite(path, request, sentences=most)
    return DraftedWrite(path, request, copy=copy)


_READ_ONLY = re.compile(
    r"(?:read|load|open)\s+(?:the\s+)?(?:file\s+)?['\"`]?(?P<path>[\w./-]*\w)['\"`]?(?:\s+file)?[.!]?",
    re.IGNORECASE,
)


_LIST_ONLY = re.compile(
    r"(?:list|show)\s+(?:all\s+)?(?:the\s+)?(?:\w+\s+)?files\s+(?:in|of)\s+(?:the|this)\s+workspace[.!]?",
    re.IGNORECASE,
)


_RUN_ONLY = re.compile(
    r"(?:run|execute|test)\s+(?:it|(?:the|this|that)\s+(?:\w+\s+)?(?:script|program|code)"
    r"|['\"`]?(?P<path>[\w./-]*\w)['\"`]?)[.!]?",
    re.IGNORECASE,
)
_RUN_COMMANDS = {"python": "python3", "bash": "bash"}


def direct_call(
    step: Step, tools: Sequence[str], existing: Sequence[str], programs: Sequence[str] = ()
) -> DirectCall | None:
    """The direct-call aid for a step that only reads an existing file, lists the workspace or runs a script.

    The instruction (without its "Use the result of …" note) must be just "Read FILE.", "List the
    files in the workspace." or "Run it." / "Run FILE." / "Run the script."; `programs` are the
    existing program files the step may mean by "it" (one, or the aid does not apply).
    """
    instruction = _USE_NOTE.sub("", step.instruction).strip()
    match = _READ_ONLY.fullmatch(instruction)
    if "read_file" in tools and match is not None and match["path"] in existing:
        return DirectCall("read_file", {"path": match["path"]})
    if "list_files" in tools and _LIST_ONLY.fullmatch(instruction):
        return DirectCall("list_files", {})
    run = _RUN_ONLY.fullmatch(instruction)
    if "code_execution" in tools and run is not None:
        named = [run["path"]] if run["path"] else list(dict.fromkeys(programs))
        if len(named) == 1 and named[0] in existing and (language := _program_language(named[0])):
            command = f"{_RUN_COMMANDS[language]} {shlex.quote(named[0])}"
            return DirectCall("code_execution", {"language": "bash", "code": command})
    return None


_WORKSPACE_FILES = re.compile(
    r"\b(?:files?\s+(?:in|of)\s+(?:the|this)\s+workspace|workspace(?:'s)?\s+files|each\s+file)\b",
    re.IGNORECASE,
)


_SUMMING_UP = re.compile(r"^\s*(summari[sz]e|describe|outline)\b", re.IGNORECASE)
"""A request about a folder's files that is a line per file (`_per_file`)."""


def _content_folder(instruction: str, workspace: Workspace, request: str) -> FolderFiles | None:
    """The folder whose files the instruction works on (`plan_structure.named_folders`), if any.

    A folder the workspace has counts. One it does not have counts only when the words make it a
    folder ("./notes", "notes/", "the notes folder") and the request sums its files up
    ("summarise …", `_SUMMING_UP`): listing it then fails the step, where a summary would be
    invented. Otherwise it is no folder to read ("Explain the purpose of the node_modules
    folder", "save the results into out/"): before, such steps failed listing it.
    """
    for folder in named_folders(instruction):
        if workspace.is_dir(folder.path) or (folder.certain and _SUMMING_UP.match(request)):
            return FolderFiles(folder.path)
    return None


def _per_file(draft: DraftedWrite) -> DraftedWrite:
    """A summary of a folder's files as a line about each ("Summarise each file in one sentence.").

    Only a request with no form of its own ("summarise the three files in ./notes"): the 135M
    model, asked about several files at once, copied what it was shown (see `DraftedWrite.each`).
    """
    verb = _SUMMING_UP.match(draft.request)
    if verb is None or draft != DraftedWrite(draft.path, draft.request):
        return draft
    return DraftedWrite(draft.path, f"{verb[1].capitalize()} each file in one sentence.", each=True)


def grounding_call(step: Step, tools: Sequence[str]) -> DirectCall | None:
    """The listing a step about the workspace's files is given first ("Count the files in the workspace")."""
    if "list_files" in tools and _WORKSPACE_FILES.search(step.instruction):
        return DirectCall("list_files", {})
    return None


def _sizes(workspace: Workspace, files: Sequence[str]) -> dict[str, int]:
    """The sizes in bytes of `files` in the workspace (0: not a file now)."""
    return {name: workspace.file_size(name) or 0 for name in files}


def tool_aids(
    plan: Plan, step: Step, tools: list[str], workspace: Workspace, *, prompt: str = ""
) -> ToolAids | None:
    """Tool-use aids for a small local model, grounded in the step's text and the workspace's files.

    The file names the step mentions (and, for a step nothing depends on, the task) split in two:
    those that exist may be read, those that do not may be written. The first call must be one
    of those reads or writes; with nothing grounded, the model only has to answer after a few
    tool calls (failed ones count). A step whose instruction only reads an existing file, or only
    lists the workspace, gets a `DirectCall`; one that asks to write one new text file, and names
    no existing file it could read itself, gets a `DraftedWrite` (both applied only for models
    whose profile sets `masterplanner_structured_plans`). A text about the files of a folder
    ("summarise the three files in ./notes into summary.md") is drafted from what they hold:
    the folder is listed and its files read first (`FolderFiles`); a step that cannot list and
    read them gets no drafted text (it would be drafted from nothing). `prompt`: the step's
    prompt when a person wrote it (`StepAids.prompt`); such a step gets no `DirectCall`.
    """
    texts = [step.title, step.instruction, step.expected_output]
    if step.id in sinks(plan.steps):
        texts.append(plan.task)
    names = mentioned_file_names(*texts)
    existing = tuple(name for name in names if workspace.is_file(name))
    fresh = tuple(name for name in names if name not in existing)
    values: dict[str, dict[str, tuple[str, ...]]] = {}
    if existing and "read_file" in tools:
        values["read_file"] = {"path": existing}
    if fresh and "write_file" in tools:
        values["write_file"] = {"path": fresh}
    # A step that names a file it can read must read it; one that cannot (a clause plan's write
    # after its read step) has the file's content among its inputs, so its text can be drafted.
    # A program is drafted either way: the files it names are the program's to read when it runs.
    own = mentioned_file_names(step.instruction)
    readable = set(own) & set(existing) and "read_file" in tools
    before = [other.instruction for other in plan.steps if other.id in step.depends_on]
    draft = drafted_write(step, tools, fresh, before)
    # a step that computes from a CSV file gets the query's result instead of reading the file
    query = drafted_query(step.instruction, tools, existing, workspace)
    if draft is not None and readable and not draft.language and query is None:
        draft = None
    # "Run it." means the program a step it depends on wrote (or one its own texts name)
    programs = [
        name
        for name in mentioned_file_names(*before, *texts)
        if _program_language(name) and workspace.is_file(name)
    ]
    # a question about files is answered from the call that shows them (`file_questions`)
    question = listing_question(step.instruction) if "list_files" in tools else None
    counted = (
        counted_file(_USE_NOTE.sub("", step.instruction), existing, _sizes(workspace, existing))
        if "read_file" in tools
        else None
    )
    answered = question or counted
    # A direct call's result is the step's output, with no model turn for a prompt to reach: a
    # prompt the person edited (it may say what to do with the file, or not to run the script) is
    # followed by the model, which makes the call itself, its first call held to the files named.
    direct = (
        None if answered is not None or prompt else direct_call(step, tools, (*existing, *programs), programs)
    )
    folder = None
    if draft is not None and not draft.language and query is None and answered is None:
        folder = _content_folder(_USE_NOTE.sub("", step.instruction), workspace, draft.request)
        if folder is not None and folder.path == "." and draft.each:
            folder = None  # "about each file in the workspace": its listing, as before (it reads them)
        elif folder is not None and not {"list_files", "read_file"} <= set(tools):
            folder, draft = None, None  # it could only be drafted from nothing
        elif folder is not None:
            draft = _per_file(draft)
    grounding = None if direct is not None else query or answered or folder or grounding_call(step, tools)
    if not values:
        # nothing to ground: at least stop the model from calling tools until the request cap
        calls = _UNGROUNDED_CALLS + (grounding is not None)
        return StepAids(max_tool_calls=calls, direct_call=direct, grounding=grounding, prompt=prompt)
    return StepAids(
        first_call_tools=tuple(values),
        argument_values=values,
        max_tool_calls=len(values) + (grounding is not None),  # the grounding call counts as one
        drafted_write=draft,
        direct_call=direct,
        grounding=grounding,
        prompt=prompt,
    )


def context_budget(options: RunOptions, model: Model) -> ContextBudget:
    """The run's working-memory budget, clamped to the window of an embedded model."""
    budget = ContextBudget(inputs_chars=options.context_chars, history_chars=options.history_chars)
    window = context_window(model)
    return budget if window is None else budget.within(*window)


def dependency_context(inputs: Sequence[FittedInput]) -> str:
    """The dependencies' outputs as the brief shows them, each under its heading."""
    return "\n\n".join(f"{item.heading}\n{item.text}" for item in inputs)


def step_instructions(step: Step, prompt: str | None) -> str:
    """The agent's system prompt: the reviewed prompt, or one built from the step when there is none."""
    if prompt:
        return prompt
    return f"You are a {step.agent_role}. Do exactly the step you are given and report its result."


_INPUTS_HEADING = "Inputs from the steps before yours:\n\n"
_CLOSING = "When you are done, reply with your step's result."


def step_brief(
    plan: Plan, step: Step, inputs: Sequence[FittedInput], *, tools: list[str], team: str = ""
) -> str:
    """The user message of a step agent: the task, its step, what it must produce, and its inputs.

    `team` (when the step works with others) names them and shows the messages waiting for it.
    """
    lines = [
        f"Overall task: {plan.task}",
        f"Your step ({step.id}): {step.title}",
        f"Instruction: {step.instruction}",
    ]
    if step.expected_output:
        lines.append(f"Expected output: {step.expected_output}")
    if tools:
        lines.append(f"Tools you can use: {', '.join(tools)}. Files live in the run's workspace.")
    if team:
        lines.append(team)
    context = dependency_context(inputs)
    if context:
        lines.append(_INPUTS_HEADING + context)
    lines.append(_CLOSING)
    return "\n".join(lines)


def _ran(result: str) -> str | None:
    """What a call that ran returned, without `ToolCalls.run`'s marker; None if refused or failed."""
    return result.removeprefix(TOOL_OUTPUT).removeprefix("\n") if result.startswith(TOOL_OUTPUT) else None


def _query_rows(data: str | None) -> list[str]:
    """The CSV lines a query printed (its column names first); none if it failed."""
    return (succeeded_output(data) or "").splitlines() if data is not None else []


def _one_value(rows: Sequence[str]) -> str | None:
    """The value of a query result with one row of one column (CSV-quoted values aside)."""
    return rows[1] if len(rows) == 2 and "," not in rows[0] + rows[1] and rows[1].strip() else None


def _input_bodies(inputs: str) -> tuple[int, str]:
    """How many inputs the brief's inputs hold, and their text without the input headings."""
    lines = inputs.splitlines()
    bodies = [line for line in lines if not line.startswith(INPUT_HEADING)]
    return len(lines) - len(bodies), "\n".join(bodies).strip()


def _one_input(inputs: str) -> str | None:
    """The text of the brief's one input when it is one line (None: several inputs, or longer)."""
    count, body = _input_bodies(inputs)
    return body if count == 1 and body and "\n" not in body and len(body) <= 200 else None


@dataclass(frozen=True)
class _Grounded:
    """What a grounding call returned, as an aided turn uses it."""

    text: str = ""
    """As the model is shown it with a drafted text's inputs (`SUM(amount) = 246.75`)."""
    value: str | None = None
    """Its one-line result, which a write that refers to it copies."""
    result: str = ""
    """The step's answer when the step has nothing else to do: the value, or lines."""
    files: tuple[str, ...] = ()
    """The files it lists, which a text about each of them is about."""


def _grounded(grounding: Grounding, data: str | None) -> _Grounded:
    """What the grounding call's output (`data`, None when it did not run) gives the aided turn.

    A count of a file it cannot count (`CountedFile.uncountable`) fails the step (`ToolError`).
    """
    if data is None:
        return _Grounded()
    if isinstance(grounding, DraftedQuery):  # one value reads `SUM(amount) = 246.75`
        rows = _query_rows(data)
        value = _one_value(rows)
        if value is not None:
            return _Grounded(f"{rows[0]} = {value}", value, value)
        return _Grounded("\n".join(rows), None, "\n".join(rows))
    if isinstance(grounding, CountedFile) and grounding.uncountable:
        raise ToolError(grounding.uncountable)  # a count of its start would be a wrong number
    if isinstance(grounding, ListingQuestion | CountedFile):
        result = grounding.answer(data)  # "4", "big.txt", or names a line
        if "\n" not in result:
            return _Grounded(f"{grounding.heading()}: {result}", result, result, tuple(listed_names(result)))
        return _Grounded(f"{grounding.heading()}:\n{result}", None, result, tuple(listed_names(result)))
    return _Grounded(f"The files in the workspace:\n{data}", files=tuple(listed_names(data)))


_FOLDER_READING = "masterplanner_folder_reading"
"""The `provider_details` key of the reads of a folder's files: which files, and what was left out."""
_FOLDER_NOTES = "masterplanner_folder_notes"
"""The `provider_details` key of a text drafted from a folder's files: what of them was not used."""
_SPARE_TOKENS = 64
"""Of a model's window, what a drafted text's request leaves for the chat template's own tokens."""


def _folder_reading(response: ModelResponse) -> FolderReading | None:
    """The files a folder's reads read and what they left out, kept with them (None: not those reads)."""
    kept = (response.provider_details or {}).get(_FOLDER_READING)
    if not isinstance(kept, dict):
        return None
    return FolderReading(
        tuple(kept.get("read", ())), tuple(kept.get("left_out", ())), tuple(kept.get("over_limit", ()))
    )


def _fitted(read: FolderTexts, chars: int, tokens: int | None) -> tuple[str, tuple[str, ...]]:
    """A folder's files as a drafted text is shown them (`FolderTexts.shown`), and what was not shown.

    The most of them that fits in `chars` characters and `tokens` tokens (`estimated_tokens`;
    None: no limit) with the line telling the model what it is not shown; found by halving,
    since how many tokens a text takes depends on its script. Below that, the least shown (the
    first file's start).
    """

    def shown(room: int) -> tuple[str, tuple[str, ...]]:
        held, notes = read.shown(room)
        told = f"\n\nNot shown in full: {'; '.join(notes)}." if notes else ""
        return held + told, notes  # the model is told what it is not shown

    def fits(text: str) -> bool:
        return len(text) <= chars and (tokens is None or estimated_tokens(text) <= tokens)

    best = shown(0)
    low, high = 0, max(chars, 0)
    while low < high:  # the largest room whose text fits
        middle = (low + high + 1) // 2
        tried = shown(middle)
        if fits(tried[0]):
            best, low = tried, middle
        else:
            high = middle - 1
    return best


def _draft_cap(draft: DraftedWrite) -> int:
    """The most tokens a drafted text is asked in."""
    return 32 * draft.lines if draft.lines else 96 * draft.sentences if draft.sentences else 512


def _reads_of(response: ModelResponse) -> list[str]:
    """The paths of a response's calls when every one of them is a `read_file` call."""
    calls = [part for part in response.parts if isinstance(part, ToolCallPart)]
    if len(calls) != len(response.parts) or any(call.tool_name != "read_file" for call in calls):
        return []
    return [str(call.args_as_dict().get("path", "")) for call in calls]


def _returned_contents(response: ModelResponse, messages: Sequence[ModelMessage]) -> dict[str, str]:
    """What each `read_file` call of `response` returned, by path (calls that failed left out)."""
    paths = {
        part.tool_call_id: str(part.args_as_dict().get("path", ""))
        for part in response.parts
        if isinstance(part, ToolCallPart)
    }
    after = messages[messages.index(response) + 1 :][:1]
    contents: dict[str, str] = {}
    for part in getattr(after[0], "parts", []) if after else []:
        if isinstance(part, ToolReturnPart) and part.tool_call_id in paths:
            data = _ran(untrimmed(part))  # what the call returned, not the conversation's cut copy
            if data is not None:
                contents[paths[part.tool_call_id]] = data
    return contents


def _labelled_lines(text: str, label: str) -> list[str]:
    """The lines of `text` that `label` opens ("Decision: …", "- decision - …"), without a bullet."""
    opens = re.compile(
        rf"^(?:[-*\u2022]|\d+[.)])?\s*{re.escape(label)}s?\s*[:\u2013\u2014-]\s*\S", re.IGNORECASE
    )
    lines = (re.sub(r"^(?:[-*\u2022]|\d+[.)])\s*", "", line.strip()) for line in text.splitlines())
    return [line for line in lines if opens.match(line)]


def _only_input(inputs: str) -> str | None:
    """The text of the brief's one input, without its heading (None: several inputs, or none)."""
    count, body = _input_bodies(inputs)
    return body or None if count == 1 else None


def _brief_inputs(messages: Sequence[ModelMessage]) -> str:
    """The dependencies' outputs as the step brief (the first user message) shows them."""
    for message in messages:
        for part in getattr(message, "parts", []):
            if isinstance(part, UserPromptPart) and isinstance(part.content, str):
                _, found, inputs = part.content.partition(_INPUTS_HEADING)
                return inputs.removesuffix(_CLOSING).strip() if found else ""
    return ""


_META_LINE = re.compile(
    r"^(?:here is|here's|sure\b|certainly\b|title:|in this (?:poem|haiku|text)|this (?:poem|haiku)\b|\["
    r"|#+\s*output of step\b)",  # the 135M model echoes the heading its input came under
    re.IGNORECASE,
)
_BREAK = re.compile(r"(?<=[,;.!?])\s+")
_PHRASE = re.compile(
    r"\s+(?=(?:that|which|where|when|while|and|as|in|with|of|on|under|beneath|into|across)\b)"
)


def _split_longest(lines: list[str]) -> list[str] | None:
    """`lines` with the longest one split nearest its middle (None: no place to split).

    At punctuation if it has any, else before a word that opens a phrase ("that", "in", …) when
    the line has six words or more.
    """
    index = max(range(len(lines)), key=lambda n: len(lines[n]))
    line = lines[index]
    cuts = [match.start() for match in _BREAK.finditer(line)]
    if not cuts and len(line.split()) >= 6:
        cuts = [match.start() for match in _PHRASE.finditer(line) if match.start() > 0]
    if not cuts:
        return None
    cut = min(cuts, key=lambda position: abs(position - len(line) / 2))
    return [*lines[:index], line[:cut].strip(), line[cut:].strip(), *lines[index + 1 :]]


def shape_text(
    text: str, *, lines: int | None = None, sentences: int | None = None, numbered: bool = False
) -> str:
    """A drafted text held to its form: no preamble or comment lines, `lines` lines, `sentences` sentences.

    Too few lines are made by splitting the longest at a comma or sentence end; extra lines
    and sentences are dropped. A numbered list gets a numbered line per sentence (the model
    writes it as a paragraph, or as an item that holds the rest). Text with nothing left after that is
    returned stripped.
    """
    kept = [line.strip().strip('"\u201c\u201d') for line in text.strip().splitlines()]
    kept = [line for line in kept if line and not _META_LINE.match(line) and not line.endswith(":")]
    if not kept:
        return text.strip()
    if numbered:  # an item a sentence: a paragraph, or a line of several sentences, is split
        items = [re.sub(r"^(?:\d{1,2}[.)]|[-*\u2022])\s*", "", line) for line in kept]
        items = [part for item in items for part in re.split(r"(?<=[.!?])\s+", item) if part]
        return "\n".join(f"{number}. {item}" for number, item in enumerate(items, 1))
    if sentences:
        return " ".join(re.split(r"(?<=[.!?])\s+", " ".join(kept))[:sentences])
    if lines:
        while len(kept) < lines and (split := _split_longest(kept)) is not None:
            kept = split
        kept = kept[:lines]
        kept[-1] = kept[-1].rstrip(",;:")
    return "\n".join(kept)


_FENCE_LINE = re.compile(r"^```[\w+-]*[ \t]*$", re.MULTILINE)


def program_text(text: str) -> str:
    """The program in a drafted reply: its first fenced block, else the reply without the prose after it.

    Small models wrap the program in a Markdown fence and explain it after ("This script uses …"),
    sometimes close a fence they never opened, or leave the fence out; then the program ends at
    the closing fence or at the first blank line before a line of prose.
    """
    first = _FENCE_LINE.search(text)
    before = text[: first.start()].strip() if first is not None else ""
    if first is not None and (not before or ("\n" not in before and before.endswith(":"))):
        body = text[first.end() :].lstrip("\n")
        closing = _FENCE_LINE.search(body)
        return (body[: closing.start()] if closing else body).strip("\n") + "\n"
    if first is not None:  # a fence closed, not opened: the program is what comes before it
        text = text[: first.start()]
    blocks = re.split(r"\n\s*\n", text.strip("\n"))
    kept = [blocks[0]]
    for block in blocks[1:]:
        if re.match(r"(?:This|The|It|Here|Note|When|You)\b[^\n]*\s\w+\s\w+", block):
            break
        kept.append(block)
    return "\n\n".join(kept).strip("\n") + "\n"


_RESERVE_POLL_S = 0.05
"""How often a request waiting for the requests in flight to be counted asks the ledger again."""


async def _reserved(ledger: RequestBudget, reservation: Reservation) -> Reservation | None:
    """`ledger.reserve` in a worker thread; cancelled meanwhile, what it reserved is released."""
    loop = asyncio.get_running_loop()
    reserving = loop.run_in_executor(None, ledger.reserve, reservation)
    try:
        return await asyncio.shield(reserving)
    except asyncio.CancelledError:

        def release_if_held(done: asyncio.Future[Reservation | None]) -> None:
            if not done.cancelled() and done.exception() is None and (held := done.result()) is not None:
                loop.run_in_executor(None, _release, ledger, held)

        reserving.add_done_callback(release_if_held)
        raise


def _release(ledger: RequestBudget, reservation: Reservation) -> None:
    """Release a reservation; a store that fails to is left to drop it with this process's lease."""
    try:
        ledger.release(reservation)
    except RunError:
        pass


@dataclass(frozen=True)
class PaidToolCalls:
    """A step's paid tool requests (`generate_image`) held to the run's budgets and counted under its purpose.

    Each is held and counted as a model request is (`BudgetedModel`, `LabelledModel`): its worst
    case reserved before it is made, its real usage and cost stored once answered (the tool call's
    checkpoint keeps a replayed call from being counted again).
    """

    ledger: RunLedger
    purpose: str

    @property
    def money_budget(self) -> bool:
        """Whether the run has a money budget."""
        return self.ledger.options.max_cost_usd is not None

    async def hold(self, input_tokens: int, output_tokens: int, cost_usd: float) -> Reservation:
        """Reserve the request's worst case, waiting while the requests in flight leave no room."""
        reservation = Reservation(input_tokens=input_tokens, output_tokens=output_tokens, cost_usd=cost_usd)
        while True:  # polled, as `BudgetedModel.request` does
            if await _reserved(self.ledger, reservation):
                return reservation
            await asyncio.sleep(_RESERVE_POLL_S)

    async def release(self, held: Reservation) -> None:
        """The request was not answered: its reservation is dropped."""
        await asyncio.to_thread(_release, self.ledger, held)

    async def count(
        self,
        held: Reservation,
        *,
        input_tokens: int,
        output_tokens: int,
        seconds: float,
        cost_usd: float | None,
        failed: bool = False,
    ) -> None:
        """Count the answered (or `failed`) request in the run's usage, in place of its reservation."""
        self.ledger.settle(held, input_tokens + output_tokens, cost_usd)
        await asyncio.to_thread(
            partial(
                self.ledger.record,
                self.purpose,
                input_tokens=input_tokens,
                output_tokens=output_tokens,
                seconds=seconds,
                cost_usd=cost_usd,
                failed=failed,
            )
        )


class BudgetedModel(WrapperModel):
    """Holds every request to the run's call, token and money budgets (see `request`).

    It also applies a step's aids (see `StepAids`) when the model it wraps carries them and its
    profile sets `masterplanner_structured_plans`: first the grounding call, if any (for a query,
    the one the model picks from those the aid lists); then the direct tool call, or it asks the
    model for the text alone (with what the grounding call returned) and answers with a
    `write_file` call of it, or of the one-line result the step refers to. The agent runs those
    calls as it runs any (policy, checkpoint, events). Once the call has returned, it answers
    with what was read, or with the text; a step with a query and no file answers with its
    result. Any other turn (a failed call sent back, say) goes to the model as usual.
    """

    def __init__(self, wrapped: Model, ledger: RequestBudget) -> None:
        """`ledger` holds each request to the run's budgets (`RunLedger.reserve`)."""
        super().__init__(wrapped)
        self._ledger = ledger

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """Make the request (or take the step aid's turn) once its worst case fits the run's budgets.

        The request reserves the most it may use (`reservation_for`) before it is made. One that
        fits the budgets but not beside the requests in flight waits for those to be counted;
        (a `model_waiting` event says so once); one whose worst case cannot fit what is left even
        alone is sent with its `max_tokens`
        lowered to what is left (`RunLedger.reserve`); one that cannot fit even so raises
        `BudgetExceededError` naming the budget. Once answered, its real usage is held instead
        until the ledger has stored it (`LabelledModel`); once failed, a call of no tokens (it
        counts toward the call budget).
        """
        ledger = self._ledger
        reservation, model_settings = reservation_for(
            self.wrapped,
            messages,
            model_settings,
            model_request_parameters,
            bounded=ledger.options.max_cost_usd is not None,
        )
        # each try is a transaction of the run store; those in flight are counted by other tasks
        # of this process (in worker threads) or by other processes: polled, not awaited as an event
        waited = False
        while (held := await _reserved(ledger, reservation)) is None:
            if not waited:  # said once, as it starts to wait
                waited = True
                await asyncio.to_thread(ledger.note_wait, reservation, current_purpose())
            await asyncio.sleep(_RESERVE_POLL_S)
        if held.output_tokens < reservation.output_tokens:  # cut to fit what is left of a budget
            lowered = {**(model_settings or {}), "max_tokens": held.output_tokens}
            model_settings = cast("ModelSettings", lowered)
        try:
            response = await self._answer(messages, model_settings, model_request_parameters)
        except BaseException as error:
            if made_and_failed(error):  # a failed call (`LabelledModel` counts it): held so till then
                ledger.settle(held, 0, 0.0)
            else:  # not made (a cancel, our own refusal): the reservation is released
                await asyncio.shield(asyncio.to_thread(_release, ledger, held))
            raise
        usage = response.usage
        ledger.settle(held, usage.input_tokens + usage.output_tokens, request_cost(self, response))
        return response

    async def _answer(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        """The step aid's turn, or the model's answer."""
        aids = self._aids(model_request_parameters)
        if aids is not None:
            response = await self._aided_turn(aids, messages, model_settings)
            if response is not None:
                return response
        return await self.wrapped.request(messages, model_settings, model_request_parameters)

    def _aids(self, params: ModelRequestParameters) -> StepAids | None:
        """The step aids that apply to this request: only those whose tools the step was offered."""
        aids = getattr(self.wrapped, "aids", None)
        if not isinstance(aids, StepAids) or not self.wrapped.profile.get(STRUCTURED_PLANS, False):
            return None
        offered = {tool.name for tool in params.function_tools}
        direct = aids.direct_call if aids.direct_call and aids.direct_call.tool in offered else None
        grounding = aids.grounding if aids.grounding and aids.grounding.tool in offered else None
        draft = aids.drafted_write if "write_file" in offered else None
        if direct is None and grounding is None and draft is None:
            return None
        reads = "read_file" in offered
        return StepAids(
            drafted_write=draft, direct_call=direct, grounding=grounding, reads_each=reads, prompt=aids.prompt
        )

    async def _aided_turn(
        self, aids: StepAids, messages: list[ModelMessage], settings: ModelSettings | None
    ) -> ModelResponse | None:
        """The response to this turn of a step aid, or None when the model must answer it.

        The grounding call comes first (its result goes to the drafted text's inputs); then the
        direct call or the drafted write; once that call has returned, its result or the text is
        the answer. Any other turn (a failed call sent back, say) goes to the model as usual.
        """
        responses = [message for message in messages if isinstance(message, ModelResponse)]
        grounded = _Grounded()
        if aids.grounding is not None:
            if not responses:
                if isinstance(aids.grounding, DraftedQuery):
                    return await self._query(aids.grounding, settings)
                return self._call(DirectCall(aids.grounding.tool, aids.grounding.arguments))
            after = messages[messages.index(responses[0]) + 1 :][:1]  # the grounding call's return
            returns = [part for part in getattr(after[0], "parts", []) if isinstance(part, ToolReturnPart)]
            # what the call returned: the conversation may show the model only its start
            returned = untrimmed(returns[0]) if after and returns else None
            if isinstance(aids.grounding, FolderFiles):
                rest = responses[1:]
                return await self._folder_turn(aids.grounding, returned, aids, rest, messages, settings)
            grounded = _grounded(aids.grounding, None if returned is None else _ran(returned))
            responses = responses[1:]
        aid = aids.direct_call or aids.drafted_write
        if aid is None:
            if grounded.result and not responses and not aids.prompt:
                # the query's or the question's result is the step's answer: its one value, or its
                # lines; under a prompt a person wrote, the model answers from it (no turn of
                # the model's, the edit would be ignored)
                return ModelResponse(parts=[TextPart(grounded.result)], model_name=self.wrapped.model_name)
            return None  # the model answers from the grounding call's result
        inputs = _brief_inputs(messages)
        if isinstance(aid, DraftedWrite) and aid.each:  # the files it has a line each about
            items = list(grounded.files or listed_names(_input_bodies(inputs)[1]))[:MAX_EACH]
            if items:
                return await self._each_turn(aid, items, aids, responses, messages, settings)
        if not responses:
            if isinstance(aid, DirectCall):
                return self._call(aid)
            if aids.prompt:  # the person's prompt: the text is the model's, asked under it
                aid = replace(aid, copy=False, labelled="")
            if aid.copy and (copied := grounded.value or _one_input(inputs)):
                return self._call(DirectCall("write_file", {"path": aid.path, "content": f"{copied}\n"}))
            if aid.translate_to and (source := _only_input(inputs)):
                return await self._translate(aid, source, settings, aids.prompt)
            if aid.labelled and (lines := _labelled_lines(_only_input(inputs) or "", aid.labelled)):
                content = "\n".join(f"- {line}" for line in lines) + "\n"
                return self._call(DirectCall("write_file", {"path": aid.path, "content": content}))
            return await self._draft(aid, messages, settings, grounded.text, aids.prompt)
        return self._returned(aid, responses, messages)

    async def _folder_turn(
        self,
        folder: FolderFiles,
        listing: str | None,
        aids: StepAids,
        responses: list[ModelResponse],
        messages: list[ModelMessage],
        settings: ModelSettings | None,
    ) -> ModelResponse | None:
        """A turn of a text drafted from the files of a folder, once the folder's listing has returned.

        First one `read_file` call per file (`FolderFiles.reading`: no hidden file unless it has
        only those, at most `MAX_EACH`), then the text (a line about each, or one text drafted
        from all of them, fitted to the model's context: `FolderTexts.shown`) and its `write_file`
        call, then the text as the answer, followed by what of the folder was left out or cut
        (the model drafting the text is told too). A folder that could not be listed, that holds
        no file, or a file that could not be read, or none that is text, fails the step
        (`ToolError`): the text would be drafted from nothing.
        """
        aid = aids.drafted_write
        if not responses:  # the listing has just returned
            data = None if listing is None else _ran(listing)
            if data is None:
                problem = (listing or "").removeprefix(TOOL_FAILED).strip() or "it could not be listed"
                raise ToolError(f"the step is about the files in {folder.shown}, but {problem}")
            reading = folder.reading(data, MAX_EACH)
            if not reading.read:
                raise ToolError(f"the step is about the files in {folder.shown}, but it holds none")
            if aid is None or not aids.reads_each:
                return None
            parts = [ToolCallPart("read_file", {"path": path}) for path in reading.read]
            # what was chosen is kept with the reads: later turns may no longer see the listing
            # (`trim_history` drops the oldest results first, and the reads can be long)
            kept = {
                "read": list(reading.read),
                "left_out": list(reading.left_out),
                "over_limit": list(reading.over_limit),  # whose reads begin with our line saying so
            }
            return ModelResponse(
                parts=list(parts),
                model_name=self.wrapped.model_name,
                provider_details={_FOLDER_READING: kept},
            )
        chosen = _folder_reading(responses[0])
        if aid is None or chosen is None or _reads_of(responses[0]) != list(chosen.read):
            return None  # not where this aid's conversation is: the model answers
        if len(responses) > 1:  # the text was written: it is the answer, with what was not used of the folder
            answer = self._returned(aid, responses[1:], messages)
            said = (responses[1].provider_details or {}).get(_FOLDER_NOTES)
            if answer is None or not isinstance(said, str) or not said:
                return answer
            text = "".join(part.content for part in answer.parts if isinstance(part, TextPart))
            return ModelResponse(
                parts=[TextPart(f"{text.rstrip()}\n\n{said}")], model_name=self.wrapped.model_name
            )
        contents = _returned_contents(responses[0], messages)
        unread = [path for path in chosen.read if path not in contents]
        if unread:
            raise ToolError(
                f"the step is about the files in {folder.shown}, but {', '.join(unread)} could not be read"
            )
        read = chosen.texts(contents)
        if not read.texts:
            raise ToolError(
                f"the step is about the files in {folder.shown}, but none of them is UTF-8 text "
                f"({', '.join(chosen.read)})"
            )
        if aid.each:
            texts = dict(read.texts)
            response = await self._draft_each(aid, list(texts), texts, settings, aids.prompt)
            notes = read.notes
        else:
            held, notes = _fitted(read, *self._folder_room(aid, messages, aids.prompt))
            response = await self._draft(aid, messages, settings, held, aids.prompt)
        if not notes:
            return response
        said = f"Not all of the files in {folder.shown} were used in full:\n" + "\n".join(
            f"- {n}" for n in notes
        )
        return replace(response, provider_details={**(response.provider_details or {}), _FOLDER_NOTES: said})

    def _folder_room(
        self, draft: DraftedWrite, messages: list[ModelMessage], prompt: str
    ) -> tuple[int, int | None]:
        """How much of a folder's files a text drafted from them may be shown: characters, and tokens.

        Characters: what the run's input budget (`context_budget`: `context_chars`, clamped to
        the model's window) leaves beside the step's inputs. Tokens (None: the model's window is
        not known): what the window leaves beside the rest of the draft's request and its reply,
        measured as `estimated_tokens` measures (before, at `CHARS_PER_TOKEN` whatever the
        script: Japanese notes overflowed a 2,048-token window).
        """
        brief = _brief_inputs(messages)
        chars = context_budget(self._ledger.options, self.wrapped).inputs_chars - len(brief)
        window = context_window(self.wrapped)
        if window is None:
            return chars, None
        system = render("step_draft_system.j2", prompt=prompt)
        user = render("step_draft_user.j2", request=draft.request, form=draft.form, inputs=brief)
        used = _draft_cap(draft) + _SPARE_TOKENS + estimated_tokens(system) + estimated_tokens(user)
        return chars, window[0] - used

    async def _each_turn(
        self,
        aid: DraftedWrite,
        items: list[str],
        aids: StepAids,
        responses: list[ModelResponse],
        messages: list[ModelMessage],
        settings: ModelSettings | None,
    ) -> ModelResponse | None:
        """A turn of a text with a line about each file.

        First the files' reads (when the step may read), then the drafts and their `write_file`
        call, then the text as the answer.
        """
        reads = aids.reads_each
        if not responses:
            if reads:
                parts = [ToolCallPart("read_file", {"path": item}) for item in items]
                return ModelResponse(parts=list(parts), model_name=self.wrapped.model_name)
            return await self._draft_each(aid, items, {}, settings, aids.prompt)
        if reads and _reads_of(responses[0]) == items:
            if len(responses) == 1:  # the reads have returned
                return await self._draft_each(
                    aid, items, _returned_contents(responses[0], messages), settings, aids.prompt
                )
            responses = responses[1:]
        return self._returned(aid, responses, messages)

    def _returned(
        self, aid: DirectCall | DraftedWrite, responses: list[ModelResponse], messages: list[ModelMessage]
    ) -> ModelResponse | None:
        """The answer once the aid's one call has returned: what it read, or the text it wrote.

        None (the model answers) when that is not where the conversation is.
        """
        calls = [part for part in responses[-1].parts if isinstance(part, ToolCallPart)]
        returned = [part for part in getattr(messages[-1], "parts", []) if isinstance(part, ToolReturnPart)]
        if len(responses) != 1 or len(calls) != 1 or len(returned) != 1:
            return None
        result = returned[0].model_response_str()
        data = _ran(result)
        if isinstance(aid, DirectCall):
            text = result if data is None else data
        else:
            text = str(calls[0].args_as_dict().get("content", ""))
            if data is None:
                text = f"{text}\n\n({aid.path} was not written: {result})"
        return ModelResponse(parts=[TextPart(text)], model_name=self.wrapped.model_name)

    def _call(self, call: DirectCall) -> ModelResponse:
        part = ToolCallPart(call.tool, dict(call.arguments))
        return ModelResponse(parts=[part], model_name=self.wrapped.model_name)

    async def _query(self, query: DraftedQuery, settings: ModelSettings | None) -> ModelResponse:
        """Have the model pick the query (under a grammar of `query.queries`) and answer with its call.

        With one query to pick there is no model request.
        """
        chosen, usage = query.queries[0], RequestUsage()
        if len(query.queries) > 1:
            schema = {
                "type": "object",
                "properties": {"query": {"enum": list(query.queries)}},
                "required": ["query"],
                "additionalProperties": False,
            }
            request = ModelRequest(
                parts=[
                    SystemPromptPart(render("step_query_system.j2")),
                    UserPromptPart(render("step_query_user.j2", table=query.table, request=query.request)),
                ]
            )
            reply = await self.wrapped.request(
                [request],
                {**(settings or {}), "max_tokens": 128},
                ModelRequestParameters(
                    output_mode="native"
                    if self.wrapped.profile.get("supports_json_schema_output")
                    else "prompted",
                    output_object=OutputObjectDefinition(json_schema=schema, name="query"),
                ),
            )
            usage = reply.usage
            text = "".join(part.content for part in reply.parts if isinstance(part, TextPart))
            try:
                picked = json.loads(text).get("query")
            except (ValueError, AttributeError):
                picked = None
            chosen = picked if picked in query.queries else chosen
        call = ToolCallPart(query.tool, {"language": "sql", "code": chosen})
        return ModelResponse(parts=[call], usage=usage, model_name=self.wrapped.model_name)

    async def _draft(
        self,
        draft: DraftedWrite,
        messages: list[ModelMessage],
        settings: ModelSettings | None,
        grounded: str = "",
        prompt: str = "",
    ) -> ModelResponse:
        """Ask for the text (or program) alone and answer with the `write_file` call that saves it.

        `prompt`: the prompt a person wrote, put in the system text (`StepAids.prompt`).
        """
        brief = _brief_inputs(messages)
        count = _one_input(brief) if draft.counted_lines else None
        if count is not None and count.isascii() and count.isdigit() and 0 < int(count) <= MAX_COUNTED_LINES:
            # "a poem with that many lines" given 4: "a poem with 4 lines", held to 4 lines
            asked = _THAT_MANY_LINES.sub(f"{int(count)} lines", draft.request)
            draft, brief = replace(draft, request=asked, lines=int(count)), ""
        ids = re.findall(rf"^{re.escape(INPUT_HEADING)}(\S+)", brief, re.MULTILINE)
        if len(ids) == 1:  # one input needs no heading, which the 135M model echoes ("### Step-by-step: …")
            brief = _input_bodies(brief)[1]
        inputs = "\n\n".join(part for part in (brief, grounded) if part)
        system = (
            render("step_program_system.j2", language=draft.language, prompt=prompt)
            if draft.language
            else render("step_draft_system.j2", prompt=prompt)
        )
        prompt = render("step_draft_user.j2", request=draft.request, form=draft.form, inputs=inputs)
        cap = _draft_cap(draft)
        request = ModelRequest(parts=[SystemPromptPart(system), UserPromptPart(prompt)])
        reply = await self.wrapped.request(
            [request],
            {**(settings or {}), "max_tokens": cap},
            ModelRequestParameters(output_mode="text", allow_text_output=True),
        )
        written = "".join(part.content for part in reply.parts if isinstance(part, TextPart))
        # the 135M model echoes an input's heading ("Step-by-step find-the-product", "### Output of
        # step …"): a line naming a step's id is not part of the text
        written = "\n".join(line for line in written.splitlines() if not any(i in line for i in ids))
        if draft.language:
            content = program_text(written)
        else:
            content = shape_text(
                written, lines=draft.lines, sentences=draft.sentences, numbered=draft.numbered
            )
        call = ToolCallPart("write_file", {"path": draft.path, "content": content})
        return ModelResponse(parts=[call], usage=reply.usage, model_name=reply.model_name)

    async def _translate(
        self, draft: DraftedWrite, source: str, settings: ModelSettings | None, prompt: str = ""
    ) -> ModelResponse:
        """Translate `source` a sentence at a time; answer with the `write_file` call of the translation.

        Each sentence is asked after the language's example pairs (as earlier turns of the chat);
        the source's lines are kept.
        """
        language = draft.translate_to
        examples: list[ModelMessage] = [
            ModelRequest(
                parts=[SystemPromptPart(render("step_translate_system.j2", language=language, prompt=prompt))]
            )
        ]
        for english, other in _translation_examples()[language]:
            examples += [
                ModelRequest(parts=[UserPromptPart(english)]),
                ModelResponse(parts=[TextPart(other)]),
            ]
        usage = RequestUsage()
        lines: list[str] = []
        for line in source.splitlines()[:MAX_TRANSLATED_LINES]:
            sentences: list[str] = []
            for sentence in re.split(r"(?<=[.!?])\s+", line.strip()) if line.strip() else []:
                await asyncio.to_thread(self._ledger.check)  # one turn, many requests: the budget before each
                reply = await self.wrapped.request(
                    [*examples, ModelRequest(parts=[UserPromptPart(sentence)])],
                    {**(settings or {}), "max_tokens": 16 + 3 * len(sentence.split()) * 2},
                    ModelRequestParameters(output_mode="text", allow_text_output=True),
                )
                usage += reply.usage
                text = "".join(part.content for part in reply.parts if isinstance(part, TextPart))
                sentences.append(next((part.strip() for part in text.splitlines() if part.strip()), ""))
            lines.append(" ".join(part for part in sentences if part))
        content = "\n".join(lines).strip() + "\n"
        call = ToolCallPart("write_file", {"path": draft.path, "content": content})
        return ModelResponse(parts=[call], usage=usage, model_name=self.wrapped.model_name)

    async def _draft_each(
        self,
        draft: DraftedWrite,
        items: Sequence[str],
        contents: dict[str, str],
        settings: ModelSettings | None,
        prompt: str = "",
    ) -> ModelResponse:
        """Ask for one sentence about each file alone; answer with the `write_file` call of their lines.

        "Describe each file in the workspace in one line" is asked as "Describe trip.csv in one
        line." for each file, with its start when it was read (`contents`); a line that does not
        name its file is headed by its name.
        """
        system = render("step_draft_system.j2", prompt=prompt)
        lines: list[str] = []
        usage = RequestUsage()
        for item in items:
            request = _SAVE_CLAUSE.sub("", _EACH_OBJECT.sub(item, draft.request, count=1))
            start = contents.get(item, "")[:EACH_CONTENT_CHARS].strip()
            prompt = render("step_each_user.j2", item=item, content=start, request=request)
            await asyncio.to_thread(self._ledger.check)  # one turn, many requests: the budget before each
            reply = await self.wrapped.request(
                [ModelRequest(parts=[SystemPromptPart(system), UserPromptPart(prompt)])],
                {**(settings or {}), "max_tokens": 64},
                ModelRequestParameters(output_mode="text", allow_text_output=True),
            )
            usage += reply.usage
            text = "".join(part.content for part in reply.parts if isinstance(part, TextPart))
            # its first line, to its first sentence: a line that introduces more ("… the following
            # structure:") is the sentence, the structure it introduces is not kept
            first = next((line.strip() for line in text.splitlines() if line.strip()), "")
            sentence = shape_text(re.sub(r":$", ".", first), sentences=1)
            line = sentence if item in sentence else f"{item}: {sentence}"
            lines.append(f"- {line}" if draft.path.lower().endswith((".md", ".markdown")) else line)
        call = ToolCallPart("write_file", {"path": draft.path, "content": "\n".join(lines) + "\n"})
        return ModelResponse(parts=[call], usage=usage, model_name=self.wrapped.model_name)
