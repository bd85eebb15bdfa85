"""Pick the tools relevant to a task before planning, for catalogs too large to show in full.

Catalogs can be larger than a model's context (one benchmark catalog has 260 tools; MCP servers
expose hundreds). `preselect` ranks the catalog against the task with BM25 over each tool's name
(split into words) and description, and keeps the best `limit`, best first: small models tend to
pick the first tools they are offered (the embedded 135M model chose the first entries of the
tools enum whatever the task), so the order itself is a hint. `best_tools` ranks a catalog against
one action, for narrowing a single step's choice.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter

from .catalog import Catalog, ToolSpec

__all__ = ["DEFAULT_PRESELECT", "STOP_WORDS", "best_tools", "index_terms", "preselect", "rank", "words"]

DEFAULT_PRESELECT = 20
_RUN = re.compile(r"(?:[A-Za-z0-9]|[^\x00-\x7f])+")
"""A stretch of ASCII letters and digits and any other characters: what `_split` takes apart."""
_ASCII_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
"""An ASCII stretch's words: CamelCase split (`parseHTTPResponse`: parse, HTTP, Response), digits apart."""
STOP_WORDS = frozenset(
    "a an and the of to for in on with by from is are be it its this that as at or me my i".split()
)


def words(text: str) -> list[str]:
    """Lower-case word stems: CamelCase and snake_case split, stop words dropped, plural 's' removed.

    Words of any script: letters with their combining marks (`हिन्दी`), split where case says a
    word starts (`ÄrgerBericht`). A script written without spaces keeps a stretch whole (`報告書を書く`),
    as the registry's text index does. One letter alone is no word, unless of a script without
    case (`猫`).
    """
    found = []
    for word in _split(text):
        word = word.lower()
        if word in STOP_WORDS or (len(word) < 2 and (word.islower() or word.isdigit())):
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        found.append(word)
    return found


def _split(text: str) -> list[str]:
    """`text`'s words as written: ASCII ones by `_ASCII_WORD`, the others by their Unicode categories.

    (Before, only ASCII letters made words: "Ärger" gave "rger", a Japanese task none.)
    """
    found: list[str] = []
    for run in _RUN.findall(text):
        if run.isascii():
            found += _ASCII_WORD.findall(run)
        else:  # composed: "A" and a combining diaeresis is the "Ä" typed elsewhere
            found += _unicode_words(unicodedata.normalize("NFC", run))
    return found


def index_terms(text: str) -> list[str]:
    """`text`'s stretches of letters (with their marks) and digits, as the registry's text indexes cut them.

    (Before, a search cut "हिन्दी" at its vowel signs, which the indexes keep, and found nothing.)
    """
    found: list[str] = []
    for run in _RUN.findall(text):
        if run.isascii():
            found.append(run)
            continue
        term = ""
        for character in unicodedata.normalize("NFC", run):
            if unicodedata.category(character)[0] in "LMN":
                term += character
            elif term:
                found.append(term)
                term = ""
        if term:
            found.append(term)
    return found


def _unicode_words(run: str) -> list[str]:
    """`run`'s stretches of letters (with their marks) and of digits, split where case starts a word."""
    found: list[str] = []
    start, kind, case = 0, "", ""
    for index, character in enumerate(run):
        category = unicodedata.category(character)
        now = "digit" if category == "Nd" else "letter" if category[0] in "LMN" else ""
        if now != kind or (now == "letter" and _starts_word(category, case, run[index + 1 : index + 2])):
            if kind:
                found.append(run[start:index])
            start, kind, case = index, now, ""
        if category in ("Lu", "Ll"):
            case = category  # the last cased letter's (a mark has none)
    if kind:
        found.append(run[start:])
    return found


def _starts_word(category: str, case: str, following: str) -> bool:
    """Whether a letter of `category` after one of `case` starts a word, as in fooBar and HTTPServer."""
    if category != "Lu":
        return False
    return case == "Ll" or (case == "Lu" and following != "" and unicodedata.category(following) == "Ll")


def _document(tool: ToolSpec) -> list[str]:
    return words(tool.name) * 2 + words(tool.description)


def rank(query: str, documents: dict[str, list[str]]) -> list[str]:
    """Document keys ordered by BM25 score against `query` (ties keep the given order)."""
    counts = {key: Counter(terms) for key, terms in documents.items()}
    if not counts:
        return []
    average = sum(sum(doc.values()) for doc in counts.values()) / len(counts) or 1.0
    frequency = Counter(term for doc in counts.values() for term in doc)
    terms = set(words(query))
    k1, b = 1.2, 0.75

    def score(key: str) -> float:
        doc = counts[key]
        length = sum(doc.values())
        total = 0.0
        for term in terms & doc.keys():
            idf = math.log(1 + (len(counts) - frequency[term] + 0.5) / (frequency[term] + 0.5))
            total += idf * doc[term] * (k1 + 1) / (doc[term] + k1 * (1 - b + b * length / average))
        return total

    order = {key: index for index, key in enumerate(counts)}
    scores = {key: score(key) for key in counts}
    return sorted(counts, key=lambda key: (-scores[key], order[key]))


def best_tools(text: str, catalog: Catalog, limit: int) -> list[str]:
    """The names of the `limit` tools of `catalog` that best match `text`, best first."""
    return rank(text, {tool.name: _document(tool) for tool in catalog})[:limit]


def preselect(task: str, catalog: Catalog, limit: int = DEFAULT_PRESELECT) -> Catalog:
    """The `limit` tools of `catalog` that best match `task`, best first (all of them if that few)."""
    return Catalog(catalog[name] for name in best_tools(task, catalog, limit))
