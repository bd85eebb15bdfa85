import json
from pathlib import Path

import pytest

from masterplanner import Settings, SettingsError


def write_toml(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "masterplanner.toml"
    path.write_text(text)
    return path


def test_defaults(isolated: Path) -> None:
    settings = Settings.load()
    assert settings.home == isolated
    assert settings.model == "local"
    assert settings.database_url == f"sqlite:///{isolated / 'masterplanner.sqlite'}"
    assert settings.local_context_tokens == 8192


def test_default_home_is_the_platform_data_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    import platformdirs

    monkeypatch.delenv("MASTERPLANNER_HOME")
    assert Settings.load().home == Path(platformdirs.user_data_dir("masterplanner", appauthor=False))


def test_precedence_flag_env_cwd_file_home_file(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_toml(isolated, 'model = "scripted:home.json"\nlocal_context_tokens = 1024\nlocal_threads = 3\n')
    assert Settings.load().model == "scripted:home.json"
    write_toml(Path.cwd(), 'model = "scripted:cwd.json"\nlocal_context_tokens = 2048\n')
    settings = Settings.load()
    assert (settings.model, settings.local_context_tokens, settings.local_threads) == (
        "scripted:cwd.json",
        2048,
        3,
    )
    monkeypatch.setenv("MASTERPLANNER_MODEL", "scripted:env.json")
    assert Settings.load().model == "scripted:env.json"
    assert Settings.load(model="scripted:flag.json").model == "scripted:flag.json"
    assert Settings.load(model=None).model == "scripted:env.json"


def test_home_can_come_from_the_cwd_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MASTERPLANNER_HOME")
    other_home = tmp_path / "elsewhere"
    write_toml(Path.cwd(), f'home = "{other_home}"\n')
    write_toml(other_home, 'model = "scripted:from-home.json"\n')
    settings = Settings.load()
    assert settings.home == other_home
    assert settings.model == "scripted:from-home.json"


def test_unknown_key_names_file_and_known_keys(isolated: Path) -> None:
    path = write_toml(isolated, 'modle = "local"\n')
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    message = str(caught.value)
    assert f"unknown setting 'modle' in {path}" in message
    assert message.endswith(
        "known: agent_reuse_threshold, database_url, embedder, home, http_allow_loopback, "
        "http_allowed_domains, image_base_url, image_model, local_context_tokens, local_max_output_tokens, "
        "local_threads, log_format, mcp_servers, memory_max_items, memory_ttl_days, model, model_attempts, "
        "model_timeout_s, otel_endpoint, provider_limits, queue_poll_s, remember_runs, reuse_threshold, "
        "run_lease_s, searxng_url, tool_policies, web_search_backend, web_search_folder, worker_concurrency, "
        "workspace_max_growth_bytes"
    )


def test_invalid_env_value_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTERPLANNER_LOCAL_CONTEXT_TOKENS", "lots")
    with pytest.raises(
        SettingsError, match=r"'local_context_tokens' \(from MASTERPLANNER_LOCAL_CONTEXT_TOKENS\)"
    ):
        Settings.load()


def test_invalid_flag_value() -> None:
    with pytest.raises(SettingsError) as caught:
        Settings.load(local_context_tokens=3)
    assert str(caught.value) == (
        "invalid settings: setting 'local_context_tokens' (given as a flag or argument): "
        "must be at least 512, got 3"
    )


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("model = 5", "setting 'model' (in {path}): should be text, got a number"),
        (
            'local_threads = "lots"',
            "setting 'local_threads' (in {path}): should be a whole number, got 'lots'",
        ),
        ("local_threads = 2.5", "setting 'local_threads' (in {path}): should be a whole number, got 2.5"),
        ("reuse_threshold = -3", "setting 'reuse_threshold' (in {path}): must be at least 0, got -3"),
        (
            'http_allowed_domains = "a.com"',
            "setting 'http_allowed_domains' (in {path}): should be a list, got text",
        ),
    ],
)
def test_a_bad_value_in_the_config_file_is_said_in_our_words(line: str, problem: str) -> None:
    """Not pydantic's sentences ("Input should be a valid integer, unable to parse string as an integer")."""
    path = write_toml(Path.cwd(), line + "\n")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == "invalid settings: " + problem.format(path=path)


