"""The structure a task's wording gives a plan: its clauses, one action each.

`clauses("Read notes.txt, summarize it and then write the summary to out.md")` gives
`["Read notes.txt", "summarize it", "write the summary to out.md"]`. The planner can use the
clauses as the actions it asks steps for, an evaluation as a plan's expected size, and a
baseline as a plan of its own (a chain of one step per clause).

How a task is cut, deterministically and without a model:

- Text inside quotes (`"…"`, `“…”`, `'…'` opened after a space, `` `…` ``) and brackets is never
  cut, so a file's quoted content stays one piece.
- Strong boundaries always cut: `;`, a line break, a sentence end (`.`, `!` or `?` followed by a
  space, not after an abbreviation such as `e.g.` or `Dr.` or an initial), and the sequencing
  words `then`, `after that`, `afterwards`, `finally`, `lastly`. A file name (`a.csv`) or a
  number (`1,000`, `3.5`) has no space after its dot or comma, so it is never a boundary.
- Weak boundaries, a comma or `and`, cut only when the words after it start an action (a verb such
  as `write`, `to` and a verb, or a person and a verb: `I need`, `we want`) and the words before
  it hold a verb. So `a poem about cats and dogs`, `apples, pears and plums` and
  `For data.csv, compute the total` stay whole. Verbs that are also nouns (`order`, `book`,
  `report`, …) start an action only when an object follows (`the`, `it`, a number, a quote, …):
  `and book a hotel` is cut, `the price and order history` is not.
- A clause opening with `if`, `when`, `once`, `after`, `before`, `unless` or `as soon as` stays
  with the clause that follows its comma: `If it exists, delete it` is one action.

Each clause comes back trimmed of its connecting words (`and`, `then`, `also`, `please`, …) and of
trailing `.`, `,`, `;`, `:` or `!`; the words themselves are the task's own. A task with no text
gives no clauses; any other task gives at least one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FolderMention", "clauses", "named_folders"]

# Base forms of verbs a task uses to ask for something (imperatives, after `to`, after `I want`).
_VERBS = frozenset(
    """
    accept activate add adjust analyse analyze append apply approve archive arrange ask assign
    attach backup bake buy calculate cancel check choose clean clear close collect combine compare
    compile complete compose compute confirm connect convert cook correct count create deactivate
    decide decline deduct define delete deliver describe detect determine develop download draw edit
    enter evaluate explain export extract fetch fill filter find format forward freeze gather
    generate get give go group help highlight hire identify import improve include inform inquire
    insert install introduce investigate invite join keep learn let list load locate look make merge
    modify monitor move notify obtain open organise organize paraphrase pause pay pick predict
    prepare proofread provide publish purchase put rank read rebook reboot recharge recommend reduce
    refresh register reject remind remit remove rename renew reorder repay repeat rephrase replace
    reschedule reserve resize restart retrieve reverse revise rewrite run save search see select
    sell send ship show simplify solve sort start store submit subscribe subtract suggest summarise
    summarize sync take tell transform translate try turn unblock unlock unsubscribe upgrade upload
    use validate verify visualize want wash withdraw write
    """.split()
)
# Verbs that are as often nouns: an action only when an object follows them.
_NOUN_VERBS = frozenset(
    """
    answer block book call change chart contact copy cut decrease deposit design display draft email
    estimate exchange file fix increase lock log mail map mark measure name note order outline pack
    plan play plot post present price print query rate record refund rent reply report request reset
    return review scan schedule set share sign split stop sum swap switch test text total track
    transfer type update view watch
    """.split()
)
_OBJECT_STARTS = frozenset(
    """
    the a an it them this that these those my your our his her their its all each every some any
    me us him one two three four five six seven eight nine ten up out down back to for with about
    of on in from what which who how
    """.split()
)
# Words that say a person is asking (`I need`, `we would like`), and who may ask.
_WANTING = frozenset(
    "need needs want wants would like wish should must can could will shall hope plan intend".split()
)
_SUBJECTS = frozenset("i we you they he she i'd we'd you'd i'll we'll let's".split())
_SUBORDINATE = re.compile(r"(?:if|when|whenever|once|after|before|unless|as soon as)\b", re.IGNORECASE)
_STRONG_WORDS = re.compile(r"\b(?:then|after that|afterwards|finally|lastly)\b", re.IGNORECASE)
_ABBREVIATIONS = frozenset(
    "e.g i.e eg ie vs cf approx mr mrs ms dr st no nr prof jr sr fig vol ca resp incl".split()
)

_QUOTED = re.compile(
    r"\"[^\"\n]*\"|“[^”\n]*”|\u2018[^\u2019\n]*\u2019|`[^`\n]*`|(?<![\w'])'[^'\n]*'(?![\w'])"
    r"|\([^()\n]*\)|\[[^\[\]\n]*\]|\{[^{}\n]*\}"
)
_BOUNDARY = re.compile(
    r"(?P<hard>\s*(?:;|\n)\s*|(?<=[.!?])\s+)|,\s+|\s+(?:and|then)\s+",
    re.IGNORECASE,
)
_LEADING = re.compile(
    r"(?:[\s,:;-]+|(?:and|then|also|finally|lastly|afterwards|after that|next(?=\s*,)|please|so)\b)+",
    re.IGNORECASE,
)
_TRAILING = re.compile(r"[\s,;:]+$|(?<![.!?])[.!]$")
_WORD = re.compile(r"[A-Za-z]+(?:'[a-z]+)?|\d+|[\"“\u2018'`(\[]")
_LIST_MARKER = re.compile(r"^(?:\d{1,2}[.)]|[-*•])\s+")


@dataclass
class _Piece:
    """A stretch of the task between two boundaries, and what separated it from the one before."""

    start: int
    end: int
    separator: str
    hard: bool
    """Separated by `;`, a line break or a sentence end (or it is the first piece)."""

    @property
    def strong(self) -> bool:
        """Cut whatever follows: a hard boundary or a sequencing word (`then`, `finally`, …)."""
        return self.hard or _STRONG_WORDS.search(self.separator) is not None


def _masked(task: str) -> str:
    """The task with quoted and bracketed text blanked out (same length), so nothing cuts inside it."""
    return _QUOTED.sub(lambda match: "_" * len(match.group()), task)


def _is_sentence_end(masked: str, position: int) -> bool:
    """Whether the `.`, `!` or `?` just before `position` ends a sentence (not `e.g.`, `Dr.`, `J.`)."""
    if masked[position - 1] != ".":
        return True
    token = masked[:position].rsplit(None, 1)[-1].rstrip(".").lower()
    if token in _ABBREVIATIONS or re.fullmatch(r"(?:[a-z]\.)*[a-z]", token):
        return False
    if re.fullmatch(r"\d{1,2}", token) and re.search(r"(?:^|\n)\s*\d{1,2}\.$", masked[:position]):
        return False  # `1. ` opening a numbered line
    return not (token == "etc" and masked[position:].lstrip()[:1].islower())


def _pieces(task: str) -> list[_Piece]:
    """The task cut at every boundary; connecting words go to the separator of the piece they open.

    A stretch holding nothing but connecting words (the `and` of `, and then`) is no piece: its
    words join the next piece's separator.
    """
    masked = _masked(task)
    cuts: list[tuple[int, int, bool]] = []
    for match in _BOUNDARY.finditer(masked):
        hard = match.group("hard")
        if hard is not None and not hard.strip(" \t") and not _is_sentence_end(masked, match.start()):
            continue
        cuts.append((match.start(), match.end(), hard is not None))
    pieces: list[_Piece] = []
    start, separator, hard_cut = 0, "", True
    for cut_start, cut_end, hard in [*cuts, (len(task), len(task), False)]:
        leading = _LEADING.match(task, start, cut_start)
        text_start = leading.end() if leading else start
        separator += task[start:text_start]
        if text_start < cut_start or not pieces:
            pieces.append(_Piece(text_start, cut_start, separator, hard_cut))
            separator, hard_cut = "", False
        separator += task[cut_start:cut_end]
        hard_cut = hard_cut or hard
        start = cut_end
    return pieces


def _words(text: str) -> list[str]:
    return [word.lower() for word in _WORD.findall(text)]


def _starts_action(text: str) -> bool:
    """Whether `text` begins with something to do: a verb, `to` and a verb, or `I`/`we` wanting."""
    found = _words(_LIST_MARKER.sub("", text))
    if found[:1] == ["to"]:
        found = found[1:]
    if not found:
        return False
    first, following = found[0], found[1] if len(found) > 1 else ""
    if first in _VERBS:
        return True
    if first in _NOUN_VERBS:
        return following in _OBJECT_STARTS or (following != "" and not following.isalpha())
    if first in _SUBJECTS:
        return any(word in _WANTING or word in _VERBS for word in found[1:4])
    return False


def _has_verb(text: str) -> bool:
    """Whether `text` holds a verb (a noun-like one only with an object after it) or a wish."""
    found = _words(text)
    return any(
        word in _VERBS
        or word in _WANTING
        or (word in _NOUN_VERBS and _starts_action(" ".join(found[index : index + 2])))
        for index, word in enumerate(found)
    )


def _joins(before: str, piece: _Piece, text: str, *, condition: bool) -> bool:
    """Whether `piece` (its text `text`) belongs to the clause `before` rather than starting one.

    `condition`: `before` is a condition still waiting for its action (`If it exists`).
    """
    if not re.search(r"[A-Za-z]", _LIST_MARKER.sub("", text.strip())):
        return True
    if piece.hard:
        return False
    if condition:
        return True  # `If it exists, (then) delete it`: a condition and its action are one clause
    return not piece.strong and not (_starts_action(text) and _has_verb(before))


def _clean(text: str) -> str:
    text = _LIST_MARKER.sub("", text.strip())
    previous = None
    while previous != text:
        previous, text = text, _TRAILING.sub("", text).strip()
    return text


def clauses(task: str) -> list[str]:
    """The task's clauses, one action each, in order (see the module docstring for the rules)."""
    if not task.strip():
        return []
    kept: list[list[int]] = []  # [start, end, 1 while a condition waits for its action]
    for piece in _pieces(task):
        text = task[piece.start : piece.end]
        if kept:
            start, end, condition = kept[-1]
            if _joins(task[start:end], piece, text, condition=bool(condition)):
                kept[-1] = [start, piece.end, 0]
                continue
        kept.append([piece.start, piece.end, int(_SUBORDINATE.match(text) is not None)])
    found = [_clean(task[start:end]) for start, end, _ in kept]
    found = [text for text in found if re.search(r"[A-Za-z0-9]", text)]
    return found or [task.strip()]


