"""The jail that model-written code runs in (see `jail.py` for its layers)."""

from .jail import SandboxLimits, SandboxResult, run_in_sandbox, sandbox_problems

__all__ = ["SandboxLimits", "SandboxResult", "run_in_sandbox", "sandbox_problems"]