def test_settings_a_program_builds_itself_are_refused_in_our_words_too(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(home=tmp_path, run_lease_s=-1)
    assert str(caught.value) == (
        "invalid settings: setting 'run_lease_s' (given as a flag or argument): must be at least 1, got -1"
    )


def test_a_bad_number_in_the_environment_is_shown_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTERPLANNER_MODEL_TIMEOUT_S", "abc")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == (
        "invalid settings: setting 'model_timeout_s' (from MASTERPLANNER_MODEL_TIMEOUT_S): "
        "should be a number, got 'abc'"
    )


def test_bad_toml_names_the_file() -> None:
    path = write_toml(Path.cwd(), "model = \n")
    with pytest.raises(SettingsError, match=rf"{path}: not valid TOML"):
        Settings.load()
    path.write_bytes('model = "café"\n'.encode("latin-1"))
    with pytest.raises(SettingsError) as latin:
        Settings.load()
    assert str(latin.value) == f"{path}: not UTF-8 text (byte 13 is not): save it as UTF-8"


def test_ensure_home_creates_it(isolated: Path) -> None:
    assert not isolated.exists()
    assert Settings.load().ensure_home() == isolated
    assert isolated.is_dir()


def test_database_url_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", "postgresql://127.0.0.1:5432/test")
    assert Settings.load().database_url == "postgresql://127.0.0.1:5432/test"


def test_tool_policies_and_http_allowlist_from_toml(isolated: Path) -> None:
    write_toml(isolated, 'http_allowed_domains = ["example.com"]\n[tool_policies]\ncode_execution = "deny"\n')
    settings = Settings.load()
    assert settings.http_allowed_domains == ["example.com"]
    assert settings.tool_policies == {"code_execution": "deny"}
    write_toml(isolated, '[tool_policies]\ncode_execution = "maybe"\n')
    with pytest.raises(SettingsError, match=r"setting 'tool_policies\.code_execution'"):
        Settings.load()


@pytest.mark.parametrize("entry", ["http://localhost", "localhost:18081", "", "example.com/api", "a b"])
def test_an_http_allowlist_entry_that_is_not_a_host_name_is_refused(isolated: Path, entry: str) -> None:
    """Such an entry never matched a request: the allowlist refused what it seemed to allow."""
    write_toml(isolated, f"http_allowed_domains = [{entry!r}]\n")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == (
        f"invalid settings: setting 'http_allowed_domains' (in {isolated / 'masterplanner.toml'}): "
        f"{entry!r} is not a host name; give host names such as example.com (a subdomain of one is "
        "allowed too), not URLs, ports or paths, or '*' for any host"
    )
    write_toml(isolated, "http_allowed_domains = ['example.com', '*.x.org', '127.0.0.1', 'bücher.de', '*']\n")
    assert len(Settings.load().http_allowed_domains) == 5


def test_provider_limits_name_a_known_provider(isolated: Path) -> None:
    write_toml(isolated, "[provider_limits.openai]\nconcurrency = 8\nper_minute = 60\n")
    limit = Settings.load().provider_limits["openai"]
    assert (limit.concurrency, limit.per_minute) == (8, 60)
    write_toml(isolated, "[provider_limits.opneai]\nconcurrency = 8\n")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    message = str(caught.value)
    assert "no provider 'opneai'; providers are anthropic, local, ollama, openai, scripted" in message


def test_an_embedder_that_is_no_form_of_one_is_refused_when_the_settings_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", "bogus")
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        "invalid settings: setting 'embedder' (from MASTERPLANNER_EMBEDDER): expected smollm2, none, "
        "local, sentence-transformers:NAME or PROVIDER:MODEL, got 'bogus'"
    )
    monkeypatch.setenv("MASTERPLANNER_EMBEDDER", "openai:text-embedding-3-small")
    assert Settings.load().embedder == "openai:text-embedding-3-small"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("openai:", "unknown model 'openai:' (expected PROVIDER:NAME); valid forms: "),
        ("scripted:/nonexistent", "scripted model file /nonexistent does not exist"),
        ("local:/x/not-a-gguf.txt", "model file /x/not-a-gguf.txt: no such file"),
    ],
)
def test_a_bad_model_setting_says_it_is_the_setting_and_where_it_came_from(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, spec: str, problem: str
) -> None:
    from masterplanner import ConfigError, chat

    path = write_toml(Path.cwd(), f'model = "{spec}"\n')
    with pytest.raises(ConfigError) as caught:
        chat("hi")
    assert str(caught.value).startswith(f"setting 'model' (in {path}): {problem}")
    monkeypatch.setenv("MASTERPLANNER_MODEL", spec)
    with pytest.raises(ConfigError) as caught:
        chat("hi")
    assert str(caught.value).startswith(f"setting 'model' (from MASTERPLANNER_MODEL): {problem}")
    with pytest.raises(ConfigError) as caught:
        chat("hi", model=spec)
    assert str(caught.value).startswith(f"setting 'model' (given as a flag or argument): {problem}")


