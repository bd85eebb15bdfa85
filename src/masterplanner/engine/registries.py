"""The registries this process keeps open, one per database and embedder, shared by its runs.

Here, not in `resources.py`, so that closing a run service (which releases its settings'
registry) imports neither the models nor the registry's embedders.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..registry import RegistryStore
    from ..settings import Settings

__all__ = ["release_registry", "shared_registry"]

_REGISTRIES_KEPT = 4
"""Registries (one per database and embedder) a process keeps open; the least recently used goes first."""
_registries: OrderedDict[tuple[str, str], RegistryStore] = OrderedDict()
_registries_lock = threading.Lock()


def shared_registry(settings: Settings) -> RegistryStore:
    """The registry of the settings' database, shared by every run this process works on.

    One per process, not one per run: each holds a pool of database connections, and a worker
    coordinating dozens of runs with one each ran Postgres out of connections (bench/scale.py).
    A registry is safe to share between tasks and threads.
    """
    from ..registry import open_registry

    key = (settings.database_url, settings.embedder)
    with _registries_lock:
        if key in _registries:
            _registries.move_to_end(key)
            return _registries[key]
        registry = open_registry(settings)
        _registries[key] = registry
        while len(_registries) > _REGISTRIES_KEPT:
            _key, dropped = _registries.popitem(last=False)
            dropped.close()  # its pooled connections; a run still using it opens new ones
        return registry


def release_registry(settings: Settings) -> None:
    """Close the registry of the settings' database (its pooled connections), as an engine closes.

    Kept open after `RunService.close`, it held its database file: a program that removed its
    home and made it again stored its next teams in the removed file. A run another engine of
    this process still executes goes on with it, opening new connections.
    """
    with _registries_lock:
        registry = _registries.pop((settings.database_url, settings.embedder), None)
    if registry is not None:
        registry.close()
