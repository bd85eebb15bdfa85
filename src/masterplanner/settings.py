"""Settings: where masterplanner keeps its data, which model it uses, and their limits.

Each setting comes from, highest precedence first:

1. arguments to `Settings.load` (the CLI passes its flags here),
2. environment variables `MASTERPLANNER_<NAME>`,
3. `masterplanner.toml` in the current directory — unless that directory is, or lies inside, a
   folder a run has used as its workspace (see below),
4. `masterplanner.toml` in the home directory.

The home directory itself is found the same way, minus the home file (which lives inside it).
API keys are deliberately not settings: providers read them from their own environment
variables, so they never land in a file, a log line or the database.

Settings never come from a place a step can write. A step writes into its run's workspace, and
`--workspace .` is a natural choice, so a settings file found there may be tool output: a planted
`[mcp_servers]` command would run on the host before any approval, a planted `tool_policies`
would turn `ask` into `auto`. Every run records its workspace in `workspaces.jsonl` in the home
directory (the one named by flag, environment or default: never one a settings file in the
current directory names), and a `masterplanner.toml` inside any recorded workspace is not read
(`Settings.ignored_config` says which file and why, and the CLI warns). This was chosen over
refusing `--workspace .`: the refusal would only hold for the run that names the folder, while
the person's next run in that folder, with any workspace, is the one that reads the file. The
tools also refuse to write such files (`tools/protected.py`); this is the second line.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Collection, Mapping, Sequence
from itertools import pairwise
from pathlib import Path
from typing import Any, Literal, TypeGuard, get_args, get_origin

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .errors import SettingsError, json_kind, problem_in_our_words
from .redaction import configure_secrets, is_secret_name, url_secrets
from .text_files import read_text
from .tools.mcp import McpServer, is_http_url

__all__ = [
    "CONFIG_FILE_NAME",
    "ENV_PREFIX",
    "OTHER_VARIABLES",
    "PROVIDERS",
    "WORKSPACES_FILE_NAME",
    "ProviderLimit",
    "Settings",
    "default_home",
    "known_workspaces",
    "lacking_credential_text",
    "missing_credential",
    "provider_of",
    "record_workspace",
]

ENV_PREFIX = "MASTERPLANNER_"
CONFIG_FILE_NAME = "masterplanner.toml"
OTHER_VARIABLES = frozenset(
    {"MASTERPLANNER_BENCHMARKS", "MASTERPLANNER_TEST_ARTIFACTS", "MASTERPLANNER_ANCHOR"}
)
"""`MASTERPLANNER_*` variables that are not settings: the benchmark data, test artifacts, bench's anchor."""
WORKSPACES_FILE_NAME = "workspaces.jsonl"
"""In the home directory: every folder a run has used as its workspace, one JSON string a line."""


def default_home() -> Path:
    """The platform's per-user data directory for masterplanner (not created here)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("masterplanner", appauthor=False))


def _read_toml(path: Path) -> dict[str, Any]:
    text = read_text(path, error=SettingsError)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc


def _is_settings_file(path: Path) -> bool:
    """Whether `path` is there to read; `SettingsError` for a folder or other non-file by that name.

    A folder called masterplanner.toml was passed over in silence, with every setting in it unread.
    """
    if path.is_file():
        return True
    if path.exists():
        raise SettingsError(f"{path}: is not a file; a settings file is a TOML file")
    return False


def known_workspaces(home: Path) -> list[Path]:
    """The folders runs recorded in `home` have used as workspaces (resolved, oldest first)."""
    path = home.expanduser() / WORKSPACES_FILE_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read the list of workspaces: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as handle:
        lines = handle.read().decode("utf-8", errors="replace").splitlines()
    folders = []
    for line in lines:
        try:
            folder = json.loads(line)
        except ValueError:
            continue  # a torn last line from a crash; the next run records its folder again
        if isinstance(folder, str) and folder:
            folders.append(Path(folder))
    return folders


def record_workspace(home: Path, folder: Path) -> None:
    """Add `folder` to the workspaces recorded in `home` (settings files inside it are not read)."""
    folder = folder.resolve()
    if folder in known_workspaces(home):
        return
    path = home.expanduser() / WORKSPACES_FILE_NAME
    line = (json.dumps(str(folder)) + "\n").encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, line)  # one append of one short line: concurrent runs never interleave
        finally:
            os.close(fd)
    except OSError as exc:
        raise SettingsError(f"{path}: cannot record workspace {folder}: {exc.strerror}") from exc


def _workspace_holding(path: Path, home: Path) -> Path | None:
    """The recorded workspace that `path` lies in (or is), if any."""
    resolved = path.resolve()
    for folder in known_workspaces(home):
        if resolved == folder or folder in resolved.parents:
            return folder
    return None


_SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
)
"""The operating system's own folders: no workspace may be one of them or inside one."""
_SYSTEM_FOLDERS = ("/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp", "/var", "/var/tmp")
"""Folders shared by the whole system: a workspace may be inside one, never one itself."""


