"""web_search: the offline folder backend, SearXNG's JSON API (a real local server), and clear errors."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from _deep_folders import deep_folders
from _http_server import Received, Reply, http_server, json_reply
from masterplanner import ToolError
from masterplanner.tools.web_search import SearchConfig, SearchResult, web_search


def test_local_folder_search_ranks_files_and_quotes_the_best_line(tmp_path: Path) -> None:
    (tmp_path / "tides.md").write_text("# Tides\nThe moon pulls the sea.\nTides rise twice a day.\n")
    (tmp_path / "deserts.txt").write_text("Deserts are dry.\nSand everywhere.\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "moon.md").write_text("# The Moon\nThe moon orbits the earth.\n")
    (tmp_path / "image.png").write_bytes(b"\x89PNG moon moon moon")
    (tmp_path / "link.md").symlink_to(tmp_path / "tides.md")
    config = SearchConfig(backend="local", folder=tmp_path)
    hits = asyncio.run(web_search(config, "why do tides rise", 5))
    assert hits == [SearchResult("Tides", "tides.md", "Tides rise twice a day.")]
    moon = asyncio.run(web_search(config, "moon", 5))
    assert [hit.url for hit in moon] == ["sub/moon.md", "tides.md"]
    assert asyncio.run(web_search(config, "volcano", 5)) == []


def test_local_folder_search_finds_files_under_folders_nested_past_python_s_recursion(tmp_path: Path) -> None:
    """Before, `os.walk` recursed, and the search failed with a `RecursionError`."""
    (tmp_path / "tides.md").write_text("# Tides\nThe moon pulls the sea.\n")
    with deep_folders(tmp_path, "moon.md", "# Moon\nThe moon orbits the earth.\n") as depth:
        hits = asyncio.run(web_search(SearchConfig(backend="local", folder=tmp_path), "moon", 5))
    assert [hit.url for hit in hits] == [f"{'d/' * depth}moon.md", "tides.md"]


def test_no_backend_says_how_to_configure_one() -> None:
    with pytest.raises(
        ToolError, match="no web search backend is configured: set web_search_backend to local"
    ):
        asyncio.run(web_search(SearchConfig(), "x"))
    with pytest.raises(ToolError, match="BRAVE_API_KEY, which is not set"):
        asyncio.run(web_search(SearchConfig(backend="brave"), "x"))
    with pytest.raises(ToolError, match="num_results must be between 1 and 20"):
        asyncio.run(web_search(SearchConfig(backend="local", folder=Path(".")), "x", 50))


@pytest.fixture
def searxng() -> Iterator[str]:
    def search(request: Received) -> Reply:
        assert request.path.startswith("/search?q=sea+tides&format=json")
        hit = {"title": "Tide", "url": "https://example.org/tide", "content": "Tides are..."}
        return json_reply({"results": [hit] * 3})

    with http_server(search) as server:
        yield server.url


def test_searxng_json_api(searxng: str) -> None:
    hits = asyncio.run(web_search(SearchConfig(backend="searxng", searxng_url=searxng), "sea tides", 2))
    assert hits == [SearchResult("Tide", "https://example.org/tide", "Tides are...")] * 2
