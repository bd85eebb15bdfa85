"""Every tool argument, fuzzed: a result or a `ToolError`, never another exception, nothing outside touched.

The file tools run against a workspace with planted symlinks (out of it, to a file outside, to
`..`), a FIFO, a tree 1,100 levels deep, a name of 255 bytes and host-acting files; paths are
drawn from those names, `..`, separators, over-long names and any Unicode text (lone surrogates,
control characters and NUL included). Disk failures are injected into each system call in turn.
`generate_image` and `web_search` (its `local` and `none` backends) get the same treatment
without reaching any network beyond 127.0.0.1. Last, what `ToolCalls` makes of a tool that
raises something other than a `ToolError`.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _http_server import Received, Reply, http_server, json_reply
from masterplanner import BudgetExceededError, Settings, ToolError
from masterplanner.engine import Engine, RunOptions
from masterplanner.engine.tool_calls import ToolCalls
from masterplanner.errors import SandboxError
from masterplanner.tools.images import SIZES, ImageConfig, generate_image
from masterplanner.tools.web_search import SearchConfig, SearchResult, web_search
from masterplanner.tools.workspace import MAX_WRITE_DEPTH, FileEntry, Workspace, invalid_text

pytestmark = pytest.mark.security

DEPTH = 1100
LONG_NAME = "n" * 255
HOST_ACTING = {".git/config": "[core]\n", "masterplanner.toml": "[settings]\n", ".envrc": "export A=1\n"}
PLANTED = ["link_out", "link_file", "up", "abs", "fifo", "file.txt", "dir", "deep", LONG_NAME, *HOST_ACTING]
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

ANY_CHARACTER = st.characters(codec=None, exclude_categories=())  # lone surrogates, controls, NUL too
COMPONENTS = st.one_of(
    st.sampled_from([*PLANTED, ".git", ".GIT", ".vscode", "..", ".", "", "d", "a.png", "%2e%2e"]),
    st.text(ANY_CHARACTER, max_size=12),
    st.integers(250, 260).map(lambda n: "a" * n),
    st.integers(120, 130).map(lambda n: "é" * n),  # 2 bytes each: 240 to 260 bytes
)
PATHS = st.one_of(
    st.lists(COMPONENTS, max_size=6).map("/".join),
    st.builds(
        lambda lead, depth, leaf: lead + "deep/" + "d/" * depth + leaf,
        st.sampled_from(["", "./", "/", "../", "up/"]),
        st.integers(0, DEPTH + 2),
        st.sampled_from(["", "leaf.txt", "new.txt", "..", ".git/config"]),
    ),
    st.integers(1, 1500).map(lambda n: "ab/" * n),  # over PATH_MAX from 1,366 on
    st.text(ANY_CHARACTER, max_size=30),
)
NOT_TEXT = st.one_of(st.none(), st.integers(), st.floats(), st.binary(max_size=8), st.lists(st.integers()))
CONTENTS = st.one_of(st.text(ANY_CHARACTER, max_size=40), st.binary(max_size=40), NOT_TEXT)


# --- the arena: a workspace and, beside it, what must never change ---------------------------


def _make_deep(root: Path) -> None:
    folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(DEPTH):
        os.mkdir("d", dir_fd=folder)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=folder)
        os.close(folder)
        folder = inner
    os.close(os.open("leaf.txt", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=folder))
    os.close(folder)


def _remove_deep(root: Path) -> None:
    """Empty and remove the deep tree level by level (`shutil.rmtree` recurses once per level)."""
    for depth in range(DEPTH, -1, -1):
        folder = root / ("d/" * depth)
        if not folder.is_dir():
            continue
        for entry in os.scandir(folder):
            if not entry.is_dir(follow_symlinks=False):
                os.unlink(entry.path)
            elif entry.name != "d":
                _remove_shallow(Path(entry.path))
        folder.rmdir()


def _remove_shallow(folder: Path) -> None:
    for entry in sorted(folder.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    folder.rmdir()


def _plant(workspace: Path, outside: Path) -> None:
    """(Re)create every planted entry that is missing (a fuzzed delete may have removed one)."""
    links = {"link_out": outside, "link_file": outside / "secret.txt", "up": Path(".."), "abs": outside}
    for name, target in links.items():
        if not (workspace / name).is_symlink():
            (workspace / name).symlink_to(target)
    if not (workspace / "fifo").exists():
        os.mkfifo(workspace / "fifo")
    (workspace / "dir").mkdir(exist_ok=True)
    if not (workspace / "file.txt").is_file():
        (workspace / "file.txt").write_text("file")
    if not (workspace / LONG_NAME).is_file():
        (workspace / LONG_NAME).write_text("long")
    for path, text in HOST_ACTING.items():
        (workspace / path).parent.mkdir(exist_ok=True)
        (workspace / path).write_text(text)
    if not (workspace / "deep").exists():
        (workspace / "deep").mkdir()
        _make_deep(workspace / "deep")
    leaf = workspace / ("deep/" + "d/" * DEPTH + "leaf.txt")
    if not leaf.is_file():
        leaf.write_text("")


def _state(folder: Path) -> dict[str, Any]:
    """What is in a (shallow) folder: every entry with its kind, size, time and content."""
    found: dict[str, Any] = {}
    for entry in sorted(folder.rglob("*")):
        info = entry.lstat()
        content = entry.read_bytes() if entry.is_file() and not entry.is_symlink() else None
        found[str(entry.relative_to(folder))] = (info.st_mode, info.st_size, info.st_mtime_ns, content)
    return found


@dataclass
class Arena:
    workspace: Workspace
    outside: Path
    before: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Nothing outside changed; the host-acting files are as planted; no temporary file is left."""
        assert _state(self.outside) == self.before
        for path, text in HOST_ACTING.items():
            assert (self.workspace.root / path).read_text() == text
        _plant(self.workspace.root, self.outside)

    def temporaries(self, path: object) -> list[str]:
        """Temporary files left in the folder a write to `path` would use."""
        if not isinstance(path, str) or "\x00" in path or invalid_text(path):
            return []
        parent = self.workspace.root / PurePosixPath(path.strip()).parent
        try:
            return [name for name in os.listdir(parent) if name.startswith(".masterplanner-")]
        except (OSError, ValueError):
            return []