def _unsafe_workspace(folder: Path) -> str | None:
    """Why `folder` (resolved) may not be a workspace, or None."""
    if folder == Path(folder.anchor):
        return "is the root of the file system"
    for tree in _SYSTEM_TREES:
        system = Path(tree)
        if folder == system or system in folder.parents:
            return (
                f"is the system folder {tree}" if folder == system else f"is inside the system folder {tree}"
            )
    homes = {Path.home().resolve()}
    if os.environ.get("HOME"):
        homes.add(Path(os.environ["HOME"]).resolve())
    if folder in homes or folder.parent in (Path("/home"), Path("/Users")):
        return "is a home folder itself"
    if str(folder) in _SYSTEM_FOLDERS:
        return "is a folder the whole system shares"
    return None


def _base_home(flag_home: object) -> Path:
    """The home named by flag, environment or default: never by a file a step might have written."""
    return Path(str(flag_home or os.environ.get(f"{ENV_PREFIX}HOME") or default_home())).expanduser()


class _TomlFiles(PydanticBaseSettingsSource):
    """Reads `masterplanner.toml` from the current directory (if trusted), then from the home directory."""

    def __init__(self, settings_cls: type[BaseSettings], flag_home: object) -> None:
        super().__init__(settings_cls)
        cwd_file = Path.cwd() / CONFIG_FILE_NAME
        self.ignored: tuple[Path, str] | None = None
        cwd_data: dict[str, Any] = {}
        if cwd_file.exists() and (workspace := _workspace_holding(cwd_file.parent, _base_home(flag_home))):
            where = "is" if cwd_file.parent.resolve() == workspace else "is inside"
            self.ignored = (
                cwd_file,
                f"{cwd_file.parent} {where} the workspace of an earlier run ({workspace}), where steps "
                "write; settings are never read from a workspace. Put them in "
                f"{_base_home(flag_home) / CONFIG_FILE_NAME}, the environment or flags",
            )
        elif _is_settings_file(cwd_file):
            cwd_data = _read_toml(cwd_file)
        home = flag_home or os.environ.get(f"{ENV_PREFIX}HOME") or cwd_data.get("home") or default_home()
        home_file = Path(str(home)).expanduser() / CONFIG_FILE_NAME
        home_data = _read_toml(home_file) if home_file != cwd_file and _is_settings_file(home_file) else {}
        if "home" in home_data and _same_folder(home_data["home"], home):
            del home_data["home"]  # it names the folder it is in: nothing to obey or refuse
        if "home" in home_data:
            raise SettingsError(
                f"{home_file}: sets home, which the home folder's own settings file cannot (it is "
                "found inside the home); set it with MASTERPLANNER_HOME or masterplanner.toml in the "
                "current directory"
            )
        self.origin = dict.fromkeys(home_data, home_file) | dict.fromkeys(cwd_data, cwd_file)
        self.data = home_data | cwd_data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


