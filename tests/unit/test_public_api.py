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
        "Request",
        "RequestClosedError",
        "RequestError",
        "RunError",
        "RunNotFoundError",
        "RunOptions",
        "RunRecord",
        "RunService",
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