@pytest.fixture(scope="module")
def arena(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Arena]:
    base = tmp_path_factory.mktemp("fuzz")
    outside = base / "outside"
    (outside / "folder").mkdir(parents=True)
    (outside / "secret.txt").write_text("secret")
    (outside / "folder" / "keep.txt").write_text("keep")
    workspace = Workspace(base / "ws").create()
    _plant(workspace.root, outside)
    yield Arena(workspace, outside, _state(outside))
    _remove_deep(workspace.root / "deep")


def _file_call(workspace: Workspace, action: str, path: Any, content: Any) -> Any:
    calls: dict[str, Callable[[], Any]] = {
        "read_file": lambda: workspace.read_file(path),
        "write_file": lambda: workspace.write_file(path, content),
        "write_bytes": lambda: workspace.write_bytes(path, content),
        "delete_file": lambda: workspace.delete_file(path),
        "list_files": lambda: workspace.list_files(path),
        "is_file": lambda: workspace.is_file(path),
    }
    return calls[action]()


ACTIONS = st.sampled_from(["read_file", "write_file", "write_bytes", "delete_file", "list_files", "is_file"])


@FUZZ
@given(action=ACTIONS, path=st.one_of(PATHS, NOT_TEXT), content=CONTENTS)
def test_file_tools_answer_or_refuse_and_stay_inside(
    arena: Arena, action: str, path: Any, content: Any
) -> None:
    try:
        result = _file_call(arena.workspace, action, path, content)
    except ToolError as error:
        assert str(error) and invalid_text(str(error)) is None  # showable: surrogates escaped
    else:
        expected = {"is_file": bool, "list_files": list}.get(action, str)
        assert isinstance(result, expected)
        if action == "list_files":
            assert all(isinstance(entry, FileEntry) and invalid_text(entry.name) is None for entry in result)
        if action in ("write_file", "write_bytes"):
            assert len(PurePosixPath(path.strip()).parts) <= MAX_WRITE_DEPTH
    assert arena.temporaries(path) == []
    arena.check()


# --- disk failures, injected into one system call at a time ----------------------------------

