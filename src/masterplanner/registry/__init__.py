"""The agent registry: agents and cohorts remembered with their metadata, found again by similarity."""

from .embedders import TextEmbedder, resolve_embedder
from .specs import AgentSpec, AgentStats, Cohort
from .store import RegistryStore, open_registry

__all__ = [
    "AgentSpec",
    "AgentStats",
    "Cohort",
    "RegistryStore",
    "TextEmbedder",
    "open_registry",
    "resolve_embedder",
]