_URL_EXAMPLES = {"searxng_url": "http://127.0.0.1:8888", "image_base_url": "https://api.openai.com/v1"}
"""What the URL settings' errors give as an example."""

PROVIDERS = ("anthropic", "local", "ollama", "openai", "scripted")
"""The providers a model spec may name (its part before the first colon); each has a step queue."""


def provider_of(spec: str) -> str:
    """The provider a model spec names: `local` for `local` and `local:PATH`, else its prefix."""
    return spec.strip().partition(":")[0]


_CREDENTIALS: dict[str, tuple[str, ...]] = {
    "openai": ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
    "anthropic": ("ANTHROPIC_API_KEY",),
}
"""The environment variables, any one of which a provider's requests need (the first is its key)."""


def missing_credential(provider: str) -> str | None:
    """The environment variable `provider` needs and this process lacks, or None when it has what it needs.

    Only hosted providers need one: the embedded and scripted models run here, and an Ollama
    server is reached without a key. Here, not in `models`, so that opening the registry with a
    provider's embedder checks its key without importing the models or pydantic-ai.
    """
    names = _CREDENTIALS.get(provider, ())
    if not names or any(os.environ.get(name) for name in names):
        return None
    return names[0]


def lacking_credential_text(provider: str) -> str:
    """What `provider` lacks here, in words: `"X is not set here"`, or `"neither X nor Y is set here"`.

    Only for a provider `missing_credential` found lacking. OpenAI's requests need a key or a
    compatible server's address (which may need no key), and a message naming only the key sent
    a person with a local server off to make one up.
    """
    names = _CREDENTIALS.get(provider, ())
    if len(names) == 2:
        return f"neither {names[0]} nor {names[1]} is set here"
    return f"{' or '.join(names)} is not set here"


def needed_credential_text(provider: str) -> str | None:
    """The environment variables `provider`'s requests need, in words (`"X or Y"`), or None if none.

    For a hint of where to start a worker for it: `local`, `scripted` and `ollama` need none, and
    a hint naming "the provider's API key" for them sent a person looking for a key that is not.
    """
    names = _CREDENTIALS.get(provider, ())
    return " or ".join(names) or None


