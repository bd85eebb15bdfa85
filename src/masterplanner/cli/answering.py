"""The terminal of `masterplanner run` as one answerer, among others, of its run's requests.

A run's pauses (plan review, tool approvals, agents' questions, whether to store the team) are
stored requests any process may answer. The terminal that started the run shows each open
request of its run and asks the person, one at a time, with the live display paused. It stops
asking the moment another process (`masterplanner runs answer`, a browser) has answered. When
its input has nothing left to read (a run in the background, `< /dev/null`, a file or pipe that
ran out) it asks nothing: it prints how to answer from another shell and the run waits for that
answer. Input that is not a terminal is read ahead before a question is printed, so `echo a |`
still approves, while a question that could never be answered here is not printed at all.

Lines are read from standard input only while a question waits for one, so nothing the person
types is taken by a question that was answered elsewhere meanwhile, and an editor opened for a
plan edit has the terminal to itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .terminal import shown

if TYPE_CHECKING:
    from rich.console import Console

    from ..plan import Plan
    from ..service import Request, RunService

__all__ = ["Input", "TerminalAnswerer", "how_to_answer"]

_POLL_S = 0.2


class Input:
    """Lines typed on standard input, read only while someone waits for one."""

    def __init__(self) -> None:
        self.closed = False
        self.echoed = False
        """Whether what is typed shows on the screen (the input is a terminal)."""
        self._buffer = b""
        try:
            self._fd: int | None = sys.stdin.fileno()
            self.echoed = os.isatty(self._fd)
        except (AttributeError, OSError, ValueError):
            self._fd = None
            self.closed = True

    @property
    def exhausted(self) -> bool:
        """Whether no line is left to read: the input is closed and all it held was read."""
        return self.closed and not self._buffer

    async def wait(self) -> None:
        """Return once a line can be read at once, or the input is closed (read ahead, kept)."""
        while not self.closed and b"\n" not in self._buffer:
            data = await self._read()
            if data:
                self._buffer += data
            else:
                self.closed = True

    async def line(self) -> str | None:
        """The next line (without its newline), or None once the input is closed."""
        await self.wait()
        if b"\n" in self._buffer:
            line, _, self._buffer = self._buffer.partition(b"\n")
            return line.decode("utf-8", "replace").rstrip("\r")
        if self._buffer:  # a last line without a newline
            line, self._buffer = self._buffer, b""
            return line.decode("utf-8", "replace")
        return None

    async def _read(self) -> bytes:
        assert self._fd is not None
        fd = self._fd
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[bytes] = loop.create_future()

        def on_readable() -> None:
            if ready.done():
                return
            try:
                ready.set_result(os.read(fd, 4096))
            except OSError:
                ready.set_result(b"")

        try:
            loop.add_reader(fd, on_readable)
        except (OSError, ValueError):
            # a regular file or /dev/null cannot be watched; reading it never blocks for long
            return await asyncio.to_thread(os.read, fd, 4096)
        try:
            return await ready
        finally:
            loop.remove_reader(fd)


def how_to_answer(request: Request) -> str:
    """The command that answers `request` from another shell."""
    if request.kind == "ask_user":
        return f"masterplanner runs answer {request.id} --text '…'"
    return f"masterplanner runs answer {request.id} --approve   (or --deny [--reason '…'])"


class TerminalAnswerer:
    """Asks the person about the open requests of one run, one at a time."""

    def __init__(
        self,
        service: RunService,
        run_id: str,
        out: Console,
        *,
        by: str,
        pause: Callable[[], Awaitable[None]],
        resume: Callable[[], None],
    ) -> None:
        self.service = service
        self.run_id = run_id
        self.out = out
        self.by = by
        self.input = Input()
        self._pause = pause
        self._resume = resume
        self._seen: set[str] = set()
        self.asking = asyncio.Lock()

    def detach(self) -> None:
        """Ask from now on without pausing a display (the run's display is gone)."""

        async def nothing() -> None:
            return None

        self._pause = nothing
        self._resume = lambda: None

    async def watch(self) -> None:
        """Take up each open request of the run as it appears (runs until cancelled)."""
        while True:
            for request in await self.service.pending(self.run_id):
                if request.id not in self._seen and request.kind != "remember":
                    await self.take_up(request)
            await asyncio.sleep(_POLL_S)

    async def take_up(self, request: Request) -> None:
        """Ask about one request (or, with input closed, say how to answer it elsewhere)."""
        self._seen.add(request.id)
        async with self.asking:
            await self._pause()
            try:
                await self._ask(request)
            finally:
                self._resume()

    def _print(self, markup: str) -> None:
        self.out.print(markup, highlight=False, soft_wrap=True)

    def _waiting(self, request: Request) -> None:
        self._print(
            f"[yellow]waiting for an answer to request {shown(request.id)}:[/] {shown(request.summary())}\n"
            f"  answer it with: [bold]{shown(how_to_answer(request))}[/]"
        )

    async def _ask(self, request: Request) -> None:
        if self.input.exhausted:
            self._waiting(request)
            return
        from ..errors import PlanError, RequestError

        asked = {
            "plan_review": self._review,
            "replan": self._replan,
            "tool_approval": self._approval,
            "ask_user": self._question,
            "remember": self._remember,
        }[request.kind]
        answer = await asked(request)
        if answer is None:
            return
        try:
            answered = await self.service.answer(request.id, answer, by=self.by)
        except (RequestError, PlanError) as error:
            self._print(f"[yellow]{shown(str(error))}[/]")
            self._seen.discard(request.id)  # still open (a refused answer): asked again
            return
        if answered.follow_up_failed:  # taken: the run goes on
            self._print(f"[yellow]your answer was taken, but {shown(answered.follow_up_failed)}[/]")

    async def _line(self, prompt: str, request: Request, *, optional: bool = False) -> str | None:
        """A line typed for `request`; None when input closed or another process answered first.

        Input that is not a terminal (a pipe, a file, /dev/null) is read ahead before the
        question is printed: with nothing left in it, the question could not be answered here,
        so it is not asked and only the way to answer from elsewhere is printed. An `optional`
        line (one Enter may leave empty) is instead empty when the input is closed.
        """
        if not self.input.echoed:
            if await self._until_answered_elsewhere(self.input.wait(), request, prompted=False):
                return None
            if self.input.exhausted:
                if optional:
                    return ""
                self._waiting(request)
                return None
        self.out.print(f"{prompt} ", end="", highlight=False, markup=False)
        reading = asyncio.ensure_future(self.input.line())
        if await self._until_answered_elsewhere(reading, request, prompted=True):
            return None
        line = reading.result()
        if line is None or not self.input.echoed:
            self.out.print()  # input that is not a terminal is not echoed: end the prompt's line
        if line is None:
            if optional:
                return ""
            self._waiting(request)
        return line

    async def _until_answered_elsewhere(
        self, reading: Awaitable[object], request: Request, *, prompted: bool
    ) -> bool:
        """Await `reading`; True (and said) if another process answered `request` first.

        `prompted`: a question is printed and waits on its line, which the note then ends.
        """
        read = asyncio.ensure_future(reading)
        watching = asyncio.ensure_future(self._answered_elsewhere(request.id))
        done, _ = await asyncio.wait({read, watching}, return_when=asyncio.FIRST_COMPLETED)
        for task in (read, watching):
            if task not in done:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if watching not in done:
            return False
        current = watching.result()
        if prompted:
            self.out.print()
        by = f" by {current.answered_by}" if current.answered_by else ""
        self._print(f"[dim]request {shown(current.id)} was {shown(current.state)}{shown(by)} meanwhile[/]")
        return True

    async def _answered_elsewhere(self, request_id: str) -> Request:
        while True:
            await asyncio.sleep(_POLL_S)
            current = await self.service.request(request_id)
            if current.state != "open":
                return current

    async def _yes_no(self, prompt: str, request: Request, *, default: bool) -> bool | None:
        while True:
            line = await self._line(f"{prompt} [{'Y/n' if default else 'y/N'}]", request)
            if line is None:
                return None
            word = line.strip().lower()
            if not word:
                return default
            if word in ("y", "yes", "n", "no"):
                return word.startswith("y")
            self._print("answer y or n")

    async def _approval(self, request: Request) -> dict[str, Any] | None:
        payload = request.payload
        self._print(f"[bold]step {shown(request.step_id)} wants to call {shown(payload.get('tool'))}[/]")
        for key, value in (payload.get("arguments") or {}).items():
            self._print(f"[dim]{shown(key)}:[/] {shown(value, lines=True)}")
        allowed = await self._yes_no("allow this call?", request, default=False)
        return None if allowed is None else {"approved": allowed}

    async def _question(self, request: Request) -> dict[str, Any] | None:
        self._print(f"[bold]an agent asks:[/] {shown(request.payload.get('question', ''), lines=True)}")
        line = await self._line("your answer:", request)
        return None if line is None else {"text": line}

    async def _remember(self, request: Request) -> dict[str, Any] | None:
        agents = request.payload.get("agents", 0)
        store = await self._yes_no(
            f"store this run's team ({agents} agents) in the registry for similar tasks?",
            request,
            default=True,
        )
        return None if store is None else {"approved": store}

    async def _replan(self, request: Request) -> dict[str, Any] | None:
        """Say which step failed and what replaces it, then review the revised plan."""
        payload = request.payload
        self._print(
            f"[bold]step {shown(request.step_id)} failed:[/] {shown(payload.get('error', ''), lines=True)}"
        )
        replaced = ", ".join(payload.get("replaced_steps") or []) or "none"
        new = ", ".join(payload.get("new_steps") or []) or "none"
        self._print(f"[bold]replanned:[/] steps {shown(replaced)} replaced by {shown(new)}")
        for note in payload.get("notes") or []:
            by = f"note {shown(note['key'])} (by {shown(note['step'])})"
            self._print(f"[dim]{by}:[/] {shown(note['value'])}")
        return await self._review(request)

    async def _rejection(self, request: Request) -> dict[str, Any] | None:
        """A review's rejection with the reason typed for it (Enter, or input closed: none).

        The reason goes with the answer, as the web page's and `runs answer --reason` do, so the
        run's `rejected` event and `runs audit` show it; None if another process answered first.
        """
        line = await self._line("reason for the rejection (Enter for none):", request, optional=True)
        if line is None:
            return None
        reason = line.strip()
        return {"action": "reject"} | ({"reason": reason} if reason else {})

    async def _estimate(self, plan: Plan) -> str:
        """What running the plan's steps will likely take and cost (`estimate.estimate_run`)."""
        from ..estimate import estimate_run

        run = await self.service.get(self.run_id)
        usage = await self.service.usage(self.run_id)
        done = {step.id for step in await self.service.steps(self.run_id) if step.status == "succeeded"}
        parallel = run.options.max_parallel
        estimate = estimate_run(plan.to_json_dict(), usage, run.model, max_parallel=parallel, done=done)
        return f"{estimate.text()} ({estimate.basis()})"

    def _review_notes(self, payload: dict[str, Any]) -> None:
        """What the person should know before the plan: a refused edit, cautions, a team reused or not."""
        if payload.get("refused_edit"):
            self._print(f"[red]the last edit was refused:[/] {shown(payload['refused_edit'])}")
        for caution in payload.get("cautions") or []:
            self._print(f"[yellow]caution:[/] {shown(caution)}")
        if payload.get("reused_team"):
            self._print(shown(payload["reused_team"]))
        if payload.get("not_reused"):
            self._print(f"[yellow]stored team not reused:[/] {shown(payload['not_reused'])}; planned afresh")

    async def _review(self, request: Request) -> dict[str, Any] | None:
        """Show the plan and prompts; approve, reject or edit (an edit reopens until it validates)."""
        from ..errors import ConfigError, PlanError
        from ..plan import Plan
        from ..review import edit_in_editor, parse_review_yaml, render_review_yaml, with_errors_on_top
        from ..service import catalog_of_review, secret_in_answer
        from .commands import print_plan_dict

        payload = request.payload
        catalog = catalog_of_review(request)
        plan = Plan.model_validate(payload["plan"])
        agents: dict[str, Any] = payload.get("agents") or {}
        policies: dict[str, str] = payload.get("tool_policies") or {}
        self._review_notes(payload)
        decision: dict[str, Any] = {"action": "approve"}
        changed = True  # the plan is shown again only when an edit changed it
        while True:
            if changed:
                print_plan_dict(plan, agents, stderr=True)
                self._print(f"[dim]estimate for the steps:[/] {shown(await self._estimate(plan))}")
                changed = False
            line = await self._line("approve, reject or edit? [a/r/e]", request)
            if line is None:
                return None
            word = line.strip().lower()  # no default: a stray Enter must not approve a plan that runs code
            if word in ("a", "approve", "y", "yes"):
                return decision
            if word in ("r", "reject", "n", "no"):
                return await self._rejection(request)
            if word not in ("e", "edit"):
                self._print("answer a (approve), r (reject) or e (edit)")
                continue
            changed = True
            text = render_review_yaml(plan, agents, policies)
            refused = False
            while True:
                try:
                    edited = await asyncio.to_thread(edit_in_editor, text, extension=".yaml")
                except ConfigError as exc:
                    self._print(f"[red]{shown(str(exc))}[/]; the plan is unchanged")
                    break
                if refused and edited == text:  # closed without saving: the person gives the edit up
                    self._print("the edit was given up; the plan is unchanged")
                    break
                try:
                    edit = parse_review_yaml(edited, catalog, agents, task=payload["plan"]["task"])
                except PlanError as exc:
                    refused = True
                    self._print(f"[red]the edit is invalid:[/] {shown('; '.join(exc.problems))}")
                    text = with_errors_on_top(edited, exc)
                    continue
                if (edit.plan, edit.agents, edit.tool_policies) == (plan, agents, policies):
                    # saved as shown (the engine would find it no edit too): nothing to send or show
                    self._print("the edit changed nothing; the plan is unchanged")
                    changed = False
                    break
                edited_decision = {
                    "action": "approve",
                    "plan": edit.plan.to_json_dict(),
                    "agents": edit.agents,
                    "tool_policies": edit.tool_policies,
                }
                # said here, where the edit can be mended, rather than when it is sent
                refusal = secret_in_answer(request, edited_decision)
                if refusal is not None:
                    refused = True
                    self._print(f"[red]the edit is refused:[/] {shown(refusal)}")
                    text = with_errors_on_top(edited, PlanError([refusal], context="invalid edit"))
                    continue
                plan, agents, policies = edit.plan, edit.agents, edit.tool_policies
                decision = edited_decision
                break
