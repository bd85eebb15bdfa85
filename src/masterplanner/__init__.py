"""masterplanner: turn a high-level task into a reviewed, executed plan of cooperating LLM agents.

The public API is what `__all__` lists, plus the planner's functions in `masterplanner.planner`
(`plan`, `expand`, `replan`); everything else is private and may change. Names are imported on
first use, so `import masterplanner` (and the CLI's start-up) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._lazy import lazy_names
from ._version import __version__

if TYPE_CHECKING:
    from .chatting import ChatResult, achat, chat
    from .engine import Engine, Event, Request, RunOptions, RunRecord, StepRecord
    from .errors import (
        AgentEditError,
        BudgetExceededError,
        ConfigError,
        DatabaseError,
        DatabaseUnavailableError,
        MasterplannerError,
        MissingCredentialError,
        ModelError,
        ModelFileError,
        ModelRetriesExhaustedError,
        ModelSpecError,
        NotFoundError,
        PlanError,
        RequestClosedError,
        RequestError,
        RunError,
        RunNotFoundError,
        ScriptError,
        ScriptExhaustedError,
        SettingsError,
        ToolError,
    )
    from .models import MODEL_FORMS, LabelledModel, labelled, resolve_model
    from .plan import Plan, Step, validate_plan
    from .planner import PlanExample
    from .purpose import FIXED_PURPOSES, current_purpose, step_purpose, using_purpose, validate_purpose
    from .remedies import Remedy, Said
    from .service import RegistryService, RunService
    from .settings import Settings
    from .tools import Catalog, ToolSpec, builtin_catalog
    from .usage import PurposeUsage, UsageLedger

_HOMES = {
    ".chatting": ("ChatResult", "achat", "chat"),
    ".engine": ("Engine", "Event", "Request", "RunOptions", "RunRecord", "StepRecord"),
    ".errors": (
        "AgentEditError",
        "BudgetExceededError",
        "ConfigError",
        "DatabaseError",
        "DatabaseUnavailableError",
        "MasterplannerError",
        "MissingCredentialError",
        "ModelError",
        "ModelFileError",
        "ModelRetriesExhaustedError",
        "ModelSpecError",
        "NotFoundError",
        "PlanError",
        "RequestClosedError",
        "RequestError",
        "RunError",
        "RunNotFoundError",
        "ScriptError",
        "ScriptExhaustedError",
        "SettingsError",
        "ToolError",
    ),
    ".models": ("MODEL_FORMS", "LabelledModel", "labelled", "resolve_model"),
    ".plan": ("Plan", "Step", "validate_plan"),
    ".planner": ("PlanExample",),
    ".tools": ("Catalog", "ToolSpec", "builtin_catalog"),
    ".purpose": ("FIXED_PURPOSES", "current_purpose", "step_purpose", "using_purpose", "validate_purpose"),
    ".remedies": ("Remedy", "Said"),
    ".service": ("RegistryService", "RunService"),
    ".settings": ("Settings",),
    ".usage": ("PurposeUsage", "UsageLedger"),
}

__all__ = [
    "FIXED_PURPOSES",
    "MODEL_FORMS",
    "AgentEditError",
    "BudgetExceededError",
    "Catalog",
    "ChatResult",
    "ConfigError",
    "DatabaseError",
    "DatabaseUnavailableError",
    "Engine",
    "Event",
    "LabelledModel",
    "MasterplannerError",
    "MissingCredentialError",
    "ModelError",
    "ModelFileError",
    "ModelRetriesExhaustedError",
    "ModelSpecError",
    "NotFoundError",
    "Plan",
    "PlanError",
    "PlanExample",
    "PurposeUsage",
    "RegistryService",
    "Remedy",
    "Request",
    "RequestClosedError",
    "RequestError",
    "RunError",
    "RunNotFoundError",
    "RunOptions",
    "RunRecord",
    "RunService",
    "Said",
    "ScriptError",
    "ScriptExhaustedError",
    "Settings",
    "SettingsError",
    "Step",
    "StepRecord",
    "ToolError",
    "ToolSpec",
    "UsageLedger",
    "__version__",
    "achat",
    "builtin_catalog",
    "chat",
    "current_purpose",
    "labelled",
    "resolve_model",
    "step_purpose",
    "using_purpose",
    "validate_plan",
    "validate_purpose",
]


__getattr__, __dir__ = lazy_names(__name__, _HOMES, __all__)
