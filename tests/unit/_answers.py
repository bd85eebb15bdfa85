"""A scripted front end for engine tests: executes a run and answers its requests as they open.

Each handler stands for a person answering one kind of request through the run service, as a
terminal or a browser would; a kind with no handler is left open.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from masterplanner.engine import Engine, Request, RunRecord
from masterplanner.service import RunService, catalog_of_review
from masterplanner.tools import Catalog

Review = Callable[[RunRecord, Catalog], Awaitable[dict[str, Any]]]
Approve = Callable[[str, str, dict[str, Any]], Awaitable[bool]]
Ask = Callable[[str], Awaitable[str]]
Remember = Callable[[RunRecord], Awaitable[bool]]


async def execute_answering(
    engine: Engine,
    run_id: str,
    *,
    review: Review | None = None,
    approve_tool: Approve | None = None,
    ask_person: Ask | None = None,
    confirm_remember: Remember | None = None,
) -> RunRecord:
    """`engine.execute(run_id)`, answering its requests with the handlers given.

    An answer the service refuses (an invalid plan edit, say) is raised here, and the execution
    is stopped, as a person's process would leave the run waiting.
    """
    service = RunService(engine.settings)
    execution = asyncio.ensure_future(engine.execute(run_id))
    taken: set[str] = set()

    async def answer(request: Request) -> None:
        taken.add(request.id)
        run = await service.get(request.run_id)
        reply: dict[str, Any] | None = None
        if request.kind == "plan_review" and review is not None:
            reply = await review(run, catalog_of_review(request))
        elif request.kind == "tool_approval" and approve_tool is not None:
            arguments = request.payload["arguments"]
            reply = {
                "approved": await approve_tool(request.step_id or "", request.payload["tool"], arguments)
            }
        elif request.kind == "ask_user" and ask_person is not None:
            reply = {"text": await ask_person(request.payload["question"])}
        elif request.kind == "remember" and confirm_remember is not None:
            reply = {"approved": await confirm_remember(run)}
        if reply is not None:
            await service.answer(request.id, reply, by="test")

    try:
        while True:
            for request in await service.pending(run_id):
                if request.id not in taken:
                    await answer(request)
            if execution.done():
                break
            await asyncio.wait({execution}, timeout=0.05)
        for request in await service.pending(run_id):  # the remember question comes after the run
            if request.id not in taken:
                await answer(request)
        await execution
        return await service.get(run_id)
    finally:
        if not execution.done():
            execution.cancel()
            await asyncio.gather(execution, return_exceptions=True)
        service.close()
