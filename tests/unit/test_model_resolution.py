from pathlib import Path

import pytest

from masterplanner import (
    MODEL_FORMS,
    MissingCredentialError,
    ModelFileError,
    ModelSpecError,
    ScriptError,
    Settings,
    resolve_model,
)
from masterplanner.models.retries import RetriedModel


def test_local_resolves_to_the_embedded_gguf() -> None:
    from masterplanner.models.local import LocalModel

    model = resolve_model("local")
    assert isinstance(model, LocalModel)
    assert model.model_name == "SmolLM2-135M-Instruct.Q4_1"
    assert model.system == "llama.cpp"
    assert model.path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_local_path_form_uses_that_file() -> None:
    from masterplanner.models.local import LocalModel, embedded_model_path

    model = resolve_model(f"local:{embedded_model_path()}")
    assert isinstance(model, LocalModel)
    assert model.path == embedded_model_path().resolve()


@pytest.mark.parametrize(
    "spec", ["nope:x", "gpt-4o", "openai:", "openai:  ", "", "local:", "scripted:"], ids=repr
)
def test_unknown_forms_list_the_valid_ones(spec: str) -> None:
    with pytest.raises(ModelSpecError) as caught:
        resolve_model(spec)
    message = str(caught.value)
    assert f"unknown model {spec.strip()!r}" in message
    for form in MODEL_FORMS:
        assert form in message
    assert "\n" not in message


def test_missing_gguf_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelFileError) as caught:
        resolve_model(f"local:{missing}")
    assert str(caught.value) == f"model file {missing}: no such file"
    assert caught.value.exit_code == 2


def test_corrupt_gguf_names_the_path(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"this is not a model")
    with pytest.raises(ModelFileError, match=rf"model file {corrupt}: not a GGUF file"):
        resolve_model(f"local:{corrupt}")


def test_truncated_gguf_is_refused_by_llama_cpp(tmp_path: Path) -> None:
    from masterplanner.models.local import embedded_model_path

    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(embedded_model_path().read_bytes()[:4096])
    model = resolve_model(f"local:{truncated}")
    with pytest.raises(ModelFileError, match=rf"model file {truncated}: llama.cpp cannot load it"):
        model.runtime()  # type: ignore[attr-defined]


def test_directory_is_not_a_gguf(tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="is a directory"):
        resolve_model(f"local:{tmp_path}")


def test_openai_without_key_names_the_variable() -> None:
    with pytest.raises(MissingCredentialError) as caught:
        resolve_model("openai:gpt-4o")
    assert caught.value.variable == "OPENAI_API_KEY"
    assert (
        str(caught.value)
        == "model 'openai:gpt-4o' needs the environment variable OPENAI_API_KEY, which is not set"
    )


def test_anthropic_without_key_names_the_variable() -> None:
    with pytest.raises(MissingCredentialError, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic:claude-sonnet-4-5")


def test_openai_with_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from masterplanner.models.openai_compat import OpenAICompatibleModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-used")
    model = resolve_model("openai:gpt-4o")
    assert isinstance(model, RetriedModel) and isinstance(model.wrapped, OpenAICompatibleModel)
    assert (model.attempts, model.timeout_s) == (4, 600.0)  # the settings' defaults
    assert model.model_name == "gpt-4o"
    assert model.profile.get("default_structured_output_mode") != "native"


def test_model_servers_take_tries_and_timeout_from_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = resolve_model("openai:m", Settings.load(model_attempts=2, model_timeout_s=5))
    assert isinstance(model, RetriedModel)
    assert (model.attempts, model.timeout_s) == (2, 5.0)


def test_openai_base_url_needs_no_key_and_prefers_native_output(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = resolve_model("openai:my-local-model")
    assert isinstance(model, RetriedModel)
    assert model.wrapped.base_url == "http://127.0.0.1:9/v1/"
    assert model.profile.get("default_structured_output_mode") == "native"


def test_anthropic_with_key(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai.models.anthropic import AnthropicModel

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-not-used")
    model = resolve_model("anthropic:claude-sonnet-4-5")
    assert isinstance(model, RetriedModel) and isinstance(model.wrapped, AnthropicModel)
    assert model.model_name == "claude-sonnet-4-5"


def test_ollama_defaults_to_the_local_daemon(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic_ai.models.ollama import OllamaModel

    model = resolve_model("ollama:llama3.2")
    assert isinstance(model, RetriedModel) and isinstance(model.wrapped, OllamaModel)
    assert model.wrapped.base_url == "http://127.0.0.1:11434/v1/"
    monkeypatch.setenv("OLLAMA_BASE_URL", "http://127.0.0.1:9999/v1")
    assert resolve_model("ollama:llama3.2").base_url == "http://127.0.0.1:9999/v1/"


def test_a_script_that_cannot_be_read_says_why_in_our_words(tmp_path: Path) -> None:
    with pytest.raises(ScriptError) as missing:
        resolve_model("scripted:absent.json")
    assert str(missing.value) == "scripted model file absent.json does not exist"
    with pytest.raises(ScriptError) as folder:
        resolve_model(f"scripted:{tmp_path}")
    assert str(folder.value) == f"scripted model file {tmp_path} is a folder, not a file"
    latin = tmp_path / "latin.json"
    latin.write_bytes('{"calls": [{"output": "café"}]}'.encode("latin-1"))
    with pytest.raises(ScriptError) as undecoded:
        resolve_model(f"scripted:{latin}")
    assert str(undecoded.value) == (
        f"scripted model file {latin}: not UTF-8 text (byte 27 is not): save it as UTF-8"
    )


def test_a_missing_credential_is_named_per_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    from masterplanner.models import PROVIDERS, missing_credential

    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert {provider: missing_credential(provider) for provider in PROVIDERS} == {
        "anthropic": "ANTHROPIC_API_KEY",
        "local": None,
        "ollama": None,
        "openai": "OPENAI_API_KEY",
        "scripted": None,
    }
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1")  # a compatible server needs no key
    monkeypatch.setenv("ANTHROPIC_API_KEY", "")  # set but empty is not set
    assert (missing_credential("openai"), missing_credential("anthropic")) == (None, "ANTHROPIC_API_KEY")
