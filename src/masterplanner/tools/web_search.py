"""`web_search`: SearXNG, Brave Search, Tavily, or `local` (the text files of a folder, offline)."""

from __future__ import annotations

import asyncio
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from ..errors import ToolError
from .selection import rank, words
from .workspace import invalid_text, walk_files

__all__ = ["MAX_QUERY_CHARS", "SearchBackend", "SearchConfig", "SearchResult", "web_search"]

SearchBackend = Literal["none", "local", "searxng", "brave", "tavily"]
_TEXT_SUFFIXES = frozenset({".txt", ".md", ".rst", ".html", ".htm", ".csv", ".json", ".xml", ".org", ".tex"})
_MAX_FILE_BYTES = 2_000_000
_MAX_FILES = 5000
MAX_QUERY_CHARS = 2000
"""Longest query sent to a backend (search engines cut far shorter ones)."""
_HOW_TO = (
    "set web_search_backend to local (and web_search_folder), searxng (and searxng_url), "
    "brave (and BRAVE_API_KEY) or tavily (and TAVILY_API_KEY)"
)


@dataclass(frozen=True)
class SearchConfig:
    """Which backend answers searches, and where it is."""

    backend: SearchBackend = "none"
    folder: Path | None = None
    searxng_url: str | None = None
    timeout_s: float = 15.0


@dataclass(frozen=True)
class SearchResult:
    """One hit."""

    title: str
    url: str
    snippet: str


async def web_search(config: SearchConfig, query: str, num_results: int = 5) -> list[SearchResult]:
    """The top `num_results` (1 to 20) hits for `query` from the configured backend.

    The arguments are checked before any backend is asked: the query must be text that can be
    sent (at most `MAX_QUERY_CHARS`, no lone surrogate), `num_results` a whole number (a float
    such as 5.0 counts as 5) from 1 to 20.
    """
    query = _checked_query(query)
    num_results = _checked_count(num_results)
    match config.backend:
        case "local":
            if config.folder is None:
                raise ToolError("web_search_backend is local but web_search_folder is not set")
            return await asyncio.to_thread(_search_folder, config.folder, query, num_results)
        case "searxng":
            if not config.searxng_url:
                raise ToolError("web_search_backend is searxng but searxng_url is not set")
            data = await _get_json(
                config, config.searxng_url.rstrip("/") + "/search", params={"q": query, "format": "json"}
            )
            hits = data.get("results", [])
            return [_hit(hit, "content") for hit in hits[:num_results]]
        case "brave":
            key = _key("BRAVE_API_KEY")
            data = await _get_json(
                config,
                "https://api.search.brave.com/res/v1/web/search",
                params={"q": query, "count": num_results},
                headers={"X-Subscription-Token": key, "Accept": "application/json"},
            )
            return [_hit(hit, "description") for hit in data.get("web", {}).get("results", [])[:num_results]]
        case "tavily":
            key = _key("TAVILY_API_KEY")
            data = await _post_json(
                config,
                "https://api.tavily.com/search",
                {"api_key": key, "query": query, "max_results": num_results},
            )
            return [_hit(hit, "content") for hit in data.get("results", [])[:num_results]]
    raise ToolError(f"no web search backend is configured: {_HOW_TO}")


def _checked_query(query: object) -> str:
    if not isinstance(query, str):
        raise ToolError(f"the search query must be text, got {type(query).__name__}")
    if not query.strip():
        raise ToolError("the search query is empty")
    if len(query) > MAX_QUERY_CHARS:
        raise ToolError(f"the search query is {len(query):,} characters; the limit is {MAX_QUERY_CHARS:,}")
    invalid = invalid_text(query)
    if invalid is not None:
        raise ToolError(f"the search query has {invalid}, which is not valid text")
    return query


def _checked_count(num_results: object) -> int:
    count = num_results
    if isinstance(count, float) and count.is_integer():
        count = int(count)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 20:
        shown = repr(num_results)
        raise ToolError(f"num_results must be between 1 and 20 (a whole number), got {shown[:40]}")
    return count


def _key(variable: str) -> str:
    value = os.environ.get(variable)
    if not value:
        raise ToolError(f"web search needs the environment variable {variable}, which is not set")
    return value


def _hit(hit: Any, snippet_key: str) -> SearchResult:
    if not isinstance(hit, dict):
        return SearchResult("", "", str(hit)[:300])
    return SearchResult(
        str(hit.get("title", "")), str(hit.get("url", "")), str(hit.get(snippet_key, ""))[:500]
    )


async def _get_json(config: SearchConfig, url: str, **options: Any) -> dict[str, Any]:
    try:
        async with httpx.AsyncClient(timeout=config.timeout_s) as client:
            response = await client.get(url, **options)
            response.raise_for_status()
            data = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise ToolError(f"web search ({config.backend}) failed: {type(exc).__name__}: {exc}") from None
    return data if isinstance(data, dict) else {}


async def _post_json(config: SearchConfig, url: str, payload: dict[str, Any]) -> dict[str, Any]:
    try:
        async with httpx.AsyncClient(timeout=config.timeout_s) as client:
            response = await client.post(url, json=payload)
            response.raise_for_status()
            data = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        # the message never includes the payload: it carries the API key
        raise ToolError(f"web search ({config.backend}) failed: {type(exc).__name__}") from None
    return data if isinstance(data, dict) else {}


def _search_folder(folder: Path, query: str, limit: int) -> list[SearchResult]:
    if not folder.is_dir():
        raise ToolError(f"web_search_folder {folder} is not a folder")
    texts: dict[str, str] = {}
    for entry in walk_files(folder):  # not `os.walk`: it recursed, and a deep folder chain broke it
        path = Path(entry.path)
        if path.suffix.lower() not in _TEXT_SUFFIXES:
            continue
        text = _regular_text(path)
        if text is None:
            continue
        texts[path.relative_to(folder).as_posix()] = text
        if len(texts) >= _MAX_FILES:
            break
    terms = set(words(query))
    documents = {key: words(key) * 2 + words(text) for key, text in texts.items()}
    matching = {key: terms_ for key, terms_ in documents.items() if terms & set(terms_)}
    return [_local_hit(key, texts[key], terms) for key in rank(query, matching)[:limit]]


def _regular_text(path: Path) -> str | None:
    """The text of a regular file of at most `_MAX_FILE_BYTES`; None for anything else.

    Opened without following a symlink and without blocking, then checked: a FIFO named
    `notes.txt` would otherwise hang the search.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_FILE_BYTES:
                return None
            return handle.read(_MAX_FILE_BYTES).decode("utf-8", errors="replace")
        except OSError:
            return None


def _local_hit(key: str, text: str, terms: set[str]) -> SearchResult:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    title = re.sub(r"^#+\s*", "", lines[0])[:120] if lines else key
    best = max(lines, key=lambda line: len(terms & set(words(line))), default="")
    return SearchResult(title, key, best[:300])
