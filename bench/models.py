"""Model-layer benchmark: embedded model load, generation speed, a plan-sized structured object,
and CLI start-up. Each figure is printed beside an anchor measured in the same run, as a ratio.

    python bench/models.py [--repeat N] [--json]

Anchors (same machine, same moment):
- load: importing llama-cpp-python and its own `Llama(...)` constructor on the same GGUF, in a
  fresh process (ours: the same through `load_llama`);
- tokens/s: llama-cpp-python's own `create_completion` on the same prompt, unconstrained;
- plan object: the time the bare model needs to emit the same number of tokens (from the
  anchor's tokens/s), so the ratio is the cost of the grammar plus the pydantic-ai adapter;
- --help: `python -c pass`, the interpreter's own start-up.
Targets (2 cores): load < 2 s, 5-step plan object < 5 s, `masterplanner --help` < 0.5 s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Literal

from pydantic import BaseModel, Field

# Each runs in a fresh process; the figure is importing llama.cpp's bindings plus loading the model.
LOAD_OURS = (
    "import time; from masterplanner.models.local import load_llama; t = time.perf_counter();"
    "load_llama(None, context_tokens=8192, threads=None);"
    "print(time.perf_counter() - t)"
)
LOAD_ANCHOR = (
    "import time, os; from masterplanner.models.local import embedded_model_path;"
    "path = str(embedded_model_path()); t = time.perf_counter(); from llama_cpp import Llama;"
    "Llama(model_path=path, n_ctx=8192, n_threads=os.cpu_count(), verbose=False);"
    "print(time.perf_counter() - t)"
)


class PlanStep(BaseModel):
    """One step, with the length bounds a plan's validation sets on its fields."""

    id: str = Field(max_length=32, description="short slug")
    title: str = Field(max_length=80)
    instruction: str = Field(max_length=300)
    agent_role: str = Field(max_length=40)
    tools: list[Literal["read_file", "write_file", "code_execution", "web_search", "http_request"]]
    depends_on: list[str] = Field(max_length=5)
    expected_output: str = Field(max_length=120)


class Plan(BaseModel):
    task: str
    steps: list[PlanStep] = Field(min_length=5, max_length=5)


TASK = (
    "Read sales.csv, compute monthly totals, plot them to chart.png, "
    "write a summary to report.md and email it to the team."
)


def timed_subprocess(code: str) -> float:
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(output.stdout.strip().splitlines()[-1])


def wall(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(args, capture_output=True, check=True)
    return time.perf_counter() - started


def generation_rates(repeat: int) -> tuple[float, float]:
    """Tokens/s through LocalModel (ours) and through bare llama-cpp-python (anchor)."""
    from pydantic_ai import Agent

    from masterplanner.models import resolve_model
    from masterplanner.models.local import LocalModel

    model = resolve_model("local")
    assert isinstance(model, LocalModel)
    runtime = model.runtime()
    llama = runtime._llama  # the anchor uses the very same loaded model, on the same thread:
    # llama.cpp's OpenMP workers keep spinning after a call, so calls from two threads slow each other.
    prompt = "Write a short story about a lighthouse keeper."
    settings = {"max_tokens": 128, "temperature": 0.0}
    ours: list[float] = []
    anchor: list[float] = []
    agent = Agent(model)
    for _ in range(repeat):
        started = time.perf_counter()
        result = asyncio.run(agent.run(prompt, model_settings=settings))  # type: ignore[arg-type]
        ours.append(result.usage.output_tokens / (time.perf_counter() - started))
        started = time.perf_counter()
        raw = runtime._executor.submit(
            llama.create_completion,
            prompt=f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n",
            max_tokens=128,
            temperature=0.0,
            repeat_penalty=1.1,
        ).result()
        anchor.append(raw["usage"]["completion_tokens"] / (time.perf_counter() - started))
    return statistics.median(ours), statistics.median(anchor)


def plan_object(repeat: int) -> tuple[float, int]:
    from pydantic_ai import Agent

    from masterplanner.models import resolve_model

    agent = Agent(resolve_model("local"), output_type=Plan, retries=0)
    times: list[float] = []
    tokens: list[int] = []
    for _ in range(repeat):
        started = time.perf_counter()
        result = asyncio.run(agent.run(f"Plan this task in exactly 5 steps: {TASK}"))
        times.append(time.perf_counter() - started)
        tokens.append(result.usage.output_tokens)
        assert len(result.output.steps) == 5
    return statistics.median(times), int(statistics.median(tokens))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    loads = [(timed_subprocess(LOAD_OURS), timed_subprocess(LOAD_ANCHOR)) for _ in range(args.repeat)]
    load = statistics.median(ours for ours, _ in loads)
    load_anchor = statistics.median(anchor for _, anchor in loads)
    rate, rate_anchor = generation_rates(args.repeat)
    plan_s, plan_tokens = plan_object(args.repeat)
    plan_anchor = plan_tokens / rate_anchor
    help_s = statistics.median(
        wall([sys.executable, "-m", "masterplanner", "--help"]) for _ in range(args.repeat)
    )
    python_s = statistics.median(wall([sys.executable, "-c", "pass"]) for _ in range(args.repeat))

    figures = {
        "load_s": round(load, 3),
        "load_anchor_s": round(load_anchor, 3),
        "load_ratio": round(load / load_anchor, 3),
        "tokens_per_s": round(rate, 1),
        "tokens_per_s_anchor": round(rate_anchor, 1),
        "tokens_per_s_ratio": round(rate / rate_anchor, 3),
        "plan5_s": round(plan_s, 3),
        "plan5_tokens": plan_tokens,
        "plan5_anchor_s": round(plan_anchor, 3),
        "plan5_ratio": round(plan_s / plan_anchor, 3),
        "help_s": round(help_s, 3),
        "help_anchor_s": round(python_s, 3),
        "help_ratio": round(help_s / python_s, 3),
        "targets_met": load < 2 and plan_s < 5 and help_s < 0.5,
    }
    if args.json:
        print(json.dumps(figures))
        return
    rows = [
        ("load incl. import (s)", load, "import + Llama()", load_anchor),
        ("generation (tokens/s)", rate, "bare create_completion", rate_anchor),
        (f"5-step plan object (s, {plan_tokens} tokens)", plan_s, "bare model, same tokens", plan_anchor),
        ("masterplanner --help (s)", help_s, "python -c pass", python_s),
    ]
    for name, ours, anchor_name, anchor in rows:
        print(f"{name:<38} {ours:8.3f}   anchor {anchor_name:<26} {anchor:8.3f}   ratio {ours / anchor:6.2f}")
    verdict = "met" if figures["targets_met"] else "NOT met"
    print(f"targets (load < 2 s, 5-step object < 5 s, --help < 0.5 s): {verdict}")


if __name__ == "__main__":
    main()