class ProviderLimit(BaseModel):
    """How many steps using one provider's models may run at once and start per minute, on all workers."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int | None = Field(None, ge=1, le=100_000, description="steps running at once")
    per_minute: int | None = Field(None, ge=1, le=1_000_000, description="steps started per minute")


class Settings(BaseSettings):
    """Validated settings (`Settings.load()` also notes a settings file it did not read)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid", validate_default=True)

    home: Path = Field(default_factory=default_home, description="where runs, the registry and logs live")
    model: str = Field("local", min_length=1, description="default model spec, e.g. local or openai:gpt-4o")
    database_url: str = Field("", description="SQLite or Postgres URL; empty means a SQLite file under home")
    local_context_tokens: int = Field(8192, ge=512, le=131072, description="llama.cpp context size")
    local_threads: int | None = Field(None, ge=1, le=256, description="llama.cpp threads; empty = all cores")
    local_max_output_tokens: int = Field(2048, ge=16, le=32768, description="cap on one local generation")
    http_allowed_domains: list[str] = Field(
        default_factory=list, description="domains (and subdomains) http_request may reach; '*' for any"
    )
    http_allow_loopback: bool = Field(
        False, description="let http_request reach 127.0.0.1 / ::1 (tests only)"
    )
    web_search_backend: Literal["none", "local", "searxng", "brave", "tavily"] = Field(
        "none", description="who answers web_search: a folder of text files, SearXNG, Brave or Tavily"
    )
    web_search_folder: Path | None = Field(None, description="the folder web_search_backend=local searches")
    searxng_url: str | None = Field(None, description="base URL of a SearXNG instance (its JSON API)")
    image_model: str = Field("gpt-image-1", description="model generate_image asks for")
    image_base_url: str | None = Field(
        None, description="OpenAI-compatible images API base URL; empty = OpenAI"
    )
    reuse_threshold: float = Field(
        0.6, ge=0, le=1.01, description="task similarity above which a run reuses a stored team (1.01: never)"
    )
    agent_reuse_threshold: float = Field(
        0.75,
        ge=0,
        le=1.01,
        description="similarity of a step to a stored agent above which the step reuses it (1.01: never)",
    )
    embedder: str = Field(
        "smollm2",
        min_length=1,
        description="registry embeddings: smollm2 (the shipped GGUF, llama.cpp), none (words only), "
        "local (MiniLM), sentence-transformers:NAME or PROVIDER:MODEL",
    )
    remember_runs: Literal["always", "ask", "never"] = Field(
        "always",
        description="store the agents and team of an approved run that succeeds (ask: the person says)",
    )
    memory_ttl_days: float = Field(
        180, gt=0, le=36500, description="days a memory lives after it was stored or last recalled"
    )
    memory_max_items: int = Field(
        10_000, ge=1, le=10_000_000, description="most memories kept; the least recently used go first"
    )
    workspace_max_growth_bytes: int = Field(
        1 << 30,
        ge=0,
        le=1 << 44,
        description="how many bytes a run's workspace may grow by (write_file, code_execution, images)",
    )
    run_lease_s: float = Field(
        10.0,
        ge=1,
        le=600,
        description="seconds after its executing process was last heard from that a run may be taken over",
    )
    worker_concurrency: int = Field(
        4, ge=1, le=1000, description="steps one worker runs at once (masterplanner worker --concurrency)"
    )
    provider_limits: dict[str, ProviderLimit] = Field(
        default_factory=dict,
        description="per provider (openai, anthropic, local, ollama, scripted): steps at once and per "
        "minute, across all workers",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="how worker and serve log to stderr: text, or one JSON object a line"
    )
    otel_endpoint: str = Field(
        "",
        max_length=2_000,
        description="OTLP/HTTP base URL runs' traces go to (empty: OTEL_EXPORTER_OTLP_ENDPOINT, else none)",
    )
    queue_poll_s: float = Field(
        0.2, ge=0.01, le=10, description="how often a worker looks for steps on its queues, in seconds"
    )
    model_attempts: int = Field(
        4,
        ge=1,
        le=20,
        description="tries of a model server request that fails in passing (429, 5xx, no answer, "
        "dropped connection), waiting as the server asks or 1, 2, 4 … s between",
    )
    model_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="seconds a model server has to answer one request"
    )

    @field_validator("home", mode="before")
    @classmethod
    def _home_given(cls, home: object) -> object:
        """Empty is refused, as for every setting that cannot be empty (`model`, `local_threads`).

        Before, an empty MASTERPLANNER_HOME made the current directory the home: the database and
        logs were written wherever the command ran.
        """
        if isinstance(home, str) and not home.strip():
            raise ValueError(f"must not be empty; leave it unset for the default home, {default_home()}")
        return home

    @field_validator("home")
    @classmethod
    def _home_a_folder(cls, home: Path) -> Path:
        """A home that is a file, or lies under one, is refused naming that file.

        Before, `MASTERPLANNER_HOME=/etc/passwd` failed each command with "database folder
        /etc/passwd: cannot create: File exists", naming no setting.
        """
        place = home.expanduser()
        while not place.exists() and place.parent != place:
            place = place.parent
        if place.exists() and not place.is_dir():
            where = "is" if place == home.expanduser() else f"is under {place}, which is"
            raise ValueError(
                f"{home} {where} a file, not a folder; "
                "the home is the folder runs, agents and logs are kept in"
            )
        return home

    @field_validator("model")
    @classmethod
    def _model_given(cls, spec: str) -> str:
        """A spec of spaces was taken and refused at the first run as `unknown model ''`."""
        spec = spec.strip()
        if not spec:
            raise ValueError("must not be blank; give a model spec such as local or openai:gpt-4o")
        return spec

    @field_validator("embedder")
    @classmethod
    def _embedder_form(cls, spec: str) -> str:
        """One of the forms the registry can embed with (its model is loaded when first needed).

        A word that is none of them failed each run at its end instead, and `doctor` said nothing.
        """
        spec = spec.strip()
        if spec in ("smollm2", "none", "local"):
            return spec
        head, colon, rest = spec.partition(":")
        if not colon or not head or not rest.strip():
            raise ValueError(
                f"expected smollm2, none, local, sentence-transformers:NAME or PROVIDER:MODEL, got {spec!r}"
            )
        return spec

    @field_validator("otel_endpoint")
    @classmethod
    def _otlp_url(cls, url: str) -> str:
        """Empty, or an http(s) URL with a host: anything else failed in the exporter, in its words.

        Before, "127.0.0.1:4318" or "http://[::1" failed each run with the library's error and
        advice ("Perhaps you meant https://…"), naming no setting.
        """
        url = url.strip()
        if url and not is_http_url(url):
            from .database import shown_url  # its password never in the message

            raise ValueError(
                f"expected an http:// or https:// URL such as http://127.0.0.1:4318, got {shown_url(url)!r}"
            )
        return url

    @field_validator("searxng_url", "image_base_url")
    @classmethod
    def _server_url(cls, url: str | None, info: ValidationInfo) -> str | None:
        """None (empty), or an http(s) URL with a host.

        Before, "ftp://host" or "http://[::1" loaded, and each web_search or generate_image call
        failed in httpx's words ("UnsupportedProtocol: Request URL has an unsupported protocol").
        """
        url = (url or "").strip()
        if not url:
            return None
        if not is_http_url(url):
            example = _URL_EXAMPLES[str(info.field_name)]
            from .database import shown_url  # its password never in the message

            raise ValueError(f"expected an http:// or https:// URL such as {example}, got {shown_url(url)!r}")
        return url

    @field_validator("http_allowed_domains")
    @classmethod
    def _host_names(cls, domains: list[str]) -> list[str]:
        """Entries are host names (`example.com`, `*.example.com`), addresses or `*`.

        A URL, a port or a path never matched any request: the allowlist refused what it seemed
        to allow.
        """
        import ipaddress
        import re

        label = r"(?!-)[a-z0-9_-]{1,63}(?<!-)"
        for entry in domains:
            name = entry.strip().removeprefix("*.").rstrip(".").lower()
            if entry.strip() == "*":
                continue
            try:
                ipaddress.ip_address(name.strip("[]"))
                continue
            except ValueError:
                pass
            try:
                ascii_name = name.encode("idna").decode("ascii")
            except UnicodeError:
                ascii_name = ""
            if not re.fullmatch(rf"{label}(\.{label})*", ascii_name):
                from .database import shown_url  # a URL given here may hold a password

                raise ValueError(
                    f"{shown_url(entry)!r} is not a host name; give host names such as example.com (a "
                    "subdomain of one is allowed too), not URLs, ports or paths, or '*' for any host"
                )
        return domains

    @field_validator("provider_limits")
    @classmethod
    def _known_providers(cls, limits: dict[str, ProviderLimit]) -> dict[str, ProviderLimit]:
        unknown = sorted(set(limits) - set(PROVIDERS))
        if unknown:
            raise ValueError(f"no provider {unknown[0]!r}; providers are {', '.join(PROVIDERS)}")
        return limits

    mcp_servers: dict[str, McpServer] = Field(
        default_factory=dict, description="MCP servers whose tools steps may use, by name (see README)"
    )

    @field_validator("mcp_servers")
    @classmethod
    def _tool_name_safe(cls, servers: dict[str, McpServer]) -> dict[str, McpServer]:
        """Server names of ASCII letters, digits, `_` and `-`: they begin its tools' names.

        Before, `[mcp_servers."a b"]` loaded and its tools were named `a b_<tool>`, a name model
        providers refuse (they take ^[a-zA-Z0-9_-]{1,64}$). Any length: a long one's tools are
        offered under a shortened start (`tools.mcp_names.mcp_tool_prefix`).
        """
        import re

        for name in servers:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", name):
                raise ValueError(
                    f"server name {name!r} may hold only ASCII letters, digits, '_' and '-': its tools "
                    "are named <server>_<tool>, and model providers take no other characters in a tool name"
                )
        return servers

    tool_policies: dict[str, Literal["auto", "ask", "deny"]] = Field(
        default_factory=dict, description="approval policy per tool, overriding the catalog's"
    )

    _ignored_config: tuple[Path, str] | None = PrivateAttr(default=None)
    _trusted_home: Path | None = PrivateAttr(default=None)
    _given: frozenset[str] = PrivateAttr(default=frozenset())

    def source_of(self, name: str) -> str:
        """Where setting `name` came from, in the words errors use (`in FILE`, `from VARIABLE`).

        An error found in a setting's value after loading (a model file that is not there, a
        tool policy naming no tool) names the setting and its source, as a load error does.
        """
        flag_home = self.home if "home" in self._given else None
        return _source(name, self._given, _TomlFiles(Settings, flag_home).origin)

    def problem_in(self, name: str, problem: str) -> str:
        """`problem` with the setting `name` it is about and where that setting came from."""
        return f"setting {name!r} ({self.source_of(name)}): {problem}"

    @property
    def ignored_config(self) -> tuple[Path, str] | None:
        """A settings file that was found but not read, and why (front ends warn about it)."""
        return self._ignored_config

    @model_validator(mode="after")
    def _resolve_paths(self) -> Settings:
        self.home = self.home.expanduser()
        if not self.database_url:
            self.database_url = f"sqlite:///{self.home / 'masterplanner.sqlite'}"
        for name, server in self.mcp_servers.items():  # a stdio server's own messages: its log file
            if server.command is not None and server.log_file is None:
                log = self.home / "logs" / f"mcp-{name}.log"
                self.mcp_servers[name] = server.model_copy(update={"log_file": log})
        configure_secrets(self, self._secrets())
        return self

    def _secrets(self) -> list[str]:
        """The secrets these settings hold, for `redaction` to know whatever their shape.

        A URL setting's password and credential parameters (`database_url`, `searxng_url`,
        `image_base_url`, `otel_endpoint`, an MCP server's `url`), and an MCP server's `env` values
        and `--name value` / `--name=value` arguments named as secrets (`GITHUB_TOKEN`,
        `--api-key`). Before, a secret set here rather than in the environment reached the model,
        the events, the audit and the log whenever an error quoted it without a credential's shape.
        """
        urls = [self.database_url, self.searxng_url, self.image_base_url, self.otel_endpoint]
        urls += [server.url for server in self.mcp_servers.values()]
        found = [secret for url in urls if url for secret in url_secrets(url)]
        for server in self.mcp_servers.values():
            found += [value for name, value in server.env.items() if is_secret_name(name)]
            for flag, following in pairwise([*server.args, ""]):
                name, equals, value = flag.partition("=")
                if name.startswith("-") and is_secret_name(name.lstrip("-")):
                    found.append(value if equals else following)
        return found

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then environment, then the TOML files (current directory before home)."""
        flag_home = (
            init_settings.init_kwargs.get("home") if isinstance(init_settings, InitSettingsSource) else None
        )
        return init_settings, env_settings, _TomlFiles(settings_cls, flag_home)

    def __init__(self, **values: Any) -> None:
        """Settings from `values` (they win), the environment and the settings files.

        `SettingsError` naming each invalid setting and where it came from, also when a program
        builds them itself (`Settings(home=…)`): it got pydantic's `ValidationError` before.
        """
        from pydantic_settings import SettingsError as SourceError

        _check_variable_names()
        _check_json_nulls()
        try:
            super().__init__(**values)
            self._given = frozenset(values)
        except ValidationError as exc:
            raise SettingsError(_describe(exc, values)) from None
        except SourceError as exc:
            raise SettingsError(_describe_source_error(exc)) from None

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Load settings; `overrides` (CLI flags) win. `None` values are treated as not given."""
        given = {key: value for key, value in overrides.items() if value is not None}
        settings = cls(**given)
        settings._ignored_config = _TomlFiles(Settings, given.get("home")).ignored
        settings._trusted_home = _base_home(given.get("home"))
        return settings

    def check_workspace(self, folder: Path) -> None:
        """Refuse (`SettingsError`) a workspace that no run may have, by where it is alone.

        A workspace that is masterplanner's home, or holds it, is refused: steps could then
        rewrite the settings, the registry and the runs of every later run. So is one that is
        `/`, a system folder (or inside one of the operating system's own), or a home folder
        itself. Nothing on disk is read or made: a run checks this before it makes the folder
        or measures what it holds (the measure of `/` took seconds, for a refusal).
        """
        folder = folder.resolve()
        refusal = _unsafe_workspace(folder)
        if refusal is not None:
            raise SettingsError(
                f"workspace {folder} {refusal}; steps write and delete files there. Choose a folder of "
                "its own"
            )
        homes = {self.home.resolve(), (self._trusted_home or _base_home(None)).resolve()}
        for home in homes:
            if home == folder or folder in home.parents:
                raise SettingsError(
                    f"workspace {folder} holds masterplanner's home {home}; steps could change its "
                    "settings, agents and runs there. Choose a folder outside it"
                )
            shared = home / "workspaces"  # where each run's own workspace is made
            if folder == shared or (home in folder.parents and shared not in folder.parents):
                raise SettingsError(
                    f"workspace {folder} is inside masterplanner's home {home}, among its own data or "
                    f"the runs' workspaces; steps could change them there. Choose a folder outside it"
                )

    def record_workspace(self, folder: Path) -> None:
        """Record `folder` as a run's workspace, so no settings are read from it from now on.

        Refused, recording nothing, as `check_workspace` refuses it.
        """
        folder = folder.resolve()
        self.check_workspace(folder)
        homes = {self.home.resolve(), (self._trusted_home or _base_home(None)).resolve()}
        for home in homes:
            try:
                home.mkdir(mode=0o700, parents=True, exist_ok=True)  # its owner's only, as ensure_home
            except OSError as exc:
                raise SettingsError(f"home directory {home}: cannot create: {exc.strerror}") from exc
            record_workspace(home, folder)

    def ensure_home(self) -> Path:
        """Create the home directory if needed and return it.

        A home created here is its owner's only (0700): it holds what people typed. A folder the
        person made themselves keeps the permissions they gave it.
        """
        try:
            self.home.parent.mkdir(parents=True, exist_ok=True)
            self.home.mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise SettingsError(f"home directory {self.home}: cannot create: {exc.strerror}") from exc
        return self.home


