"""Web benchmark: how soon a step's change reaches a browser, and how fast the review page loads.

    python bench/web.py [--loads 50] [--json]

Starts `masterplanner serve` (scripted model, its own home) and, beside it in the same run, a
bare FastAPI app under the same uvicorn: the anchor.

(a) events: a run of 12 chained steps (0.1 s each) is followed over `GET
    /api/v1/runs/{id}/events/stream`; each event's latency is the time from its record in the
    database (`at`) to its arrival at the client (p50, p95 in ms). Anchor: the bare app's
    server-sent events, each stamped just before it is sent. Ratio = p50 / the anchor's p50.
(b) review page: `GET /runs/{id}` of a run waiting for the review of a 12-step plan (the graph,
    12 step cards with prompts and tools), --loads times; p50 in ms. Anchor: the bare app's
    HTML page, loaded the same way. Ratio = p50 / the anchor's p50.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from _steps import seconds, step

STEPS = 12


def _port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@contextmanager
def _server(command: list[str], env: dict[str, str], health: str) -> Iterator[str]:
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = command[command.index("--port") + 1]
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + health, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(
                    f"{command[:4]} did not start: {process.stderr.read() if process.stderr else ''}"
                )
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


def bare_app() -> Any:
    """The anchor: a FastAPI app with one HTML page and one server-sent event stream."""
    from fastapi import FastAPI
    from fastapi.responses import HTMLResponse
    from fastapi.sse import EventSourceResponse, ServerSentEvent

    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/page", response_class=HTMLResponse)
    async def page() -> str:
        return "<!doctype html><title>bare</title><p>" + "plan step " * 200 + "</p>"

    @app.get("/stream", response_class=EventSourceResponse)
    async def stream() -> Any:
        import asyncio

        for number in range(40):
            await asyncio.sleep(0.1)
            yield ServerSentEvent(data={"sent": time.time()}, id=str(number))

    return app


def _plan_script(folder: Path, name: str, delay_s: float) -> str:
    chain = [step("s1")] + [step(f"s{n}", f"s{n - 1}") for n in range(2, STEPS + 1)]
    calls: list[dict[str, Any]] = [{"purpose": "planner", "output": {"steps": chain}}]
    calls += [
        {"purpose": f"step:s{n}", "output": f"s{n} done", "delay_s": delay_s} for n in range(1, STEPS + 1)
    ]
    calls.append({"purpose": "prompt_creator", "output": "You are a careful worker. " * 30, "repeat": True})
    calls.append({"purpose": "*", "repeat": True})
    path = folder / f"{name}.json"
    path.write_text(json.dumps({"calls": calls}))
    return f"scripted:{path}"


def _stream_latencies(client: httpx.Client, url: str, stamp: str) -> list[float]:
    """Milliseconds from each event's stamp to its arrival, for every event of a stream."""
    found: list[float] = []
    with client.stream("GET", url, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                arrived = time.time()
                data = json.loads(line[6:])
                sent = seconds(data[stamp]) if isinstance(data[stamp], str) else float(data[stamp])
                found.append((arrived - sent) * 1000)
    return found


def _loads(client: httpx.Client, url: str, count: int) -> list[float]:
    client.get(url).raise_for_status()  # warm
    times = []
    for _ in range(count):
        started = time.perf_counter()
        client.get(url).raise_for_status()
        times.append((time.perf_counter() - started) * 1000)
    return times


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def measure(folder: Path, loads: int) -> dict[str, Any]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MASTERPLANNER_")}
    env |= {"MASTERPLANNER_HOME": str(folder / "home"), "MASTERPLANNER_REMEMBER_RUNS": "never"}
    ours = [sys.executable, "-m", "masterplanner", "serve", "--port", str(_port())]
    bare = [sys.executable, __file__, "--bare-server", "--port", str(_port())]
    with _server(ours, env, "/api/v1/health") as server, _server(bare, env, "/health") as anchor:
        client = httpx.Client(base_url=server, timeout=60)
        options = {"auto_approve": True, "prompt_rounds": 0}
        model = _plan_script(folder, "chain", 0.1)
        run = client.post("/api/v1/runs", json={"task": "chain", "model": model, "options": options}).json()
        events = _stream_latencies(client, f"/api/v1/runs/{run['id']}/events/stream", "at")
        bare_events = _stream_latencies(client, f"{anchor}/stream", "sent")

        review_model = _plan_script(folder, "review", 0.0)
        body = {"task": "review me", "model": review_model, "options": {"prompt_rounds": 0}}
        waiting = client.post("/api/v1/runs", json=body).json()
        deadline = time.monotonic() + 120
        while not client.get("/api/v1/requests", params={"run_id": waiting["id"]}).json():
            if time.monotonic() > deadline:
                raise SystemExit("the review never opened")
            time.sleep(0.1)
        page = _loads(client, f"/runs/{waiting['id']}", loads)
        bare_page = _loads(client, f"{anchor}/page", loads)
        size = len(client.get(f"/runs/{waiting['id']}").content)
    return {
        "events": len(events),
        "event_p50_ms": round(_percentile(events, 0.5), 1),
        "event_p95_ms": round(_percentile(events, 0.95), 1),
        "anchor_event_p50_ms": round(_percentile(bare_events, 0.5), 2),
        "event_ratio": round(_percentile(events, 0.5) / max(_percentile(bare_events, 0.5), 0.01), 1),
        "review_page_p50_ms": round(statistics.median(page), 1),
        "review_page_bytes": size,
        "anchor_page_p50_ms": round(statistics.median(bare_page), 2),
        "page_ratio": round(statistics.median(page) / statistics.median(bare_page), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loads", type=int, default=50, help="loads of each page")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--bare-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_server:
        import uvicorn

        uvicorn.run(bare_app(), host="127.0.0.1", port=args.port, log_level="warning")
        return
    with tempfile.TemporaryDirectory() as folder:
        result = measure(Path(folder), args.loads)
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"(a) events to an SSE client: {result['events']} events, p50 {result['event_p50_ms']} ms, "
        f"p95 {result['event_p95_ms']} ms; bare FastAPI SSE p50 {result['anchor_event_p50_ms']} ms; "
        f"ratio {result['event_ratio']}"
    )
    print(
        f"(b) review page of a {STEPS}-step plan ({result['review_page_bytes']:,} bytes): p50 "
        f"{result['review_page_p50_ms']} ms; bare FastAPI page p50 {result['anchor_page_p50_ms']} ms; "
        f"ratio {result['page_ratio']}"
    )


if __name__ == "__main__":
    main()
