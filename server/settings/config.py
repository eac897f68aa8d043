"""Server settings: command-line flags > the config file > environment variables > defaults.

:func:`load_settings` resolves them once into :class:`Settings`; the config file's catalog tables
(``[specialists]``, ``[chains]``) are validated by :meth:`orchestration.chains.catalog.Catalog.load`.
Any bad value is a :class:`~orchestration.errors.ConfigError` naming where it came from, the field
and what is wrong, never a secret's value. Every setting is in docs/reference/configuration.md,
generated from this model by ``docs/gen_config_reference.py`` (a test keeps the two the same).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, InitSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from orchestration.core import AGENT_APPROVER, Budget, Limits, Price
from orchestration.errors import ConfigError
from orchestration.workers import MaxTokensField, StructuredOutputMode
from server.identity import AUTH_TOKEN_IDENTITY, IDENTITY_PATTERN, ROLES, NamedToken, Role
from server.settings.a2a_face import A2aTable
from server.settings.agents import AgentTable, check_agent_names
from server.settings.oauth import AuthTable
from server.settings.sources import (
    NO_FILE_KEY,
    ConfigFileSource,
    EnvironmentSource,
    FlagSource,
    Table,
    env_fields,
    from_env,
)
from server.transports.auth import MIN_TOKEN_CHARS

DeploymentMode = Literal["solo", "team", "enterprise"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
WorkerBackendName = Literal["inline", "provider"]
ProviderName = Literal["anthropic", "openrouter", "openai"]

CONFIG_FILE_NAME = "construct.toml"
DEFAULT_HOME = "~/.construct"
_DEFAULT_LIMITS = Limits()
_TESTS_ONLY = "can only be set in the environment (it is for tests)"


class ProviderTable(BaseModel):
    """A ``[providers.<name>]`` table of the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="the provider's API endpoint: any OpenAI-compatible server for `openai` (vLLM, "
        "llama.cpp, Ollama); default: the provider's public API",
    )
    api_key: str | None = Field(
        default=None,
        min_length=1,
        repr=False,
        description="the API key (default: `ANTHROPIC_API_KEY`, `OPENROUTER_API_KEY` or `OPENAI_API_KEY`); "
        "never logged nor stored",
    )
    max_concurrency: int = Field(
        default=4, ge=1, le=10_000, description="model calls to this provider at once, per server"
    )
    max_tokens_field: MaxTokensField | None = Field(
        default=None,
        description="openai and openrouter only: the one body field that carries the output limit "
        "(default: `max_completion_tokens` for api.openai.com, `max_tokens` for any other host)",
    )
    structured_output: StructuredOutputMode | None = Field(
        default=None,
        description="how typed steps ask for JSON: `auto` (default; falls back json_schema → json_object → "
        "prompt when refused), `json_schema`, `json_object` or `prompt`; anthropic takes `auto` (a forced "
        "tool) or `prompt`",
    )
    stream: bool = Field(
        default=True,
        description="stream answers (deltas to progress, `run_events`, the run page); an endpoint that "
        "refuses a stream is called plainly",
    )


def _checked_token(value: str) -> str:
    """A bearer token, trimmed, or ValueError. The message never repeats the value."""
    # Trimmed: a token pasted with a newline, or made of spaces, is not a secret of 16 characters.
    token = value.strip()
    if len(token) < MIN_TOKEN_CHARS:
        raise ValueError(
            f"must have at least {MIN_TOKEN_CHARS} characters, not counting surrounding whitespace"
        )
    if not all(33 <= ord(c) <= 126 for c in token):
        # It travels in an HTTP header: anything else could never be matched.
        raise ValueError("must be printable ASCII characters without spaces")
    return token


