"""Settings: where masterplanner keeps its data, which model it uses, and their limits.

Each setting comes from, highest precedence first:

1. arguments to `Settings.load` (the CLI passes its flags here),
2. environment variables `MASTERPLANNER_<NAME>`,
3. `masterplanner.toml` in the current directory,
4. `masterplanner.toml` in the home directory.

The home directory itself is found the same way, minus the home file (which lives inside it).
API keys are deliberately not settings: providers read them from their own environment
variables, so they never land in a file, a log line or the database.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from .errors import SettingsError
from .tools.mcp import McpServer

__all__ = ["CONFIG_FILE_NAME", "ENV_PREFIX", "Settings", "default_home"]

ENV_PREFIX = "MASTERPLANNER_"
CONFIG_FILE_NAME = "masterplanner.toml"


def default_home() -> Path:
    """The platform's per-user data directory for masterplanner (not created here)."""
    import platformdirs

    return Path(platformdirs.user_data_dir("masterplanner", appauthor=False))


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise SettingsError(f"{path}: cannot read: {exc.strerror}") from exc


class _TomlFiles(PydanticBaseSettingsSource):
    """Reads `masterplanner.toml` from the current directory, then from the home directory."""

    def __init__(self, settings_cls: type[BaseSettings], flag_home: object) -> None:
        super().__init__(settings_cls)
        cwd_file = Path.cwd() / CONFIG_FILE_NAME
        cwd_data = _read_toml(cwd_file) if cwd_file.is_file() else {}
        home = flag_home or os.environ.get(f"{ENV_PREFIX}HOME") or cwd_data.get("home") or default_home()
        home_file = Path(str(home)).expanduser() / CONFIG_FILE_NAME
        home_data = _read_toml(home_file) if home_file.is_file() and home_file != cwd_file else {}
        self.origin = dict.fromkeys(home_data, home_file) | dict.fromkeys(cwd_data, cwd_file)
        self.data = home_data | cwd_data

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self.data.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(self.data)


class Settings(BaseSettings):
    """Validated settings; build with `Settings.load()` so errors come out as `SettingsError`."""

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
        "none",
        min_length=1,
        description="registry embeddings: none, local (MiniLM, extra embeddings), "
        "sentence-transformers:NAME or PROVIDER:MODEL",
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
    mcp_servers: dict[str, McpServer] = Field(
        default_factory=dict, description="MCP servers whose tools steps may use, by name (see README)"
    )
    tool_policies: dict[str, Literal["auto", "ask", "deny"]] = Field(
        default_factory=dict, description="approval policy per tool, overriding the catalog's"
    )

    @model_validator(mode="after")
    def _resolve_paths(self) -> Settings:
        self.home = self.home.expanduser()
        if not self.database_url:
            self.database_url = f"sqlite:///{self.home / 'masterplanner.sqlite'}"
        return self

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

    @classmethod
    def load(cls, **overrides: Any) -> Settings:
        """Load settings; `overrides` (CLI flags) win. `None` values are treated as not given."""
        given = {key: value for key, value in overrides.items() if value is not None}
        try:
            return cls(**given)
        except ValidationError as exc:
            raise SettingsError(_describe(exc, given)) from None

    def ensure_home(self) -> Path:
        """Create the home directory if needed and return it."""
        try:
            self.home.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SettingsError(f"home directory {self.home}: cannot create: {exc.strerror}") from exc
        return self.home


def _describe(exc: ValidationError, given: dict[str, Any]) -> str:
    """One readable line per invalid setting, naming where the value came from."""
    origins = _TomlFiles(Settings, given.get("home")).origin
    lines = []
    for error in exc.errors():
        name = ".".join(str(part) for part in error["loc"]) or "settings"
        key = str(error["loc"][0]) if error["loc"] else ""
        if key in given:
            source = "given on the command line"
        elif f"{ENV_PREFIX}{key.upper()}" in os.environ:
            source = f"from {ENV_PREFIX}{key.upper()}"
        elif key in origins:
            source = f"in {origins[key]}"
        else:
            source = "default"
        if error["type"] == "extra_forbidden":
            lines.append(
                f"unknown setting {name!r} {source}; known: {', '.join(sorted(Settings.model_fields))}"
            )
        else:
            lines.append(f"setting {name!r} ({source}): {error['msg']}")
    return "invalid settings: " + "; ".join(lines)
