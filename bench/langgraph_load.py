"""LangGraph's side of bench/engine.py's load figure (d), run in a subprocess of the same job.

    python bench/langgraph_load.py [RUNS]

RUNS (100) concurrent invocations of one compiled 5-node chain, each node sleeping 0.2 s, with
LangGraph's SQLite checkpointer (a thread per invocation), after one warm-up invocation: the
shape of (d) in ours. `../shared/anchors/langgraph_overhead.py` has no load figure, so this one
is the bench's own. Prints one JSON object: {"load_runs": RUNS, "load_wall_s": seconds}.

Needs: pip install langgraph langgraph-checkpoint-sqlite
"""

from __future__ import annotations

import asyncio
import json
import operator
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, StateGraph

STEPS = 5
DELAY_S = 0.2


class State(TypedDict):
    out: Annotated[list[str], operator.add]


def _node(name: str) -> Callable[[State], Awaitable[dict[str, list[str]]]]:
    async def run(state: State) -> dict[str, list[str]]:
        await asyncio.sleep(DELAY_S)
        return {"out": [name]}

    return run


async def main(runs: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        async with AsyncSqliteSaver.from_conn_string(str(Path(folder) / "lg.sqlite")) as saver:
            graph = StateGraph(State)
            previous = START
            for index in range(STEPS):
                graph.add_node(f"n{index}", _node(f"n{index}"))  # type: ignore[call-overload]
                graph.add_edge(previous, f"n{index}")
                previous = f"n{index}"
            graph.add_edge(previous, END)
            chain = graph.compile(checkpointer=saver)
            await chain.ainvoke({"out": []}, {"configurable": {"thread_id": "warm-up"}})
            started = time.perf_counter()
            results = await asyncio.gather(
                *(chain.ainvoke({"out": []}, {"configurable": {"thread_id": f"t{n}"}}) for n in range(runs))
            )
            wall = time.perf_counter() - started
    if any(len(result["out"]) != STEPS for result in results):
        raise SystemExit("a LangGraph run did not pass every node")
    return {"load_runs": runs, "load_wall_s": round(wall, 3)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 100))))