def test_a_blank_model_setting_is_refused_when_the_settings_load(isolated: Path) -> None:
    path = write_toml(Path.cwd(), 'model = "   "\n')
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == (
        f"invalid settings: setting 'model' (in {path}): must not be blank; give a model spec such as "
        "local or openai:gpt-4o"
    )


def test_a_tool_policy_for_no_tool_names_the_file_it_is_in(isolated: Path) -> None:
    from masterplanner import ConfigError, Engine

    path = write_toml(Path.cwd(), '[tool_policies]\nfly = "auto"\n')
    engine = Engine(Settings.load())
    try:
        with pytest.raises(ConfigError) as caught:
            engine.create_run("x", model="local")
    finally:
        engine.close()
    assert str(caught.value).startswith(
        f"setting 'tool_policies' (in {path}): tool_policies names 'fly', which is not a tool; tools are "
    )


def test_an_unknown_masterplanner_variable_is_an_error_naming_it_and_the_closest_setting(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_MODLE", "openai:x")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    message = str(caught.value)
    assert message.startswith(
        "unknown setting variable MASTERPLANNER_MODLE: no setting is called 'modle'; did you mean "
        "MASTERPLANNER_MODEL? a MASTERPLANNER_ variable is MASTERPLANNER_ and a setting's name: "
        "agent_reuse_threshold, "
    )
    monkeypatch.delenv("MASTERPLANNER_MODLE")
    for variable in ("MASTERPLANNER_BENCHMARKS", "MASTERPLANNER_TEST_ARTIFACTS", "MASTERPLANNER_ANCHOR"):
        monkeypatch.setenv(variable, "/somewhere")  # read by the project, not settings
    monkeypatch.setenv("MASTERPLANNER_DATABASE_URL", "sqlite:///x.sqlite")
    assert Settings.load().database_url == "sqlite:///x.sqlite"


def test_a_settings_file_that_is_a_folder_is_an_error_naming_it(isolated: Path) -> None:
    folder = Path.cwd() / "masterplanner.toml"
    folder.mkdir()
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == f"{folder}: is not a file; a settings file is a TOML file"
    folder.rmdir()
    (isolated / "masterplanner.toml").mkdir(parents=True)
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert (
        str(caught.value)
        == f"{isolated / 'masterplanner.toml'}: is not a file; a settings file is a TOML file"
    )


def test_home_set_in_the_home_folders_own_file_is_refused(isolated: Path, tmp_path: Path) -> None:
    path = write_toml(isolated, f'home = "{tmp_path / "other"}"\n')
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == (
        f"{path}: sets home, which the home folder's own settings file cannot (it is found inside the "
        "home); set it with MASTERPLANNER_HOME or masterplanner.toml in the current directory"
    )  # not "--home": the command has no such option, and told to use it a person got an error
    write_toml(isolated, f'home = "{isolated}/."\nmodel = "scripted:x.json"\n')  # itself: harmless
    assert (Settings.load().home, Settings.load().model) == (isolated, "scripted:x.json")


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("home = 5", "setting 'home' (in {path}): should be a path (text), got a number"),
        ("mcp_servers = 5", "setting 'mcp_servers' (in {path}): should be a table, got a number"),
    ],
)
def test_a_wrong_kind_of_value_in_a_settings_file_is_said_in_toml_words(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, line: str, problem: str
) -> None:
    monkeypatch.delenv("MASTERPLANNER_HOME")  # else it wins over the file's home
    path = write_toml(Path.cwd(), line + "\n")
    with pytest.raises(SettingsError) as caught:
        Settings.load()
    assert str(caught.value) == "invalid settings: " + problem.format(path=path)