SYSCALLS = [
    "open",
    "mkdir",
    "read",
    "write",
    "fsync",
    "close",
    "rename",
    "unlink",
    "stat",
    "fstat",
    "listdir",
]
ERRNOS = [
    errno.ENOSPC,
    errno.EDQUOT,
    errno.EROFS,
    errno.EACCES,
    errno.EPERM,
    errno.EIO,
    errno.ENAMETOOLONG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
    errno.ENOENT,
    errno.EMFILE,
    errno.EFBIG,
    errno.ESTALE,
    errno.EOVERFLOW,
]


@contextmanager
def _failing(name: str, code: int, after: int) -> Iterator[None]:
    """`os.<name>` fails with `code` from its `after`-th call on (a failing close still closes)."""
    real = getattr(os, name)
    calls = 0

    def fail(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        if calls <= after:
            return real(*args, **kwargs)
        if name == "close":
            real(*args, **kwargs)
        raise OSError(code, os.strerror(code))

    setattr(os, name, fail)
    try:
        yield
    finally:
        setattr(os, name, real)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    action=ACTIONS,
    path=st.sampled_from(["a.txt", "new/b.txt", "file.txt", "dir", "dir/c.txt", ".", LONG_NAME]),
    syscall=st.sampled_from(SYSCALLS),
    code=st.sampled_from(ERRNOS),
    after=st.integers(0, 4),
)
def test_disk_failures_are_tool_errors_and_leave_no_temporary_file(
    tmp_path: Path, action: str, path: str, syscall: str, code: int, after: int
) -> None:
    workspace = Workspace(tmp_path / "faults").create()
    (workspace.root / "dir").mkdir(exist_ok=True)
    (workspace.root / "a.txt").write_text("a")
    (workspace.root / LONG_NAME).write_text("long")
    (workspace.root / "file.txt").write_text("file")
    with _failing(syscall, code, after):
        try:
            _file_call(workspace, action, path, "content")
        except ToolError as error:
            message = str(error)
        else:
            message = ""
    if message:
        assert "Errno" not in message and "Traceback" not in message
    leftovers = [p.name for p in workspace.root.rglob(".masterplanner-*")]
    assert leftovers == []


# --- generate_image: validated before the images API (a local one that refuses) is called ---


@dataclass
class ImagesApi:
    url: str
    requests: list[dict[str, Any]] = field(default_factory=list)


@pytest.fixture(scope="module")
def refusing_images_api() -> Iterator[ImagesApi]:
    """An images API on 127.0.0.1 that refuses every request at once (400, so no retry)."""
    api = ImagesApi("")

    def refuse(request: Received) -> Reply:
        api.requests.append(request.json())
        return json_reply({"error": {"message": "refused", "type": "invalid_request_error"}}, 400)

    with http_server(refuse) as server:
        api.url = f"{server.url}/v1"
        yield api