class TokenTable(BaseModel):
    """A ``[tokens.<identity>]`` table of the config file: one bearer token and what its identity
    may do (see :mod:`server.identity`). The token is given either inline (``token``) or as the
    name of the environment variable that holds it (``token_env``), so the file need not hold the
    secret."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token: str | None = Field(
        default=None,
        max_length=4096,
        repr=False,
        description="the bearer token itself (16+ printable characters); or give `token_env`",
    )
    token_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable that holds the token, read when an HTTP transport starts",
    )
    roles: list[Role] = Field(
        min_length=1,
        max_length=len(ROLES),
        description="what the identity may do: `read`, `operate`, `approve`, combined",
    )
    own_runs_only: bool = Field(
        default=False, description="true: the identity sees and acts on only the runs it started"
    )

    @field_validator("token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return None if value is None else _checked_token(value)


class Settings(BaseSettings):
    """The settings of one process: one typed model, read by :func:`load_settings` from its
    sources (flags > the config file > the environment > these defaults). A field's ``Env``
    metadata names its variables; its description is the reference page's (see
    ``docs/gen_config_reference.py``). Built directly (``Settings(home=...)``), it takes its
    arguments and the defaults only: :func:`load_settings` is the one place that reads the
    environment and the file."""

    model_config = SettingsConfigDict(
        extra="forbid", frozen=True, case_sensitive=True, arbitrary_types_allowed=True
    )

    home: Annotated[
        Path, from_env("CONSTRUCT_HOME", not_in_file=NO_FILE_KEY, shown_default="`~/.construct`")
    ] = Field(
        default_factory=lambda: Path(DEFAULT_HOME).expanduser(),
        description="the state directory (runs, the filesystem store, `construct.toml`); `--home`",
    )
    #: The config file read (``--config FILE``, else ``home/construct.toml`` when it exists).
    config_file: Path | None = None
    store: Annotated[str | None, from_env("CONSTRUCT_ORCHESTRATION_STORE")] = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="the store: memory, filesystem, sqlite, postgres or a store URL; `--store` "
        "(default: from the deployment mode)",
    )
    store_fallback: Annotated[bool, from_env("CONSTRUCT_STORE_FALLBACK")] = Field(
        default=True,
        description="an unreachable store falls back to the filesystem store, with a warning in the log "
        "and every run view",
    )
    deployment_mode: Annotated[DeploymentMode, from_env("CONSTRUCT_DEPLOYMENT_MODE")] = Field(
        default="solo",
        description="the store when none is named: `solo` → filesystem; `team`, `enterprise` → postgres",
    )
    database_url: Annotated[str | None, from_env("CONSTRUCT_DATABASE_URL", "DATABASE_URL")] = Field(
        default=None,
        min_length=1,
        max_length=2000,
        repr=False,
        description="the database of the store `postgres`",
    )
    store_pool_size: Annotated[int, from_env("CONSTRUCT_STORE_POOL_SIZE")] = Field(
        default=10,
        ge=1,
        le=1000,
        description="connections this server's `postgres` store opens at most (plus one that listens for "
        "changes); a run being driven holds one only for a statement, so more runs than connections "
        "wait their turn, none fails for it",
    )
    worker_backend: Annotated[WorkerBackendName, from_env("CONSTRUCT_WORKER_BACKEND")] = Field(
        default="inline", description="`inline` (no model calls) or `provider`"
    )
    lease_ttl_seconds: Annotated[float, from_env("CONSTRUCT_LEASE_TTL_SECONDS")] = Field(
        default=30.0, ge=1, le=3600, description="how long a lease on a run lasts unless renewed"
    )
    dispatch_concurrency: Annotated[int, from_env("CONSTRUCT_DISPATCH_CONCURRENCY")] = Field(
        default=4, ge=1, le=10_000, description="runs the dispatcher drives at once"
    )
    poll_seconds: Annotated[float, from_env("CONSTRUCT_POLL_SECONDS")] = Field(
        default=1.0,
        gt=0,
        le=3600,
        description="how often the dispatcher looks for what another process wrote to the store",
    )
    recover_on_start: Annotated[bool, from_env("CONSTRUCT_RECOVER_ON_START")] = Field(
        default=True, description="pick up the runs a dead process left, at startup"
    )
    store_outage_seconds: Annotated[float, from_env("CONSTRUCT_STORE_OUTAGE_SECONDS")] = Field(
        default=30.0,
        gt=0,
        le=86400,
        description="how long a run being driven waits for a store that stopped answering (its provider "
        "call goes on, its next write waits); then the call is cancelled and the run resumes from its "
        "facts once the store is back",
    )
    start_retry_window_seconds: Annotated[float, from_env("CONSTRUCT_START_RETRY_WINDOW_SECONDS")] = Field(
        default=600.0,
        ge=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="`orchestrate_start` without an `idempotency_key`: the same caller sending the same "
        "arguments within this many seconds gets the run it already started (`existing_run: true`; "
        "`new_run: true` starts another); kept in the store, so it holds across restarts and servers "
        "sharing a store; 0 turns it off",
    )
    max_request_chars: Annotated[int, from_env("CONSTRUCT_MAX_REQUEST_CHARS")] = Field(
        default=_DEFAULT_LIMITS.max_request_chars, ge=1, description="the longest request a run accepts"
    )
    max_output_chars: Annotated[int, from_env("CONSTRUCT_MAX_OUTPUT_CHARS")] = Field(
        default=_DEFAULT_LIMITS.max_output_chars, ge=1, description="the longest output a step may record"
    )
    max_answer_chars: Annotated[int, from_env("CONSTRUCT_MAX_ANSWER_CHARS")] = Field(
        default=10_000,
        ge=2_000,
        le=1_000_000,
        description="the most characters a tool answer's text has: host applications cap what they show "
        "of a tool result (Codex CLI about 12,000 characters, cutting the middle silently), so a longer "
        "prompt, output or record is handed out in parts, each answer naming the call for the next; "
        "it must hold a long prompt's first part, which carries the persona whole (the built-in "
        "specialists need 4,213: a smaller bound is refused at start, naming what it needs)",
    )
    log_level: Annotated[LogLevel, from_env("CONSTRUCT_LOG_LEVEL")] = Field(
        default="INFO",
        description="DEBUG, INFO, WARNING, ERROR or CRITICAL; `--log-level`. Unset, `serve` whose "
        "stderr is a terminal logs WARNING and up, and the `runs` commands WARNING",
    )
    auth_token: Annotated[str | None, from_env("CONSTRUCT_AUTH_TOKEN", keep_empty=True)] = Field(
        default=None,
        max_length=4096,
        repr=False,
        description="a secret (16+ characters) every HTTP request must carry as "
        "`Authorization: Bearer <token>` (the identity `admin`, every role; more in `[tokens.IDENTITY]` "
        "tables); required to bind a host other than a loopback one; never logged",
    )
    max_subscriptions: Annotated[int, from_env("CONSTRUCT_MAX_SUBSCRIPTIONS")] = Field(
        default=100, ge=1, le=100_000, description="resource subscriptions one session may hold"
    )
    http_max_sessions: Annotated[int, from_env("CONSTRUCT_HTTP_MAX_SESSIONS")] = Field(
        default=200,
        ge=1,
        le=100_000,
        description="open Streamable HTTP sessions; a new one closes the session idle the longest, or "
        "gets 503 when none is idle",
    )
    http_session_idle_seconds: Annotated[float, from_env("CONSTRUCT_HTTP_SESSION_IDLE_SECONDS")] = Field(
        default=600.0,
        gt=0,
        le=86400,
        description="a Streamable HTTP session with no request in flight for this long is closed",
    )
    fault_crash_after_writes: Annotated[
        int | None, from_env("CONSTRUCT_FAULT_CRASH_AFTER_WRITES", not_in_file=_TESTS_ONLY)
    ] = Field(
        default=None, ge=1, description="**tests only**: SIGKILL the process after its N-th durable write"
    )
    pid_file: Annotated[Path | None, from_env("CONSTRUCT_PID_FILE", not_in_file=_TESTS_ONLY)] = Field(
        default=None, description="tests and the demo: the server writes its process id there"
    )
    provider: Annotated[ProviderName | None, from_env("CONSTRUCT_PROVIDER")] = Field(
        default=None,
        description="the provider backend's provider: anthropic, openrouter or openai (default: inferred "
        "from the model: `claude-*` → anthropic, else OpenRouter or the configured OpenAI-compatible URL)",
    )
    model: Annotated[str | None, from_env("CONSTRUCT_MODEL")] = Field(
        default=None, min_length=1, max_length=200, description="the provider backend's default model"
    )
    max_attempts: Annotated[int, from_env("CONSTRUCT_MAX_ATTEMPTS")] = Field(
        default=3,
        ge=1,
        le=20,
        description="attempts per provider or agent task (recorded in a run at its start)",
    )
    max_tokens: Annotated[int, from_env("CONSTRUCT_MAX_TOKENS")] = Field(
        default=4096, ge=1, description="the output limit of one model call"
    )
    provider_timeout_seconds: Annotated[float | None, from_env("CONSTRUCT_PROVIDER_TIMEOUT_SECONDS")] = Field(
        default=None,
        gt=0,
        description="the timeout of one model call (default: the HTTP read timeout, 600 s)",
    )
    retry_wait_cap_seconds: Annotated[float, from_env("CONSTRUCT_RETRY_WAIT_CAP_SECONDS")] = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="a retry wait up to this long is slept in memory; a longer one is a durable `not_before`",
    )
    anthropic_base_url: Annotated[
        str | None, from_env("CONSTRUCT_ANTHROPIC_BASE_URL", in_table=("providers.anthropic", "base_url"))
    ] = Field(default=None, min_length=1, description="the Anthropic API's base URL (default: the real API)")
    openrouter_base_url: Annotated[
        str | None, from_env("CONSTRUCT_OPENROUTER_BASE_URL", in_table=("providers.openrouter", "base_url"))
    ] = Field(default=None, min_length=1, description="OpenRouter's base URL (default: the real API)")
    openai_base_url: Annotated[
        str | None, from_env("CONSTRUCT_OPENAI_BASE_URL", in_table=("providers.openai", "base_url"))
    ] = Field(
        default=None,
        min_length=1,
        description="an OpenAI-compatible server (OpenAI, vLLM, llama.cpp, Ollama; default: OpenAI's API)",
    )
    openai_max_tokens_field: Annotated[
        MaxTokensField | None,
        from_env(
            "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD",
            in_table=("providers.openai", "max_tokens_field"),
        ),
    ] = Field(
        default=None,
        description="the one body field of the output limit: `max_tokens` or `max_completion_tokens` "
        "(default: from the base URL)",
    )
    openai_structured_output: Annotated[
        StructuredOutputMode | None,
        from_env(
            "CONSTRUCT_OPENAI_STRUCTURED_OUTPUT",
            in_table=("providers.openai", "structured_output"),
        ),
    ] = Field(
        default=None,
        description="how typed steps ask for JSON: `auto` (default), `json_schema`, `json_object` or "
        "`prompt`",
    )
    anthropic_api_key: Annotated[
        str | None, from_env("ANTHROPIC_API_KEY", in_table=("providers.anthropic", "api_key"))
    ] = Field(default=None, repr=False, description="the Anthropic API key (never logged nor stored)")
    openrouter_api_key: Annotated[
        str | None, from_env("OPENROUTER_API_KEY", in_table=("providers.openrouter", "api_key"))
    ] = Field(default=None, repr=False, description="the OpenRouter API key")
    openai_api_key: Annotated[
        str | None, from_env("OPENAI_API_KEY", in_table=("providers.openai", "api_key"))
    ] = Field(default=None, repr=False, description="the OpenAI-compatible server's API key")
    otel: Annotated[
        dict[str, str], from_env("OTEL_", not_in_file=NO_FILE_KEY, prefix=True, shown_default="no export")
    ] = Field(
        default_factory=dict,
        repr=False,
        description="the standard OpenTelemetry variables: traces are exported when they ask for it "
        "(see `server/settings/telemetry.py`)",
    )
    #: ``[providers.<name>]`` tables (they may hold API keys: kept out of ``repr``).
    providers: Annotated[dict[ProviderName, ProviderTable], Table("a provider table")] = Field(
        default_factory=dict, repr=False, description="the provider backend's settings of one provider"
    )
    #: ``[tokens.<identity>]`` tables: the HTTP transports' named tokens besides ``auth_token``.
    tokens: Annotated[dict[str, TokenTable], Table("a tokens table")] = Field(
        default_factory=dict,
        repr=False,
        description="the HTTP transports' bearer tokens besides `auth_token`, one identity each",
    )
    #: ``[auth]``: the identity provider whose JWT access tokens the HTTP transports accept
    auth: Annotated[AuthTable, Table("the [auth] table")] = Field(
        default_factory=AuthTable,
        description="the identity provider (OAuth 2.1 / OpenID Connect) whose access tokens HTTP requests "
        "may carry besides the static tokens (see 'Signing in with your identity provider' in "
        "docs/deployment.md)",
    )
    #: ``[a2a]``: the A2A face's push notifications (:mod:`server.settings.a2a_face`)
    a2a: Annotated[A2aTable, Table("the [a2a] table")] = Field(
        default_factory=A2aTable,
        description="the A2A face's push notifications: the key that signs them, and their limits (see "
        "'Other agents: A2A' in docs/hosts.md)",
    )
    #: ``[prices."<model>"]``: over the dated defaults (see :func:`orchestration.core.pricing.price_table`)
    prices: Annotated[
        dict[str, Price], Table("a prices table", "see 'Costs and budgets' in docs/operations.md")
    ] = Field(
        default_factory=dict,
        description="a model's price, over the dated defaults (a run records its prices at start)",
    )
    #: ``[budgets.<chain>]``: the budget of a run of that chain that gives none at start
    budgets: Annotated[
        dict[str, Budget], Table("a budgets table", "see 'Costs and budgets' in docs/operations.md")
    ] = Field(
        default_factory=dict, description="the budget of every run of the chain that gives none at start"
    )
    #: ``[agents.NAME]`` tables (no secrets: a token's variable name only; see :mod:`server.settings.agents`)
    agents: Annotated[dict[str, AgentTable], Table("an agents table")] = Field(
        default_factory=dict, description="another MCP agent that chain steps delegate to"
    )
    #: The ``[tokens]`` tables with ``token_env`` read (secrets, kept out of ``repr``).
    bearer_tokens: tuple[NamedToken, ...] = Field(default=(), repr=False)
    #: What is wrong with the ``[tokens]`` tables once the environment is read (a variable not set,
    #: a duplicate token), raised by :meth:`named_tokens`.
    tokens_error: ConfigError | None = Field(default=None, repr=False)
    #: The secrets the configuration names by environment variable, read at load (kept out of
    #: ``repr``): ``page`` (``[auth] page_client_secret_env``), ``introspection``
    #: (``[auth] introspection_client_secret_env``), ``push_key`` (``[a2a] push_signing_key_env``).
    env_secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    #: Those variables not set, raised when the secret is asked for (:meth:`page_secret`, ...).
    env_secret_errors: dict[str, ConfigError] = Field(default_factory=dict, repr=False)
    #: Where each explicitly set field came from: ``--flag``, ``config`` or the variable's name.
    sources: dict[str, str] = Field(default_factory=dict)

    _agent_names = field_validator("agents")(check_agent_names)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only what it is given: load_settings passes the sources it read, in their precedence.
        return (init_settings,)

    @field_validator("tokens")
    @classmethod
    def _identities(cls, value: dict[str, TokenTable]) -> dict[str, TokenTable]:
        for name, table in value.items():
            if not IDENTITY_PATTERN.match(name):
                raise ValueError(
                    f"identity {name[:100]!r} must be 1-100 letters, digits or ._@- (starting with a letter "
                    "or digit)"
                )
            if name.casefold() == AGENT_APPROVER:
                # Reserved: a decision recorded as "agent" is the calling agent's, never a person's.
                raise ValueError(
                    f"identity {name!r} is reserved: approvers = [{AGENT_APPROVER!r}] names the "
                    "calling agent; name this identity otherwise"
                )
            if (table.token is None) == (table.token_env is None):
                raise ValueError(f"[tokens.{name}] needs exactly one of token and token_env")
        return value

    @field_validator("providers")
    @classmethod
    def _no_max_tokens_field_for_anthropic(
        cls, value: dict[ProviderName, ProviderTable]
    ) -> dict[ProviderName, ProviderTable]:
        anthropic = value.get("anthropic")
        if anthropic is not None and anthropic.max_tokens_field is not None:
            raise ValueError(
                "[providers.anthropic] takes no max_tokens_field (the Messages API has only max_tokens); "
                "it applies to openai and openrouter"
            )
        if anthropic is not None and anthropic.structured_output in ("json_schema", "json_object"):
            raise ValueError(
                "[providers.anthropic] structured_output is 'auto' (a forced tool) or 'prompt'; "
                "json_schema and json_object apply to openai and openrouter"
            )
        return value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.upper() if isinstance(value, str) else value

    @field_validator("deployment_mode", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.lower() if isinstance(value, str) else value

    @field_validator("anthropic_api_key", "openrouter_api_key", "openai_api_key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        # A key of spaces is no key: the config file's, or none, is used.
        return (value or "").strip() or None

    @field_validator("auth_token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return None if value is None else _checked_token(value)

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")

    def limits(self) -> Limits:
        return Limits(max_request_chars=self.max_request_chars, max_output_chars=self.max_output_chars)

    def push_signing_key(self) -> bytes | None:
        """The PEM key of ``[a2a]`` that signs push notifications (None: none configured, push
        notifications are not offered). Raises ConfigError for a variable not set or a file that
        cannot be read (never quoting the key)."""
        pem = self._env_secret("push_key")
        if pem is not None:
            return pem.encode()
        path = self.a2a.push_signing_key_file
        if path is None:
            return None
        try:
            return path.expanduser().read_bytes()
        except OSError as exc:
            raise ConfigError(
                str(self.config_file), "a2a.push_signing_key_file", f"cannot read {path}: {exc.strerror}"
            ) from None

    def named_tokens(self) -> tuple[NamedToken, ...]:
        """Every token HTTP requests may carry: ``auth_token`` as the identity
        :data:`~server.identity.AUTH_TOKEN_IDENTITY` with every role, then ``[tokens]``. Raises
        the ``ConfigError`` of a ``token_env`` that is not set or is too short, or of a token used
        twice: the HTTP transports call this before they start; stdio and the CLI never do."""
        if self.tokens_error is not None:
            raise self.tokens_error
        single = () if self.auth_token is None else (NamedToken(AUTH_TOKEN_IDENTITY, self.auth_token),)
        return (*single, *self.bearer_tokens)

    def page_secret(self) -> str | None:
        """The run pages' client secret (None: a public client). Raises the ``ConfigError`` of a
        ``page_client_secret_env`` that is not set: the HTTP transports call this before they start."""
        return self._env_secret("page")

    def introspection_secret(self) -> str | None:
        """The secret of the client opaque tokens are introspected as (None: a public client);
        raises as :meth:`page_secret` does."""
        return self._env_secret("introspection")

    def _env_secret(self, kind: str) -> str | None:
        error = self.env_secret_errors.get(kind)
        if error is not None:
            raise error
        return self.env_secrets.get(kind)


#: Environment variable -> settings field (the prefix ``OTEL_`` stands for every variable it starts).
ENV_VARS: dict[str, str] = {var: name for name, _, v in env_fields(Settings) for var in v.names}


def config_file_for(home: Path, explicit: Path | None) -> Path | None:
    """``explicit`` (which must exist), else ``home/construct.toml`` if it exists, else None."""
    if explicit is not None:
        return explicit
    candidate = home / CONFIG_FILE_NAME
    return candidate if candidate.is_file() else None


def resolve_home(explicit: Path | str | None, env: Mapping[str, str]) -> Path:
    """The state directory: ``explicit`` (``--home``), else ``CONSTRUCT_HOME``, else ``~/.construct``,
    as an absolute path. Raises ConfigError, naming where the home came from, for a home that can
    never hold state (see :func:`check_home`) and for a relative ``CONSTRUCT_HOME``: a host starts
    the server in a directory of its choosing, so the variable must not depend on it (``--home``
    may be relative: typed at a prompt, it means the directory the person is in)."""
    named = explicit is not None or "CONSTRUCT_HOME" in env
    where = ("command line", "--home") if explicit is not None else ("environment", "CONSTRUCT_HOME")
    raw = str(explicit) if explicit is not None else env.get("CONSTRUCT_HOME") or DEFAULT_HOME
    if not raw.strip():
        raise ConfigError(*where, "is empty")
    path = Path(raw).expanduser()
    if explicit is None and not path.is_absolute():
        raise ConfigError(
            *where, f"{raw!r} is a relative path; give an absolute one (such as {path.absolute()})"
        )
    # Absolute: every message that names the store shows which directory a relative --home meant.
    home = path.absolute()
    check_home(home, *where, writable=named)
    return home


def check_home(home: Path, file: str, field: str, *, writable: bool = True) -> None:
    """Refuse (ConfigError naming ``file`` and ``field``) a home that is not a directory, or, when
    ``writable``, one that this process cannot write or create. A home that does not exist yet is
    fine when it can be created. The default home is checked only for the first (``writable``
    false): a server on a database store may run where ``~`` cannot be written."""
    if home.exists() and not home.is_dir():
        raise ConfigError(file, field, f"{home} is a file, not a directory")
    existing = next(p for p in (home, *home.parents) if p.exists())
    if not existing.is_dir():
        raise ConfigError(file, field, f"{home} cannot be created: {existing} is a file")
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        problem = "is not writable" if existing == home else f"cannot be created: {existing} is not writable"
        raise ConfigError(file, field, f"{home} {problem} by this user")


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    home: Path | str | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Resolve the settings: ``flags`` (settings field -> value, None meaning "not given") over the
    config file over ``env`` (default: the process environment) over the defaults. Raises
    ConfigError. This is where the process environment is read (and the variables ``[tokens]``
    tables name)."""
    env = os.environ if env is None else env
    resolved_home = resolve_home(home, env)
    file = config_file_for(resolved_home, config_file)
    # Each source validates its own values as it is read (a bad value is refused even where a
    # higher source overrides it); highest precedence first.
    read: list[FlagSource | ConfigFileSource | EnvironmentSource] = [FlagSource(Settings, flags or {})]
    if file is not None:
        read.append(ConfigFileSource(Settings, file))
    read.append(EnvironmentSource(Settings, env, skip=frozenset({"home"})))
    sources: dict[str, str] = {}
    for source in reversed(read):
        sources |= source.labels
    resolved = InitSettingsSource(Settings, {"home": resolved_home, "config_file": file, "sources": sources})
    # BaseSettings.__init__ takes the sources to merge as its documented _build_sources argument
    # (mypy sees only the signature made of the fields).
    settings = Settings(_build_sources=((resolved, *read), {}))  # type: ignore[call-arg]
    settings = settings.model_copy(update=_env_secrets(settings, env, str(file)))
    try:
        tokens = _named_tokens(settings.tokens, env, str(file), settings.auth_token)
    except ConfigError as exc:
        # Raised by named_tokens(), when a transport needs the tokens: stdio and the CLI do not,
        # and need not see the HTTP server's token variables.
        return settings.model_copy(update={"tokens_error": exc})
    return settings.model_copy(update={"bearer_tokens": tokens})