@pytest.mark.parametrize(
    "url", ["not a url", "127.0.0.1:4318", "http://[::1", "ftp://host", "http://", "http://h:x"]
)
def test_an_otel_endpoint_that_is_not_an_http_url_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Before, each run failed in the exporter with its own words ("Perhaps you meant https://…")."""
    monkeypatch.setenv("MASTERPLANNER_OTEL_ENDPOINT", url)
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        "invalid settings: setting 'otel_endpoint' (from MASTERPLANNER_OTEL_ENDPOINT): expected an http:// "
        f"or https:// URL such as http://127.0.0.1:4318, got {url!r}"
    )
    monkeypatch.setenv("MASTERPLANNER_OTEL_ENDPOINT", " https://collector.example:4318/ ")
    assert Settings.load().otel_endpoint == "https://collector.example:4318/"


@pytest.mark.parametrize(
    "url", ["notaurl", "localhost:8000/mcp", "http://[::1", "ftp://host/mcp", "http://h:x"]
)
def test_an_mcp_server_url_that_is_not_an_http_url_is_refused_naming_the_setting(
    isolated: Path, url: str
) -> None:
    """Before, the settings loaded and each run failed listing the server's tools, in the MCP library's words.

    ("MCP server 'remote': cannot list its tools: ValueError: Invalid HTTP/S URL provided for …")
    """
    path = write_toml(Path.cwd(), f'[mcp_servers.remote]\nurl = "{url}"\n')
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting 'mcp_servers.remote.url' (in {path}): expected an http:// or "
        f"https:// URL such as http://localhost:8000/mcp, got {url!r}"
    )
    write_toml(Path.cwd(), '[mcp_servers.remote]\nurl = " http://localhost:8000/mcp "\n')
    assert str(Settings.load().mcp_servers["remote"].url) == "http://localhost:8000/mcp"


def test_a_home_that_is_a_file_or_empty_is_refused_naming_its_variable(
    isolated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, a file failed each command as "database folder /etc/passwd: cannot create: File exists".

    And an empty MASTERPLANNER_HOME made the current directory the home, database and all.
    """
    from masterplanner.settings import default_home

    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    monkeypatch.setenv("MASTERPLANNER_HOME", str(a_file))
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting 'home' (from MASTERPLANNER_HOME): {a_file} is a file, not a folder; "
        "the home is the folder runs, agents and logs are kept in"
    )
    monkeypatch.setenv("MASTERPLANNER_HOME", str(a_file / "home"))
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting 'home' (from MASTERPLANNER_HOME): {a_file / 'home'} is under {a_file}, "
        "which is a file, not a folder; the home is the folder runs, agents and logs are kept in"
    )
    monkeypatch.setenv("MASTERPLANNER_HOME", "")
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        "invalid settings: setting 'home' (from MASTERPLANNER_HOME): must not be empty; leave it unset "
        f"for the default home, {default_home()}"
    )
    assert not list(Path.cwd().iterdir())  # nothing made where the command ran
    monkeypatch.setenv("MASTERPLANNER_HOME", str(tmp_path / "new-home"))
    assert Settings.load().home == tmp_path / "new-home"


@pytest.mark.parametrize(
    ("name", "kind", "empty"),
    [
        ("tool_policies", "a JSON object", "{}"),
        ("mcp_servers", "a JSON object", "{}"),
        ("provider_limits", "a JSON object", "{}"),
        ("http_allowed_domains", "a JSON list", "[]"),
    ],
)
def test_a_json_setting_given_null_is_refused_naming_its_variable(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, name: str, kind: str, empty: str
) -> None:
    """Before, `MASTERPLANNER_TOOL_POLICIES=null` was taken silently as the defaults."""
    variable = f"MASTERPLANNER_{name.upper()}"
    monkeypatch.setenv(variable, " null ")
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting {name!r} (from {variable}): should be {kind}, got null; "
        f"write {empty} or leave the variable unset for the default"
    )
    monkeypatch.setenv(variable, empty)
    assert getattr(Settings.load(), name) == json.loads(empty)


@pytest.mark.parametrize("name", ["a b", "notes.v2", "ünï", ""])
def test_an_mcp_server_name_that_cannot_begin_a_tool_name_is_refused_naming_the_setting(
    isolated: Path, name: str
) -> None:
    """Before, `[mcp_servers."a b"]` loaded; its tools, `a b_<tool>`, are names providers refuse."""
    path = write_toml(Path.cwd(), f'[mcp_servers."{name}"]\ncommand = "true"\n')
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting 'mcp_servers' (in {path}): server name {name!r} may hold only ASCII "
        "letters, digits, '_' and '-': its tools are named <server>_<tool>, and model providers take no "
        "other characters in a tool name"
    )
    write_toml(Path.cwd(), '[mcp_servers.Notes_v2-b]\ncommand = "true"\n')
    assert list(Settings.load().mcp_servers) == ["Notes_v2-b"]