def _same_folder(given: object, home: object) -> bool:
    """Whether setting `home` to `given` names the folder `home` is (`~` expanded, links resolved)."""
    if not isinstance(given, str):
        return False
    return Path(given).expanduser().resolve() == Path(str(home)).expanduser().resolve()


def _describe_source_error(exc: Exception) -> str:
    """pydantic-settings' "error parsing value for field …" in our words, naming the variable."""
    import re

    found = re.search(r'field "([^"]+)"', str(exc))
    name = found.group(1) if found else ""
    field = Settings.model_fields.get(name)
    variable = f"{ENV_PREFIX}{name.upper()}"
    if field is None or variable not in os.environ:
        return f"invalid settings: {exc}"
    example = '["example.com", "api.example.org"]' if "list" in str(field.annotation) else '{"name": "value"}'
    return (
        f"setting {name!r} (from {variable}): not valid JSON; a list or table in an environment "
        f"variable is written as JSON, e.g. {example}"
    )


def _table_model(loc: Sequence[int | str]) -> type[BaseModel]:
    """The model of the settings table at `loc`: `Settings`, or one of its tables' (`mcp_servers.NAME`).

    An unknown key in `[mcp_servers.v]` was answered with the top-level settings as the known ones.
    """
    shape: Any = Settings
    for part in loc:
        if _is_model(shape) and str(part) in shape.model_fields:
            shape = shape.model_fields[str(part)].annotation
        elif get_origin(shape) is dict:
            shape = get_args(shape)[1]  # a table of tables by name: `part` is the name
        else:
            return Settings
    return shape if _is_model(shape) else Settings


