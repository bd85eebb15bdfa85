"""`web_search`: SearXNG, Brave Search, Tavily, or `local` (the text files of a folder, offline)."""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from ..errors import ToolError
from .selection import rank, words

__all__ = ["SearchBackend", "SearchConfig", "SearchResult", "web_search"]

SearchBackend = Literal["none", "local", "searxng", "brave", "tavily"]
_TEXT_SUFFIXES = frozenset({".txt", ".md", ".rst", ".html", ".htm", ".csv", ".json", ".xml", ".org", ".tex"})
_MAX_FILE_BYTES = 2_000_000
_MAX_FILES = 5000
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
    """The top `num_results` (1 to 20) hits for `query` from the configured backend."""
    if not query.strip():
        raise ToolError("the search query is empty")
    if not 1 <= num_results <= 20:
        raise ToolError(f"num_results must be between 1 and 20, got {num_results}")
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
    for root, directories, files in os.walk(folder, followlinks=False):
        directories.sort()
        for name in sorted(files):
            path = Path(root) / name
            if path.suffix.lower() not in _TEXT_SUFFIXES or path.is_symlink():
                continue
            try:
                if path.stat().st_size > _MAX_FILE_BYTES:
                    continue
                texts[str(path.relative_to(folder))] = path.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            if len(texts) >= _MAX_FILES:
                break
    terms = set(words(query))
    documents = {key: words(key) * 2 + words(text) for key, text in texts.items()}
    matching = {key: terms_ for key, terms_ in documents.items() if terms & set(terms_)}
    return [_local_hit(key, texts[key], terms) for key in rank(query, matching)[:limit]]


def _local_hit(key: str, text: str, terms: set[str]) -> SearchResult:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    title = re.sub(r"^#+\s*", "", lines[0])[:120] if lines else key
    best = max(lines, key=lambda line: len(terms & set(words(line))), default="")
    return SearchResult(title, key, best[:300])
