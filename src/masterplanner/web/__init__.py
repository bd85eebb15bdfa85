"""The web front end: a REST API over the run service (`masterplanner serve`)."""

from .app import MAX_BODY_BYTES, create_app
from .auth import check_bind, web_token
from .server import SHUTDOWN_GRACE_S, serve_app

__all__ = ["MAX_BODY_BYTES", "SHUTDOWN_GRACE_S", "check_bind", "create_app", "serve_app", "web_token"]
