"""The web front end: a REST API over the run service (`masterplanner serve`)."""

from .app import MAX_BODY_BYTES, create_app
from .auth import check_bind, web_token

__all__ = ["MAX_BODY_BYTES", "check_bind", "create_app", "web_token"]