def _env_secrets(settings: Settings, env: Mapping[str, str], source: str) -> dict[str, object]:
    """The update that puts the secrets the configuration names by variable on the settings, and
    the errors of those variables that are not set (each naming the variable, never a value)."""
    secrets: dict[str, str] = {}
    errors: dict[str, ConfigError] = {}
    auth = settings.auth
    for kind, key, name in (
        ("page", "auth.page_client_secret_env", auth.page_client_secret_env),
        ("introspection", "auth.introspection_client_secret_env", auth.introspection_client_secret_env),
        ("push_key", "a2a.push_signing_key_env", settings.a2a.push_signing_key_env),
    ):
        if name is None:
            continue
        value = env.get(name, "")
        if value.strip():
            # a client secret as typed, without the blanks around it; a PEM key whole
            secrets[kind] = value if kind == "push_key" else value.strip()
        else:
            errors[kind] = ConfigError(source, key, f"the environment variable {name} is not set")
    return {"env_secrets": secrets, "env_secret_errors": errors}


def _named_tokens(
    tables: Mapping[str, TokenTable], env: Mapping[str, str], source: str, auth_token: str | None
) -> tuple[NamedToken, ...]:
    """The ``[tokens]`` tables with ``token_env`` read from ``env``; every token must be distinct
    (also from ``auth_token``) and every identity too. Errors name the table, never a value."""
    seen: dict[str, str] = {}
    if auth_token is not None:
        seen[auth_token] = "auth_token (CONSTRUCT_AUTH_TOKEN)"
    out: list[NamedToken] = []
    for name, table in tables.items():
        where = f"tokens.{name}"
        if name == AUTH_TOKEN_IDENTITY and auth_token is not None:
            raise ConfigError(
                source,
                where,
                f"the identity {AUTH_TOKEN_IDENTITY!r} is the one auth_token (CONSTRUCT_AUTH_TOKEN) "
                "stands for; name this identity otherwise",
            )
        token = table.token
        if table.token_env is not None:
            raw = env.get(table.token_env)
            if raw is None or not raw.strip():
                raise ConfigError(
                    source, f"{where}.token_env", f"the environment variable {table.token_env} is not set"
                )
            try:
                token = _checked_token(raw)
            except ValueError as exc:
                raise ConfigError(source, f"{where}.token_env", f"{table.token_env} {exc}") from None
        assert token is not None  # exactly one of token and token_env (checked by the model)
        if token in seen:
            raise ConfigError(
                source,
                where,
                f"its token is the same as {seen[token]}'s; every identity needs a token of its own",
            )
        seen[token] = where
        out.append(NamedToken(name, token, frozenset(table.roles), table.own_runs_only))
    return tuple(out)


__all__ = [
    "CONFIG_FILE_NAME",
    "ENV_VARS",
    "ProviderTable",
    "Settings",
    "TokenTable",
    "check_home",
    "config_file_for",
    "load_settings",
    "resolve_home",
]