def test_an_mcp_server_name_of_any_length_loads(isolated: Path) -> None:
    """A name of more than 32 characters was refused (its tools' names went past 64 characters),
    and a configuration that worked elsewhere stopped loading: its tools' names are shortened instead
    (`tools.mcp_names.mcp_tool_prefix`)."""
    write_toml(Path.cwd(), f'[mcp_servers.{"n" * 70}]\ncommand = "true"\n')
    assert list(Settings.load().mcp_servers) == ["n" * 70]


@pytest.mark.parametrize(
    ("setting", "example"),
    [("searxng_url", "http://127.0.0.1:8888"), ("image_base_url", "https://api.openai.com/v1")],
)
@pytest.mark.parametrize("url", ["ftp://host", "notaurl", "http://[::1", "https://exa\tmple.com/v1"])
def test_a_search_or_image_server_url_that_is_not_an_http_url_is_refused_naming_the_setting(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, setting: str, example: str, url: str
) -> None:
    """Before, they loaded, and each web_search or generate_image call failed in httpx's words.

    ("web search (searxng) failed: UnsupportedProtocol: Request URL has an unsupported protocol …")
    """
    variable = f"MASTERPLANNER_{setting.upper()}"
    monkeypatch.setenv(variable, url)
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert str(refused.value) == (
        f"invalid settings: setting {setting!r} (from {variable}): expected an http:// or https:// URL "
        f"such as {example}, got {url!r}"
    )
    monkeypatch.setenv(variable, f" {example} ")
    assert getattr(Settings.load(), setting) == example
    monkeypatch.setenv(variable, "")  # empty: none (SearXNG unset; OpenAI's own images API)
    assert getattr(Settings.load(), setting) is None


def test_a_home_masterplanner_creates_is_only_its_owners(isolated: Path, tmp_path: Path) -> None:
    """Whichever creates it first: the home, the run store's folder, a workspace's record, the web token."""
    from masterplanner import RunService
    from masterplanner.web.auth import web_token

    assert (Settings.load().ensure_home().stat().st_mode & 0o777) == 0o700
    for made in ("service", "workspace", "token"):
        home = tmp_path / made / "home"
        settings = Settings.load(home=home)
        if made == "service":
            RunService(settings).close()
        elif made == "workspace":
            settings.record_workspace(tmp_path / "work")
        else:
            web_token(home)
        assert (made, home.stat().st_mode & 0o777) == (made, 0o700)


def test_a_home_the_person_made_keeps_its_permissions(isolated: Path) -> None:
    isolated.mkdir(mode=0o755)
    isolated.chmod(0o755)
    Settings.load().ensure_home()
    assert (isolated.stat().st_mode & 0o777) == 0o755


def test_a_refused_server_url_is_quoted_without_its_password(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MASTERPLANNER_SEARXNG_URL", "ftp://alice:s3cretpass@search.example")
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert "s3cretpass" not in str(refused.value)
    assert str(refused.value).endswith("got 'ftp://alice:[secret removed]@search.example'")
    monkeypatch.delenv("MASTERPLANNER_SEARXNG_URL")
    write_toml(Path.cwd(), '[mcp_servers.remote]\nurl = "htps://user:sk-proj-abcdefghijklmnop@host/mcp"\n')
    with pytest.raises(SettingsError) as refused:
        Settings.load()
    assert "abcdefghijklmnop" not in str(refused.value)
    assert str(refused.value).endswith("got 'htps://user:[secret removed]@host/mcp'")


def test_a_settings_file_in_a_recorded_workspace_or_a_folder_inside_one_is_not_read_and_says_which(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder inside a workspace was said to be "the workspace of an earlier run" itself."""
    workspace = Path.cwd().resolve()
    Settings.load().record_workspace(workspace)
    inner = workspace / "src" / "deep"
    inner.mkdir(parents=True)
    seen = []
    for folder in (workspace, inner):
        planted = write_toml(folder, 'model = "openai:planted"\n')
        monkeypatch.chdir(folder)
        settings = Settings.load()
        assert settings.model != "openai:planted"
        seen.append(settings.ignored_config)
    fix = (
        f"settings are never read from a workspace. Put them in {isolated / 'masterplanner.toml'}, "
        "the environment or flags"
    )
    assert seen == [
        (
            workspace / "masterplanner.toml",
            f"{workspace} is the workspace of an earlier run ({workspace}), where steps write; {fix}",
        ),
        (
            planted,
            f"{inner} is inside the workspace of an earlier run ({workspace}), where steps write; {fix}",
        ),
    ]
