"""The agent registry: agents and cohorts remembered with their metadata, found again by similarity."""

from .specs import AgentSpec, AgentStats, Cohort
from .store import RegistryStore

__all__ = ["AgentSpec", "AgentStats", "Cohort", "RegistryStore"]