@FUZZ
@given(
    prompt=st.one_of(st.text(ANY_CHARACTER, max_size=30), st.just("a lighthouse"), NOT_TEXT),
    path=st.one_of(PATHS.map(lambda p: p + ".png"), PATHS, NOT_TEXT),
    size=st.one_of(st.sampled_from(SIZES), st.text(ANY_CHARACTER, max_size=10), NOT_TEXT),
)
def test_generate_image_validates_every_argument_before_calling_out(
    arena: Arena,
    refusing_images_api: ImagesApi,
    monkeypatch: pytest.MonkeyPatch,
    prompt: Any,
    path: Any,
    size: Any,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fuzz")
    config = ImageConfig(base_url=refusing_images_api.url, timeout_s=5)
    seen = len(refusing_images_api.requests)
    with pytest.raises(ToolError) as refused:
        asyncio.run(generate_image(config, arena.workspace, prompt, path, size))
    if len(refusing_images_api.requests) > seen:
        # Only a call whose every argument is valid reaches the API.
        assert isinstance(prompt, str) and prompt.strip() and invalid_text(prompt) is None
        assert size in SIZES
        arena.workspace.check_write_path(path)
        assert str(refused.value) == (
            f"the images API at {refusing_images_api.url} failed with HTTP 400: it refused the request"
        )
    arena.check()


def test_generate_image_against_a_port_that_refuses_connections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as probe:  # a port that was free a moment ago: nothing listens there
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fuzz")
    config = ImageConfig(base_url=f"http://127.0.0.1:{port}/v1", timeout_s=5)
    workspace = Workspace(tmp_path / "ws").create()
    with pytest.raises(
        ToolError, match=rf"^could not reach the images API at http://127\.0\.0\.1:{port}/v1$"
    ):
        asyncio.run(generate_image(config, workspace, "a lighthouse", "art/light.png"))
    assert list(workspace.root.iterdir()) == []


# --- web_search: the local folder and no backend -----------------------------------------------


@pytest.fixture(scope="module")
def search_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("search")
    (folder / "tides.md").write_text("# Tides\nThe moon pulls the sea.\n")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (folder / "latin1.txt").write_bytes("café moon".encode("latin-1"))
    (folder / "two\nlines.md").write_text("moon\nsea\n")
    os.close(os.open(os.path.join(os.fsencode(folder), b"bad\xff name.txt"), os.O_CREAT | os.O_WRONLY))
    os.mkfifo(folder / "pipe.txt")  # would block a plain open() forever
    (folder / "link.md").symlink_to("/etc/passwd")
    (folder / "sub").mkdir()
    (folder / "sub" / "moon.md").write_text("The moon orbits the earth.\n")
    return folder


COUNTS = st.one_of(
    st.integers(-3, 25),
    st.sampled_from([0, -1, 10**9, -(10**18), 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
QUERIES = st.one_of(
    st.text(ANY_CHARACTER, max_size=40),
    st.sampled_from(["moon", "sea tides", "  ", "bad", "\udcff", "lines"]),
    st.integers(1990, 2010).map(lambda n: "moon " * (n // 5) + "x" * (n % 5)),
    NOT_TEXT,
)


@FUZZ
@given(backend=st.sampled_from(["local", "none"]), query=QUERIES, num_results=COUNTS)
def test_web_search_answers_or_refuses_any_query_and_count(
    search_folder: Path, backend: Any, query: Any, num_results: Any
) -> None:
    config = SearchConfig(backend=backend, folder=search_folder)
    try:
        hits = asyncio.run(web_search(config, query, num_results))
    except ToolError as error:
        assert str(error)
        return
    assert backend == "local"
    assert isinstance(num_results, int | float) and 1 <= num_results <= 20
    assert isinstance(hits, list) and len(hits) <= num_results
    assert all(isinstance(hit, SearchResult) for hit in hits)
    assert "pipe.txt" not in {hit.url for hit in hits}


# --- what the engine makes of a tool that raises something else -----------------------------


@dataclass
class _Events:
    """Stands in for the run store: `ToolCalls` only appends events."""

    appended: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def append_event(self, run_id: str, kind: str, step: str | None, data: dict[str, Any]) -> None:
        self.appended.append((kind, data))

    def call_started(self, run_id: str, step_id: str, call: str) -> bool:
        return any(kind == "tool_called" and data.get("call") == call for kind, data in self.appended)


def _calls(events: _Events) -> ToolCalls:
    return ToolCalls(store=events, run_id="r", step_id="s", policy=lambda name: "auto")  # type: ignore[arg-type]


def _raise(error: BaseException) -> Callable[[], str]:
    def call() -> str:
        raise error

    return call


@pytest.mark.parametrize(
    ("error", "told"),
    [
        (
            RuntimeError("disk on fire\nFor more information check: https://example.org/help"),
            "read_file failed: RuntimeError: disk on fire",
        ),
        (
            OSError(errno.ENAMETOOLONG, "File name too long"),
            "read_file failed: OSError: [Errno 36] File name too long",
        ),
        (
            UnicodeEncodeError("utf-8", "\udcff", 0, 1, "surrogates not allowed"),
            "read_file failed: UnicodeEncodeError:",
        ),
        (ValueError("x" * 2000), "read_file failed: ValueError: xxx"),
        (ToolError("'bad\udcff' is refused"), "'bad\\udcff' is refused"),
        (
            ToolError(
                "web search (searxng) failed: HTTPStatusError: Client error '404 Not Found' for url "
                "'http://127.0.0.1/search'\nFor more information check: https://developer.mozilla.org/404"
            ),
            "web search (searxng) failed: HTTPStatusError: Client error '404 Not Found' for url "
            "'http://127.0.0.1/search'",
        ),
    ],
)
def test_a_tool_that_raises_is_a_tool_error_the_agent_sees(error: Exception, told: str) -> None:
    events = _Events()
    ok, text = asyncio.run(_calls(events)._call("read_file", {"path": "x\udcff"}, _raise(error)))
    assert not ok
    assert text.startswith(told) and (text == told or not isinstance(error, ToolError))
    assert len(text) <= 500 and invalid_text(text) is None and "For more information" not in text
    assert events.appended == [
        ("tool_called", {"tool": "read_file", "arguments": {"path": "x\\udcff"}}),
        ("tool_result", {"tool": "read_file", "error": text}),
    ]


@pytest.mark.parametrize(
    "error",
    [
        asyncio.CancelledError(),
        KeyboardInterrupt(),
        BudgetExceededError("the run used its budget of 3 model calls"),
        SandboxError("the code sandbox cannot start: bwrap is missing"),
    ],
)
def test_cancellation_budget_and_configuration_errors_still_stop_the_step(error: BaseException) -> None:
    events = _Events()
    with pytest.raises(type(error)):
        asyncio.run(_calls(events)._call("code_execution", {}, _raise(error)))


def test_a_call_the_fence_stops_is_not_made_and_leaves_no_event() -> None:
    from dbos._error import DBOSWorkflowConflictIDError

    events, made = _Events(), []

    def lapsed() -> None:  # runtime.keep_lease in a worker whose lease lapsed
        raise DBOSWorkflowConflictIDError("r.s")

    calls = ToolCalls(store=events, run_id="r", step_id="s", policy=lambda name: "auto", fence=lapsed)  # type: ignore[arg-type]
    with pytest.raises(DBOSWorkflowConflictIDError):  # a BaseException: no DBOS step records it
        asyncio.run(calls._call("write_file", {"path": "a.txt"}, lambda: made.append(1) or "written"))
    assert made == [] and events.appended == []
    # a fence that lets it through: the call is made as before
    calls.fence = lambda: None
    assert asyncio.run(calls._call("write_file", {"path": "a.txt"}, lambda: made.append(1) or "written")) == (
        True,
        "written",
    )
    assert made == [1] and [kind for kind, _data in events.appended] == ["tool_called", "tool_result"]


class _InStep:
    """Stands in for DBOS inside step 3 of workflow `r.s` (a replay runs the same step again)."""

    workflow_id = "r.s"
    step_id = 3


def test_a_call_cut_off_by_a_stop_is_made_again_only_when_its_tool_is_repeatable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from masterplanner.engine import tool_calls

    monkeypatch.setattr(tool_calls, "DBOS", _InStep)
    events, made = _Events(), []
    calls = ToolCalls(
        store=events,  # type: ignore[arg-type]
        run_id="r",
        step_id="s",
        policy=lambda name: "auto",
        repeatable=lambda name: name == "write_file",
    )
    events.appended.append(("tool_called", {"tool": "http_request", "arguments": {}, "call": "r.s#3"}))
    ok, text = asyncio.run(calls._call("http_request", {"method": "POST"}, lambda: made.append(1) or "sent"))
    told = (
        "http_request: an earlier try of this call was cut off when its process stopped; it may have "
        "taken effect, so it was not made again. Check its effect before calling it again."
    )
    assert (ok, text, made) == (False, told, [])
    assert events.appended[-1] == ("tool_result", {"tool": "http_request", "error": told})
    # a repeatable tool's call cut off the same way is made again
    events.appended[:] = [("tool_called", {"tool": "write_file", "arguments": {}, "call": "r.s#3"})]
    assert asyncio.run(calls._call("write_file", {"path": "a"}, lambda: made.append(2) or "written")) == (
        True,
        "written",
    )
    assert made == [2]
    assert events.appended[1:] == [
        ("tool_called", {"tool": "write_file", "arguments": {"path": "a"}, "call": "r.s#3"}),
        ("tool_result", {"tool": "write_file", "result": "written"}),
    ]
    # a first try (nothing recorded under its call) is made
    events.appended.clear()
    assert asyncio.run(calls._call("http_request", {}, lambda: made.append(3) or "sent")) == (True, "sent")
    assert made == [2, 3]


def test_the_shipped_tools_say_which_calls_may_be_made_again_after_a_stop() -> None:
    from masterplanner.tools.builtin import builtin_catalog

    assert sorted(spec.name for spec in builtin_catalog() if spec.repeatable) == [
        "ask_user",
        "delete_file",
        "list_files",
        "read_file",
        "recall",
        "web_search",
        "write_file",
    ]


async def test_a_tool_failure_does_not_fail_the_step(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: Workspace, path: str) -> tuple[str, int]:
        raise RuntimeError(f"cannot read {path}\nFor more information check: https://example.org/help")

    monkeypatch.setattr(Workspace, "read_start", broken)  # what the read_file tool reads with
    step = {
        "id": "w",
        "title": "copy the notes",
        "instruction": "Read notes.txt and write copy.txt.",
        "agent_role": "worker",
        "tools": ["read_file", "write_file"],
        "depends_on": [],
        "expected_output": "copy.txt",
    }
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {"purpose": "step:w", "tool_calls": [{"name": "read_file", "args": {"path": "notes.txt"}}]},
            {
                "purpose": "step:w",
                "tool_calls": [{"name": "write_file", "args": {"path": "copy.txt", "content": "none"}}],
            },
            {"purpose": "step:w", "output": "notes.txt could not be read; wrote copy.txt"},
            {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True},
        ]
    )
    engine = Engine(Settings.load())
    try:
        options = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01)
        workspace = tmp_path / "ws"
        workspace.mkdir()
        run = engine.create_run("copy", model=f"scripted:{script}", options=options, workspace=workspace)
        final = await engine.execute(run.id)
        results = [event.data for event in engine.store.events(run.id) if event.kind == "tool_result"]
    finally:
        engine.close()
    assert final.status == "succeeded", final.error
    assert results == [
        {"tool": "read_file", "error": "read_file failed: RuntimeError: cannot read notes.txt"},
        {"tool": "write_file", "result": "wrote 4 bytes to copy.txt"},
    ]
    assert (workspace / "copy.txt").read_text() == "none"


async def test_what_no_tool_can_take_is_said_to_the_agent_in_our_words(
    isolated: Path, write_script: Callable[..., Path], tmp_path: Path
) -> None:
    """A NUL or lone surrogate in code was Python's ValueError / UnicodeEncodeError; a surrogate
    in any call failed the step in the scripted model; a listing cut at 500 entries said nothing."""
    step = {
        "id": "w",
        "title": "look around",
        "instruction": "List the files, run code, write a file.",
        "agent_role": "worker",
        "tools": ["list_files", "code_execution", "write_file"],
        "depends_on": [],
        "expected_output": "done",
    }
    calls = [
        {"name": "list_files", "args": {"path": "."}},
        {"name": "code_execution", "args": {"language": "python", "code": "print('\x00')"}},
        {"name": "code_execution", "args": {"language": "python", "code": "print(1)", "stdin": "\ud800"}},
        {"name": "write_file", "args": {"path": "a.txt", "content": "x\ud800"}},
    ]
    told = [
        "[listing cut: the first 500 of 501 entries, sorted by name]",
        "code holds a NUL character at character 7, which no program takes",
        "stdin has a lone surrogate (U+D800) at character 0, which is not valid text",
        "lone surrogate (U+D800) at character 1",
    ]
    script = write_script(
        [
            {"purpose": "planner", "output": {"steps": [step]}},
            {"purpose": "step:w", "tool_calls": calls},
            {"purpose": "step:w", "expect": told, "output": "done"},
            {"purpose": "prompt_creator", "output": "You are a worker. Do the step.", "repeat": True},
        ]
    )
    workspace = tmp_path / "ws"
    workspace.mkdir()
    for number in range(501):
        (workspace / f"f{number:03d}.txt").write_text("")
    engine = Engine(Settings.load())
    try:
        options = RunOptions(auto_approve=True, prompt_rounds=0, retry_backoff_s=0.01)
        run = engine.create_run("look", model=f"scripted:{script}", options=options, workspace=workspace)
        final = await engine.execute(run.id)
    finally:
        engine.close()
    assert (final.status, final.output) == ("succeeded", "done"), final.error
    assert not (workspace / "a.txt").exists()
