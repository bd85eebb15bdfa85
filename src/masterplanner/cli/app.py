"""The `masterplanner` command line: the Typer application with every command registered.

Thin commands over the run service and the library. The application object and what the
commands share live in `common.py`; the commands in `commands.py` (doctor, chat, plan, eval),
`runs.py` (run, runs), `registry.py` (agents, cohorts, memory, registry), `serve.py` (serve) and
`workers.py` (worker, workers).
"""

from __future__ import annotations

from . import commands, registry, runs, serve, workers
from .common import app, console, load_settings

__all__ = ["app", "commands", "console", "load_settings", "registry", "runs", "serve", "workers"]
