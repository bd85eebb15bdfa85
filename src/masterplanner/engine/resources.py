"""What a run works with in this process, built from its stored row and this process's settings.

A step's workflow gets only `(run_id, step_id)`. Everything else it needs is data in the
database (the plan, the step's agent, the options and policies, its dependencies' outputs) or is
made from that data and the settings of the process that runs it: the tool catalog (MCP servers
discovered), the workspace, the tool context, the model, the ledger, the registry and memory.
Making those costs something (a model load, MCP discovery), so each process keeps the ones it
made for a run while it executes the run, and a few more; one it does not have is made again
from the database. Nothing here is needed to tell which process a run belongs to: any process
that recovers a step's workflow can build what the step needs.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass, replace

from ..errors import ConfigError, RunError
from ..models import resolve_model
from ..models.retries import Reporter, RetriedModel, RetryNote
from ..purpose import current_purpose
from ..registry import RegistryStore
from ..registry.memory import MemoryStore
from ..settings import CONFIG_FILE_NAME, Settings
from ..tools.context import ToolContext
from ..tools.workspace import Workspace
from ..working_memory import ContextBudget
from .budget import RunLedger
from .catalogs import RunCatalog, run_catalog, tool_context, unoffered_policy_tools, with_mcp_tools
from .records import RunRecord
from .registries import shared_registry
from .step_agent import BudgetedModel, context_budget
from .store import RunStore

__all__ = ["RunResources", "hold", "release", "resources_of"]

_log = logging.getLogger("masterplanner.resources")

_KEPT_IDLE = 16
"""Resources made for runs this process does not execute (a step recovered on its own) it keeps."""


@dataclass(frozen=True)
class RunResources:
    """One run's catalog, workspace, tools, model, ledger, registry and memory in this process."""

    run_id: str
    settings: Settings
    store: RunStore
    catalog: RunCatalog
    tools: ToolContext
    workspace: Workspace
    ledger: RunLedger
    model: BudgetedModel
    budget: ContextBudget
    registry: RegistryStore | None
    memory: MemoryStore | None
    retries: int = 0
    """How many times the run had been retried when these were made (a retry may change budgets)."""


async def _build(settings: Settings, store: RunStore, run: RunRecord) -> RunResources:
    # the catalog checks the sandbox (a probe process): off the event loop
    catalog, tools = await asyncio.to_thread(lambda: (run_catalog(settings), tool_context(settings)))
    if settings.mcp_servers:
        catalog, tools = await with_mcp_tools(settings, tools)
        _check_policies(run, catalog)
    growth = run.options.workspace_max_growth_bytes
    home_settings = settings.home / CONFIG_FILE_NAME  # steps may not read it under another name either
    workspace = await asyncio.to_thread(
        Workspace(
            run.workspace,
            max_bytes=None if growth is None else run.options.workspace_start_bytes + growth,
            settings_files=[home_settings],
        ).create
    )
    ledger = RunLedger(store, run.id, run.options)
    resolved = resolve_model(run.model, settings)
    if isinstance(resolved, RetriedModel):
        resolved = resolved.reporting(_retry_events(store, run.id))
    model = BudgetedModel(resolved, ledger)
    registry = await asyncio.to_thread(shared_registry, settings)
    memory = (
        None
        if registry is None
        else MemoryStore(registry, ttl_days=settings.memory_ttl_days, max_items=settings.memory_max_items)
    )
    if memory is not None:
        tools = replace(tools, memory=memory, memory_source=run.id)
    return RunResources(
        run_id=run.id,
        settings=settings,
        store=store,
        catalog=catalog,
        tools=tools,
        workspace=workspace,
        ledger=ledger,
        model=model,
        budget=context_budget(run.options, model.wrapped),
        registry=registry,
        memory=memory,
        retries=run.retries,
    )


