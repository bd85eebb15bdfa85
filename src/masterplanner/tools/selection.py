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
from collections import Counter

from .catalog import Catalog, ToolSpec

__all__ = ["DEFAULT_PRESELECT", "STOP_WORDS", "best_tools", "preselect", "rank", "words"]

DEFAULT_PRESELECT = 20
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+")
STOP_WORDS = frozenset(
    "a an and the of to for in on with by from is are be it its this that as at or me my i".split()
)


def words(text: str) -> list[str]:
    """Lower-case word stems: CamelCase and snake_case split, stop words dropped, plural 's' removed."""
    found = []
    for word in _WORD.findall(text):
        word = word.lower()
        if word in STOP_WORDS or len(word) < 2:
            continue
        if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        found.append(word)
    return found


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
