"""Serving the app with uvicorn, so that it stops promptly when told to (SIGTERM, Ctrl-C)."""

from __future__ import annotations

from types import FrameType

import uvicorn
from fastapi import FastAPI

from ..service import RunService

__all__ = ["SHUTDOWN_GRACE_S", "serve_app"]

SHUTDOWN_GRACE_S = 10
"""How long requests in progress get to finish once the server is told to stop."""


class _Server(uvicorn.Server):
    """uvicorn's server, which also ends the live event streams when it is told to stop.

    uvicorn waits for open connections to close before it exits, and the event stream of a run
    that is not over stays open: with such a run's page open in a browser, SIGTERM or Ctrl-C
    left the server waiting for as long as the page stayed open.
    """

    def __init__(self, config: uvicorn.Config, service: RunService) -> None:
        super().__init__(config)
        self.service = service

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.service.stop_following()
        super().handle_exit(sig, frame)


def serve_app(app: FastAPI, service: RunService, *, host: str, port: int) -> None:
    """Serve `app` (made over `service`) until SIGTERM or Ctrl-C; live event streams end then."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        log_config=None,  # its records go through ours (`logs.configure_logging`): JSON lines stay JSON
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    _Server(config, service).run()