def _check_policies(run: RunRecord, catalog: RunCatalog) -> None:
    """`ConfigError` for a tool policy of the run (or of a step's agent) naming an MCP tool its server lacks.

    Found here, before planning and before any step: the run fails saying so, as it does when a
    server cannot be listed.
    """
    agent_policies = {step_id: agent.tool_policies for step_id, agent in run.agents.items()}
    problems = unoffered_policy_tools(run.options.tool_policies, agent_policies, catalog)
    if problems:
        raise ConfigError("; ".join(problems))


def _retry_events(store: RunStore, run_id: str) -> Reporter:
    """Each wait before a model request is tried again, as a `model_retried` event of the run.

    The event only tells: when the run store cannot take it (the database away, a full disk),
    that is logged and the request is tried again all the same (before, the failure failed it,
    and its step), as a `model_waiting` event's is (`RunLedger.note_wait`).
    """

    async def report(note: RetryNote) -> None:
        purpose = current_purpose() or ""
        data = {
            "purpose": purpose,
            "error": note.problem,
            "delay_s": round(note.delay_s, 3),
            "attempt": note.attempt,
            "attempts": note.attempts,
        }
        step = purpose.removeprefix("step:") if purpose.startswith("step:") else None
        try:
            await asyncio.to_thread(store.append_event, run_id, "model_retried", step, data)
        except RunError as error:
            _log.warning(
                "run %s: could not store the model_retried event of a model request of %s (it is "
                "tried again all the same): %s",
                run_id,
                purpose or "no purpose",
                error,
            )

    return report


class _Kept:
    """The resources this process made, and which settings and store each held run is executed with."""

    def __init__(self) -> None:
        self.made: OrderedDict[str, RunResources] = OrderedDict()
        self.holders: dict[str, tuple[Settings, RunStore, int]] = {}

    def trim(self) -> None:
        idle = [run_id for run_id in self.made if run_id not in self.holders]
        for run_id in idle[: max(0, len(idle) - _KEPT_IDLE)]:
            del self.made[run_id]


_kept = _Kept()


async def resources_of(
    run_id: str, settings: Settings, store: RunStore, *, retries: int | None = None
) -> RunResources:
    """The run's resources in this process: the ones made before, or made now from its stored row.

    A run this process executes is built with the settings and store of the execution that
    holds it (`hold`); `settings` and `store` serve any other. `retries`: the run's count as
    the caller read it; resources made before a later retry are made again (its budgets).
    """
    found = _kept.made.get(run_id)
    if found is not None and retries is not None and found.retries != retries:
        _kept.made.pop(run_id, None)
        found = None
    if found is not None:
        _kept.made.move_to_end(run_id)
        return found
    held = _kept.holders.get(run_id)
    if held is not None:
        settings, store = held[0], held[1]
    run = await asyncio.to_thread(store.get_run, run_id)
    built = await _build(settings, store, run)
    # two steps of one run may have built at once: both go on with the first one kept
    found = _kept.made.setdefault(run_id, built)
    _kept.trim()
    return found


def hold(run_id: str, settings: Settings, store: RunStore) -> None:
    """This process executes the run with these settings: keep its resources until `release`.

    The first hold drops resources made before under other settings (an earlier execution).
    """
    held = _kept.holders.get(run_id)
    if held is None:
        _kept.made.pop(run_id, None)
        _kept.holders[run_id] = (settings, store, 1)
    else:
        _kept.holders[run_id] = (held[0], held[1], held[2] + 1)


def held_runs() -> dict[str, str]:
    """The runs executions in this process hold now, with the database URL each is executed on."""
    return {run_id: held[0].database_url for run_id, held in list(_kept.holders.items())}


def release(run_id: str) -> None:
    """An execution of the run in this process is over; the last one drops its resources."""
    held = _kept.holders.get(run_id)
    if held is None:
        return
    if held[2] > 1:
        _kept.holders[run_id] = (held[0], held[1], held[2] - 1)
        return
    del _kept.holders[run_id]
    _kept.made.pop(run_id, None)
