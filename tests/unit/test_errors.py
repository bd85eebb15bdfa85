"""Errors survive a trip through pickle, the way DBOS stores a failed workflow's or step's exception."""

from __future__ import annotations

import pickle

import pytest

from masterplanner import errors


def _examples() -> list[errors.MasterplannerError]:
    simple = [
        getattr(errors, name)(f"{name} happened")
        for name in errors.__all__
        # the exceptions, not the helpers (NUL_PROBLEM, nul_field, …) beside them
        if isinstance(getattr(errors, name), type)
        and name
        not in (
            "MissingCredentialError",
            "ModelFileError",
            "PlanError",
            "ScriptExhaustedError",
            "AgentEditError",
            "ToolNameClashError",
        )
    ]
    return [
        *simple,
        errors.MissingCredentialError("OPENAI_API_KEY", "openai:gpt-4o"),
        errors.ModelFileError("/models/x.gguf", "not a GGUF file"),
        errors.PlanError(["step 'a' depends on unknown step 'z'"], context="invalid plan edit"),
        errors.AgentEditError(["name: must not be blank", "model: 'x' is not a model spec"]),
        errors.RunNotFoundError("no run 'ab' but several start so", ambiguous=True),
        errors.ScriptExhaustedError("step:a", "script.json"),
        errors.ToolNameClashError(
            "tools 'a_b_c' of servers 'a' and 'a_b' cannot be named apart", ("a", "a_b")
        ),
    ]


@pytest.mark.parametrize("error", _examples(), ids=lambda error: type(error).__name__)
def test_every_error_comes_back_from_pickle_with_its_message_and_fields(
    error: errors.MasterplannerError,
) -> None:
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error)
    assert (str(back), back.args, vars(back)) == (str(error), error.args, vars(error))
    assert back.exit_code == error.exit_code


def test_a_missing_credential_keeps_what_it_names() -> None:
    back = pickle.loads(pickle.dumps(errors.MissingCredentialError("ANTHROPIC_API_KEY", "anthropic:claude")))
    assert (back.variable, back.spec) == ("ANTHROPIC_API_KEY", "anthropic:claude")
    assert (
        str(back)
        == "model 'anthropic:claude' needs the environment variable ANTHROPIC_API_KEY, which is not set"
    )