@dataclass(frozen=True)
class FolderMention:
    """A folder of the workspace whose files a text is about (`named_folders`)."""

    path: str
    """The folder, relative to the workspace ("notes", "notes/2024"); "." is the workspace itself."""
    certain: bool
    """Whether the words make it a folder ("./notes", "notes/", "the notes folder", "the three
    files"); "the files in notes" is one only if the workspace has a folder of that name."""


_FOLDER_PATH = re.compile(
    r"(?<![\w/.~:-])(?:\./(?P<dotted>(?:[\w-]+/)*[\w-]+)/?|(?P<slashed>(?:[\w-]+/)*[\w-]+)/)"
    r"(?![\w/-])(?!\.\w)"
)
_FOLDER_WORD = re.compile(
    r"\b(?:the|my|our|your|this|that)\s+['\"`]?(?P<name>[\w-]+)['\"`]?\s+(?:folder|directory)\b", re.I
)
_FILES_IN = re.compile(
    r"\bfiles\s+(?:in|from|of|under|inside)\s+(?:the\s+)?(?:(?:folder|directory)\s+)?"
    r"['\"`]?(?P<name>[A-Za-z_][\w-]*(?:/[\w-]+)*)/?['\"`]?(?![\w/-])(?!\.\w)",
    re.I,
)
_NOT_FOLDERS = frozenset(
    "workspace folder directory question order turn total full detail time it them this that".split()
)
_THE_FILES = re.compile(
    r"\b(?:the|all(?:\s+the)?|these|those)\s+(?:(?:\d+|two|three|four|five|six|seven|eight|nine|ten)\s+)?"
    r"files\b(?=\s*(?:[.,;:!?)]|$)|\s+(?:into|to|as|and)\b)",
    re.I,
)
""""the files" as what a text is about, its phrase ending there ("summarise the files into
summary.md"): "the files are ready", "backing up the files on a laptop" and "all the files
needed for a Django app" are about no files of the workspace (a review found such steps given
the workspace's files, or failed when it had none)."""


def named_folders(text: str) -> list[FolderMention]:
    """The folders whose files a text is about, in order ("./notes", "notes/", "the notes folder").

    "The files in notes" names one too (not `certain`), and "the files" or "the three files"
    with no place named the workspace itself (".").

    A path to a file ("out/report.md") names no folder; nor does "the files in the workspace",
    which is the workspace's listing (`engine.step_agent.grounding_call`).
    """
    found: dict[str, bool] = {}
    for match in _FOLDER_PATH.finditer(text):
        found.setdefault((match["dotted"] or match["slashed"]).strip("/"), True)
    for match in _FOLDER_WORD.finditer(text):
        found.setdefault(match["name"], True)
    for match in _FILES_IN.finditer(text):
        if match["name"].lower() not in _NOT_FOLDERS:
            found.setdefault(match["name"], "folder" in match[0].lower() or "directory" in match[0].lower())
    if not found and _THE_FILES.search(text):
        found["."] = True
    return [FolderMention(path, certain) for path, certain in found.items()]