def _is_model(shape: Any) -> TypeGuard[type[BaseModel]]:
    return isinstance(shape, type) and issubclass(shape, BaseModel)


def _check_variable_names() -> None:
    """`SettingsError` for a `MASTERPLANNER_*` variable that is no setting (nor one of `OTHER_VARIABLES`).

    A misspelt variable (`MASTERPLANNER_MODLE`) was ignored, and the run used another model.
    Names are compared without case, as the settings read them.
    """
    from difflib import get_close_matches

    settings = {f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields}
    for variable in sorted(os.environ):
        name = variable.upper()
        if not name.startswith(ENV_PREFIX) or name in settings or name in OTHER_VARIABLES:
            continue
        close = get_close_matches(name, sorted(settings), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        raise SettingsError(
            f"unknown setting variable {variable}: no setting is called "
            f"{name.removeprefix(ENV_PREFIX).lower()!r}; {hint}a MASTERPLANNER_ variable is "
            f"MASTERPLANNER_ and a setting's name: {', '.join(sorted(Settings.model_fields))}"
        )


def _check_json_nulls() -> None:
    """`SettingsError` for a list or table setting whose variable is the JSON `null`.

    pydantic-settings takes a variable whose JSON is `null` as unset: `MASTERPLANNER_TOOL_POLICIES=null`
    silently became the defaults. The README says such a variable is a JSON object or list.
    """
    for name, field in Settings.model_fields.items():
        shape = get_origin(field.annotation)
        variable = f"{ENV_PREFIX}{name.upper()}"
        value = next((v for k, v in os.environ.items() if k.upper() == variable), None)
        if shape not in (dict, list) or value is None or value.strip() != "null":
            continue
        kind, empty = ("a JSON object", "{}") if shape is dict else ("a JSON list", "[]")
        raise SettingsError(
            f"invalid settings: setting {name!r} (from {variable}): should be {kind}, got null; "
            f"write {empty} or leave the variable unset for the default"
        )


def _source(key: str, given: Collection[str], origins: Mapping[str, Path]) -> str:
    """Where setting `key` came from: an argument, its variable, a settings file, or its default."""
    if key in given:
        return "given as a flag or argument"
    if f"{ENV_PREFIX}{key.upper()}" in os.environ:
        return f"from {ENV_PREFIX}{key.upper()}"
    if key in origins:
        return f"in {origins[key]}"
    return "default"


def _describe(exc: ValidationError, given: dict[str, Any]) -> str:
    """One readable line per invalid setting, naming where the value came from."""
    origins = _TomlFiles(Settings, given.get("home")).origin
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        key = str(error["loc"][0]) if error["loc"] else ""
        source = _source(key, given, origins)
        if error["type"] == "extra_forbidden":
            known = ", ".join(sorted(_table_model(error["loc"][:-1]).model_fields))
            lines.append(f"unknown setting {name!r} {source}; known: {known}")
        else:
            problem = problem_in_our_words(error)
            if source.startswith("in ") and error["type"] in ("dict_type", "model_type"):
                problem = f"should be a table, got {json_kind(error.get('input'))}"  # TOML's word
            lines.append(f"setting {name!r} ({source}): {problem}")
    return "invalid settings: " + "; ".join(lines)
