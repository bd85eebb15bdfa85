"""`masterplanner serve`: the web app and its REST API over the run service, for browsers and programs."""

from __future__ import annotations

from typing import Annotated

import typer

from .common import app, load_settings, whole_number
from .terminal import visible

__all__ = ["serve"]


@app.command(short_help="Serve the web app and its REST API over HTTP.")
def serve(
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", parser=whole_number(), help="Port to listen on (1-65535).")
    ] = 8765,
    auth: Annotated[
        bool, typer.Option("--auth", help="Require the token in <home>/web-token (needed off loopback).")
    ] = False,
    workers: Annotated[
        bool,
        typer.Option("--workers", help="Queue new runs for the workers (`masterplanner worker`) instead."),
    ] = False,
) -> None:
    """Serve the web app (its pages at /) and the API under /api/v1 (OpenAPI at /openapi.json).

    It says where to open the pages (the server's root) and where the API is, and serves until Ctrl-C.

    Runs started through it are executed by this server, or with --workers queued for the workers
    sharing its database (the request returns at once); runs started elsewhere (`masterplanner
    run`) are listed, followed and answered the same way, since both go through the database.
    Listening on an address other machines reach requires --auth: every request must then send
    `Authorization: Bearer TOKEN`, with the token from the web-token file of the home directory.
    """
    from ..errors import ConfigError
    from ..service import RunService
    from ..web import check_bind, create_app, serve_app, web_token

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port must be between 1 and 65535, got {port}")
    check_bind(host, auth=auth)
    from ..logs import configure_logging, log

    settings = load_settings()
    configure_logging(settings.log_format, printable=visible)
    token = None
    if auth:  # logged, not printed: with log_format = json every line on stderr is one JSON object
        token, path = web_token(settings.home)
        log("serve", f"token required: it is in {path}", event="token_required", token_file=str(path))
    service = RunService(settings)
    try:
        where = f"[{host}]" if ":" in host else host
        # the pages' root is what a person opens; the API is under it
        url, api = f"http://{where}:{port}/", f"http://{where}:{port}/api/v1"
        said = f"serving the web app on {url} (open it in a browser), its REST API on {api} (Ctrl-C stops)"
        log("serve", said, event="serving", url=url, api=api)
        serve_app(create_app(service, token=token, for_workers=workers), service, host=host, port=port)
    finally:
        service.close()
