import masterplanner


def test_all_is_pinned_and_importable() -> None:
    assert masterplanner.__all__ == [
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
    for name in masterplanner.__all__:
        assert getattr(masterplanner, name) is not None


def test_every_public_name_of_the_package_the_engine_and_the_service_imports_on_first_use() -> None:
    """In a fresh process, so each lazily imported name is imported by its own `__getattr__`.

    `masterplanner.service.WorkerSummary` once named its module relative to the service module,
    not the package, and did not import.
    """
    import subprocess
    import sys

    code = (
        "import importlib\n"
        "for name in ('masterplanner', 'masterplanner.engine', 'masterplanner.service'):\n"
        "    module = importlib.import_module(name)\n"
        "    for public in module.__all__:\n"
        "        assert getattr(module, public) is not None, (name, public)\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")


def test_no_public_name_is_shadowed_by_a_module_of_the_package() -> None:
    """Importing a submodule sets it on the package: one named like a public name replaced that name.

    `masterplanner.chat` was the module, not the function, once anything had imported `.chat`.
    """
    import importlib
    import pkgutil
    import types

    for module in pkgutil.iter_modules(masterplanner.__path__):
        if module.name != "__main__":  # that one runs the command
            importlib.import_module(f"masterplanner.{module.name}")
    public = {name: getattr(masterplanner, name) for name in masterplanner.__all__}
    assert [name for name, value in public.items() if isinstance(value, types.ModuleType)] == []


def test_unknown_attribute_raises() -> None:
    import pytest

    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = masterplanner.nope  # type: ignore[attr-defined]


def test_error_hierarchy_and_exit_codes() -> None:
    from masterplanner import errors

    assert issubclass(errors.ModelSpecError, errors.ConfigError)
    assert issubclass(errors.MissingCredentialError, errors.ConfigError)
    assert issubclass(errors.ModelFileError, errors.ConfigError)
    assert issubclass(errors.ScriptExhaustedError, errors.ModelError)
    assert issubclass(errors.ModelRetriesExhaustedError, errors.ModelError)
    assert errors.ConfigError.exit_code == 2
    assert errors.ModelError.exit_code == 1
