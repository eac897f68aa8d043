"""Server settings: command-line flags > the config file > environment variables > defaults.

The config file is ``--config FILE``, else ``$CONSTRUCT_HOME/construct.toml`` when it exists. Its
top-level keys configure the server; its ``[specialists]`` and ``[chains]`` tables extend the catalog
and are validated by :meth:`orchestration.chains.catalog.Catalog.load`::

    store = "filesystem"            # memory | filesystem | sqlite | postgres | a store URL
    store_fallback = true           # an unreachable store falls back to filesystem, with a warning
    deployment_mode = "solo"        # solo -> filesystem; team / enterprise -> postgres
    database_url = "postgresql://..."
    worker_backend = "inline"       # inline | provider
    lease_ttl_seconds = 30
    dispatch_concurrency = 4
    poll_seconds = 1.0
    recover_on_start = true
    store_outage_seconds = 30       # in-flight work waits this long for a store that went away
    max_request_chars = 200000
    max_output_chars = 1000000
    log_level = "INFO"
    auth_token = "..."              # HTTP transports: clients send 'Authorization: Bearer <token>'
    max_subscriptions = 100         # resource subscriptions per session
    http_max_sessions = 200         # Streamable HTTP: open sessions (the oldest idle one makes room)
    http_session_idle_seconds = 600 # Streamable HTTP: a session idle this long is closed
    provider = "anthropic"          # provider backend: anthropic | openrouter | openai (else inferred)
    model = "claude-sonnet-4-5"     # provider backend: the default model
    max_attempts = 3                # provider backend: attempts per task
    max_tokens = 4096
    provider_timeout_seconds = 300
    retry_wait_cap_seconds = 30         # provider backend: longer retry waits are durable (not_before)

    [providers.openai]              # also [providers.anthropic], [providers.openrouter]
    base_url = "http://127.0.0.1:8080/v1"   # any OpenAI-compatible server (vLLM, llama.cpp, Ollama)
    api_key = "..."                 # else the environment: ANTHROPIC_API_KEY, OPENROUTER_API_KEY,
    max_concurrency = 4             #   OPENAI_API_KEY (keys never reach a log line or a stored record)
    max_tokens_field = "max_tokens" # openai / openrouter only: the one body field that carries the
                                    #   output limit; default max_completion_tokens for api.openai.com,
                                    #   max_tokens for any other host (llama.cpp, vLLM, Ollama, OpenRouter)
    structured_output = "auto"      # how typed steps ask for JSON: auto | json_schema | json_object |
                                    #   prompt (anthropic: auto = a forced tool, or prompt); auto falls
                                    #   back json_schema -> json_object -> prompt when refused

    [prices."claude-sonnet-4-5"]    # US dollars per million tokens; overrides the dated defaults
    input_per_mtok = 3.0            #   of orchestration.core.pricing (a run records its prices at start)
    output_per_mtok = 15.0

    [budgets.default]               # the budget of every run of chain "default" that gives none
    max_total_tokens = 200000       #   (see orchestration.core.budget); also max_cost_usd, and
    on_budget = "ask"               #   steps = { engineer = { max_cost_usd = 0.5 } }

    [agents.reviewer2]              # an MCP agent chain steps delegate to (see server.settings.agents)
    url = "https://review.example.com/mcp"
    token_env = "REVIEWER2_TOKEN"   # the bearer token's variable, read at each call, never stored

    [tokens.alice]                  # HTTP transports: a bearer token for the identity "alice"
    token_env = "ALICE_TOKEN"       # the variable holding it (or token = "..."; 16+ characters)
    roles = ["read", "approve"]     # read | operate | approve, combined (see server.identity)
    own_runs_only = false           # true: alice sees and acts on only the runs she started

Every token must differ from the others and from ``auth_token`` (which stands for the identity
``admin`` with every role). An unknown role or a short inline token is an error wherever the file is
read; a duplicate token or a ``token_env`` that is not set (or too short) stops the HTTP transports
at startup (stdio and the CLI do not use the tokens). Errors name the table, never the value.

Environment variables (each overridden by the same key in the config file and by a flag):

=================================== ===================================================
``CONSTRUCT_HOME``                  state directory (default ``~/.construct``)
``CONSTRUCT_ORCHESTRATION_STORE``   ``store``
``CONSTRUCT_STORE_FALLBACK``        ``store_fallback``
``CONSTRUCT_DEPLOYMENT_MODE``       ``deployment_mode``
``CONSTRUCT_DATABASE_URL``          ``database_url``
``CONSTRUCT_WORKER_BACKEND``        ``worker_backend``
``CONSTRUCT_LEASE_TTL_SECONDS``     ``lease_ttl_seconds`` (default 30)
``CONSTRUCT_DISPATCH_CONCURRENCY``  ``dispatch_concurrency`` (default 4)
``CONSTRUCT_POLL_SECONDS``          ``poll_seconds`` (default 1.0)
``CONSTRUCT_RECOVER_ON_START``      ``recover_on_start`` (default true)
``CONSTRUCT_STORE_OUTAGE_SECONDS``  ``store_outage_seconds`` (default 30): a run being driven waits this
                                    long for a store that stopped answering (its provider call goes on,
                                    its next write waits); then the call is cancelled and the run resumes
                                    from its facts once the store is back
``CONSTRUCT_MAX_REQUEST_CHARS``     ``max_request_chars`` (default 200000)
``CONSTRUCT_MAX_OUTPUT_CHARS``      ``max_output_chars`` (default 1000000)
``CONSTRUCT_LOG_LEVEL``             ``log_level`` (default INFO)
``CONSTRUCT_AUTH_TOKEN``            ``auth_token``: a secret (16+ characters) every HTTP request must carry
                                    as ``Authorization: Bearer <token>``; required to bind a host other
                                    than a loopback one (see :mod:`server.transports.auth`); never logged
``CONSTRUCT_MAX_SUBSCRIPTIONS``     ``max_subscriptions`` (default 100): resource subscriptions one session
                                    may hold (see :mod:`server.mcp.subscriptions`)
``CONSTRUCT_HTTP_MAX_SESSIONS``     ``http_max_sessions`` (default 200): open Streamable HTTP sessions; a
                                    new one closes the session idle the longest, or gets 503 when none is
                                    idle (see :mod:`server.app`)
``CONSTRUCT_HTTP_SESSION_IDLE_SECONDS`` ``http_session_idle_seconds`` (default 600): a Streamable HTTP
                                    session with no request in flight for this long is closed
``CONSTRUCT_PROVIDER``              ``provider``
``CONSTRUCT_MODEL``                 ``model``
``CONSTRUCT_MAX_ATTEMPTS``          ``max_attempts`` (default 3)
``CONSTRUCT_MAX_TOKENS``            ``max_tokens`` (default 4096)
``CONSTRUCT_PROVIDER_TIMEOUT_SECONDS`` ``provider_timeout_seconds``
``CONSTRUCT_RETRY_WAIT_CAP_SECONDS`` ``retry_wait_cap_seconds`` (default 30): a retry wait up to this
                                    long is slept in memory; a longer one is a durable ``not_before``
``CONSTRUCT_ANTHROPIC_BASE_URL``    ``[providers.anthropic] base_url`` (likewise ``OPENROUTER``, ``OPENAI``)
``CONSTRUCT_OPENAI_MAX_TOKENS_FIELD`` ``[providers.openai] max_tokens_field``: ``max_tokens`` or
                                    ``max_completion_tokens`` (default: from the base URL, see above)
``CONSTRUCT_OPENAI_STRUCTURED_OUTPUT`` ``[providers.openai] structured_output``: ``auto`` (default),
                                    ``json_schema``, ``json_object`` or ``prompt``
``ANTHROPIC_API_KEY`` ...           provider keys, when the config file gives none
``CONSTRUCT_FAULT_CRASH_AFTER_WRITES`` tests only: SIGKILL the process after its N-th durable write
``CONSTRUCT_PID_FILE``              tests and the demo: the server writes its process id there
=================================== ===================================================

Any bad value is a :class:`~orchestration.errors.ConfigError` naming where it came from (the file
path, ``environment`` or ``command line``), the field or variable, and what is wrong; the CLI prints
it on stderr and exits with status 2.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestration.core import Budget, Limits, Price
from orchestration.errors import ConfigError
from orchestration.workers import MaxTokensField, StructuredOutputMode
from server.identity import AUTH_TOKEN_IDENTITY, IDENTITY_PATTERN, ROLES, NamedToken, Role
from server.settings.agents import AgentTable, check_agent_names
from server.transports.auth import MIN_TOKEN_CHARS

DeploymentMode = Literal["solo", "team", "enterprise"]
LogLevel = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
WorkerBackendName = Literal["inline", "provider"]

CONFIG_FILE_NAME = "construct.toml"
_DEFAULT_LIMITS = Limits()
#: Tables of the config file that belong to the catalog, not to the server settings.
CATALOG_TABLES = frozenset({"specialists", "chains"})
ProviderName = Literal["anthropic", "openrouter", "openai"]

#: Environment variable -> settings field.
ENV_VARS: dict[str, str] = {
    "CONSTRUCT_ORCHESTRATION_STORE": "store",
    "CONSTRUCT_STORE_FALLBACK": "store_fallback",
    "CONSTRUCT_DEPLOYMENT_MODE": "deployment_mode",
    "CONSTRUCT_DATABASE_URL": "database_url",
    "CONSTRUCT_WORKER_BACKEND": "worker_backend",
    "CONSTRUCT_LEASE_TTL_SECONDS": "lease_ttl_seconds",
    "CONSTRUCT_DISPATCH_CONCURRENCY": "dispatch_concurrency",
    "CONSTRUCT_POLL_SECONDS": "poll_seconds",
    "CONSTRUCT_RECOVER_ON_START": "recover_on_start",
    "CONSTRUCT_STORE_OUTAGE_SECONDS": "store_outage_seconds",
    "CONSTRUCT_MAX_REQUEST_CHARS": "max_request_chars",
    "CONSTRUCT_MAX_OUTPUT_CHARS": "max_output_chars",
    "CONSTRUCT_LOG_LEVEL": "log_level",
    "CONSTRUCT_AUTH_TOKEN": "auth_token",
    "CONSTRUCT_MAX_SUBSCRIPTIONS": "max_subscriptions",
    "CONSTRUCT_HTTP_MAX_SESSIONS": "http_max_sessions",
    "CONSTRUCT_HTTP_SESSION_IDLE_SECONDS": "http_session_idle_seconds",
    "CONSTRUCT_PROVIDER": "provider",
    "CONSTRUCT_MODEL": "model",
    "CONSTRUCT_MAX_ATTEMPTS": "max_attempts",
    "CONSTRUCT_MAX_TOKENS": "max_tokens",
    "CONSTRUCT_PROVIDER_TIMEOUT_SECONDS": "provider_timeout_seconds",
    "CONSTRUCT_RETRY_WAIT_CAP_SECONDS": "retry_wait_cap_seconds",
    "CONSTRUCT_ANTHROPIC_BASE_URL": "anthropic_base_url",
    "CONSTRUCT_OPENROUTER_BASE_URL": "openrouter_base_url",
    "CONSTRUCT_OPENAI_BASE_URL": "openai_base_url",
    "CONSTRUCT_OPENAI_MAX_TOKENS_FIELD": "openai_max_tokens_field",
    "CONSTRUCT_OPENAI_STRUCTURED_OUTPUT": "openai_structured_output",
    "CONSTRUCT_FAULT_CRASH_AFTER_WRITES": "fault_crash_after_writes",
    "CONSTRUCT_PID_FILE": "pid_file",
}
#: Fields only the environment may set, and what to tell someone who puts them in the file.
ENV_ONLY: dict[str, str] = {
    "fault_crash_after_writes": "can only be set in the environment (it is for tests)",
    "pid_file": "can only be set in the environment (it is for tests)",
    "anthropic_base_url": "write base_url under [providers.anthropic] instead",
    "openrouter_base_url": "write base_url under [providers.openrouter] instead",
    "openai_base_url": "write base_url under [providers.openai] instead",
    "openai_max_tokens_field": "write max_tokens_field under [providers.openai] instead",
    "openai_structured_output": "write structured_output under [providers.openai] instead",
}


class ProviderTable(BaseModel):
    """A ``[providers.<name>]`` table of the config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base_url: str | None = Field(default=None, min_length=1, max_length=2000)
    api_key: str | None = Field(default=None, min_length=1, repr=False)
    max_concurrency: int = Field(default=4, ge=1, le=256)
    #: OpenAI-compatible providers only; None: chosen from the base URL.
    max_tokens_field: MaxTokensField | None = None
    #: How typed steps ask for JSON; None: ``auto``. Anthropic takes ``auto`` or ``prompt``.
    structured_output: StructuredOutputMode | None = None


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

    token: str | None = Field(default=None, max_length=4096, repr=False)
    token_env: str | None = Field(
        default=None, min_length=1, max_length=200, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$"
    )
    roles: list[Role] = Field(min_length=1, max_length=len(ROLES))
    own_runs_only: bool = False

    @field_validator("token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return None if value is None else _checked_token(value)


class _Options(BaseModel):
    """One source's settings, every field optional: a field left unset falls through to the next
    source. Unknown keys are errors (a typo in a config file must not be silently ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str | None = Field(default=None, min_length=1, max_length=2000)
    store_fallback: bool | None = None
    deployment_mode: DeploymentMode | None = None
    database_url: str | None = Field(default=None, min_length=1, max_length=2000)
    worker_backend: WorkerBackendName | None = None
    lease_ttl_seconds: float | None = Field(default=None, ge=1, le=3600)
    dispatch_concurrency: int | None = Field(default=None, ge=1, le=256)
    poll_seconds: float | None = Field(default=None, gt=0, le=3600)
    recover_on_start: bool | None = None
    store_outage_seconds: float | None = Field(default=None, gt=0, le=86400)
    max_request_chars: int | None = Field(default=None, ge=1)
    max_output_chars: int | None = Field(default=None, ge=1)
    log_level: LogLevel | None = None
    auth_token: str | None = Field(default=None, max_length=4096, repr=False)
    max_subscriptions: int | None = Field(default=None, ge=1, le=100_000)
    http_max_sessions: int | None = Field(default=None, ge=1, le=100_000)
    http_session_idle_seconds: float | None = Field(default=None, gt=0, le=86400)
    fault_crash_after_writes: int | None = Field(default=None, ge=1)
    pid_file: Path | None = None
    provider: ProviderName | None = None
    model: str | None = Field(default=None, min_length=1, max_length=200)
    max_attempts: int | None = Field(default=None, ge=1, le=20)
    max_tokens: int | None = Field(default=None, ge=1)
    provider_timeout_seconds: float | None = Field(default=None, gt=0)
    retry_wait_cap_seconds: float | None = Field(default=None, ge=0, le=3600)
    anthropic_base_url: str | None = Field(default=None, min_length=1)
    openrouter_base_url: str | None = Field(default=None, min_length=1)
    openai_base_url: str | None = Field(default=None, min_length=1)
    openai_max_tokens_field: MaxTokensField | None = None
    openai_structured_output: StructuredOutputMode | None = None
    providers: dict[ProviderName, ProviderTable] | None = Field(default=None, repr=False)
    tokens: dict[str, TokenTable] | None = Field(default=None, repr=False)
    prices: dict[str, Price] | None = None
    budgets: dict[str, Budget] | None = None
    #: ``[agents.NAME]``: MCP agents that chain steps delegate to (see :mod:`server.settings.agents`)
    agents: dict[str, AgentTable] | None = None

    _agent_names = field_validator("agents")(check_agent_names)

    @field_validator("tokens")
    @classmethod
    def _identities(cls, value: dict[str, TokenTable] | None) -> dict[str, TokenTable] | None:
        for name, table in (value or {}).items():
            if not IDENTITY_PATTERN.match(name):
                raise ValueError(
                    f"identity {name[:100]!r} must be 1-100 letters, digits or ._@- (starting with a letter "
                    "or digit)"
                )
            if (table.token is None) == (table.token_env is None):
                raise ValueError(f"[tokens.{name}] needs exactly one of token and token_env")
        return value

    @field_validator("providers")
    @classmethod
    def _no_max_tokens_field_for_anthropic(
        cls, value: dict[ProviderName, ProviderTable] | None
    ) -> dict[ProviderName, ProviderTable] | None:
        anthropic = (value or {}).get("anthropic")
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

    @field_validator("auth_token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        return None if value is None else _checked_token(value)


@dataclass(frozen=True, slots=True)
class Settings:
    """The resolved settings of one process. Build with :func:`load_settings`."""

    home: Path
    config_file: Path | None = None
    store: str | None = None
    store_fallback: bool = True
    deployment_mode: DeploymentMode = "solo"
    database_url: str | None = field(default=None, repr=False)
    worker_backend: WorkerBackendName = "inline"
    lease_ttl_seconds: float = 30.0
    dispatch_concurrency: int = 4
    poll_seconds: float = 1.0
    recover_on_start: bool = True
    store_outage_seconds: float = 30.0
    max_request_chars: int = _DEFAULT_LIMITS.max_request_chars
    max_output_chars: int = _DEFAULT_LIMITS.max_output_chars
    log_level: LogLevel = "INFO"
    #: The HTTP transports' bearer token (kept out of ``repr``).
    auth_token: str | None = field(default=None, repr=False)
    max_subscriptions: int = 100
    http_max_sessions: int = 200
    http_session_idle_seconds: float = 600.0
    fault_crash_after_writes: int | None = None
    pid_file: Path | None = None
    provider: ProviderName | None = None
    model: str | None = None
    max_attempts: int = 3
    max_tokens: int = 4096
    provider_timeout_seconds: float | None = None
    retry_wait_cap_seconds: float = 30.0
    anthropic_base_url: str | None = None
    openrouter_base_url: str | None = None
    openai_base_url: str | None = None
    openai_max_tokens_field: MaxTokensField | None = None
    openai_structured_output: StructuredOutputMode | None = None
    #: ``[providers.<name>]`` tables (they may hold API keys: kept out of ``repr``).
    providers: Mapping[str, ProviderTable] = field(default_factory=dict, repr=False)
    #: The HTTP transports' named tokens (``[tokens.<identity>]``, with ``token_env`` resolved),
    #: besides ``auth_token``; secrets, kept out of ``repr``.
    tokens: tuple[NamedToken, ...] = field(default=(), repr=False)
    #: What is wrong with the ``[tokens]`` tables once the environment is read (a variable not set,
    #: a duplicate token), raised by :meth:`named_tokens`.
    tokens_error: ConfigError | None = field(default=None, repr=False)
    #: ``[prices."<model>"]``: over the dated defaults (see :func:`orchestration.core.pricing.price_table`)
    prices: Mapping[str, Price] = field(default_factory=dict)
    #: ``[budgets.<chain>]``: the budget of a run of that chain that gives none at start
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    #: ``[agents.NAME]`` tables (no secrets: a token's variable name only)
    agents: Mapping[str, AgentTable] = field(default_factory=dict)
    #: Where each explicitly set field came from: ``--flag``, ``config`` or the variable's name.
    sources: Mapping[str, str] = field(default_factory=dict)

    def source_of(self, name: str) -> str:
        return self.sources.get(name, "default")

    def limits(self) -> Limits:
        return Limits(max_request_chars=self.max_request_chars, max_output_chars=self.max_output_chars)

    def named_tokens(self) -> tuple[NamedToken, ...]:
        """Every token HTTP requests may carry: ``auth_token`` as the identity
        :data:`~server.identity.AUTH_TOKEN_IDENTITY` with every role, then ``[tokens]``. Raises
        the ``ConfigError`` of a ``token_env`` that is not set or is too short, or of a token used
        twice: the HTTP transports call this before they start; stdio and the CLI never do."""
        if self.tokens_error is not None:
            raise self.tokens_error
        single = () if self.auth_token is None else (NamedToken(AUTH_TOKEN_IDENTITY, self.auth_token),)
        return (*single, *self.tokens)


def _problem(exc: ValidationError) -> tuple[str, str]:
    err = exc.errors()[0]
    loc = [str(p) for p in err["loc"] if p != "[key]"]
    where = ".".join(loc) or "(file)"
    message = err["msg"]
    if err["type"] == "extra_forbidden":
        if len(loc) == 1:
            known = ", ".join(sorted(k for k in _Options.model_fields if k not in ENV_ONLY))
            message = (
                f"unknown setting; the known settings are: {known} "
                "(and the tables specialists, chains, providers, tokens, agents)"
            )
        elif loc[0] in ("prices", "budgets"):
            message = "unknown setting; see the Costs and budgets section of the README"
        elif loc[0] == "agents":
            message = f"unknown setting; an agents table takes: {', '.join(AgentTable.model_fields)}"
        elif loc[0] == "tokens":
            message = f"unknown setting; a tokens table takes: {', '.join(TokenTable.model_fields)}"
        else:
            message = f"unknown setting; a provider table takes: {', '.join(ProviderTable.model_fields)}"
    return where, message


def _validate(source: str, values: Mapping[str, Any], name_of: Mapping[str, str] | None = None) -> _Options:
    try:
        return _Options.model_validate(dict(values))
    except ValidationError as exc:
        where, message = _problem(exc)
        if name_of is not None:
            where = name_of.get(where, where)
        raise ConfigError(source, where, message) from None


def _read_config_file(path: Path) -> dict[str, Any]:
    try:
        raw = tomllib.loads(path.read_text("utf-8"))
    except FileNotFoundError:
        raise ConfigError(str(path), "(file)", "the file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(str(path), "(file)", f"cannot be read: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), "(file)", f"is not valid TOML: {exc}") from None
    values = {k: v for k, v in raw.items() if k not in CATALOG_TABLES}
    for key in ENV_ONLY.keys() & values.keys():
        raise ConfigError(str(path), key, ENV_ONLY[key])
    return values


def config_file_for(home: Path, explicit: Path | None) -> Path | None:
    """``explicit`` (which must exist), else ``home/construct.toml`` if it exists, else None."""
    if explicit is not None:
        return explicit
    candidate = home / CONFIG_FILE_NAME
    return candidate if candidate.is_file() else None


def resolve_home(explicit: Path | str | None, env: Mapping[str, str]) -> Path:
    raw = str(explicit) if explicit is not None else env.get("CONSTRUCT_HOME") or "~/.construct"
    if not raw.strip():
        raise ConfigError("environment", "CONSTRUCT_HOME", "is empty")
    return Path(raw).expanduser()


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    *,
    home: Path | str | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Resolve the settings: ``flags`` (settings field -> value, None meaning "not given") over the
    config file over ``env`` (default ``os.environ``) over the defaults. Raises ConfigError."""
    env = os.environ if env is None else env
    resolved_home = resolve_home(home, env)
    file = config_file_for(resolved_home, config_file)

    env_values = {name: env[var] for var, name in ENV_VARS.items() if env.get(var, "") != ""}
    if env.get("CONSTRUCT_AUTH_TOKEN") == "":
        # Set but empty (e.g. from an unset shell variable) is a mistake, not "no token": refused.
        env_values["auth_token"] = ""
    env_var_of = {name: var for var, name in ENV_VARS.items()}
    flag_of = {name: "--" + name.replace("_", "-") for name in _Options.model_fields}
    given = {k: v for k, v in (flags or {}).items() if v is not None}
    layers: list[tuple[dict[str, Any], Mapping[str, str]]] = [
        (_validate("environment", env_values, env_var_of).model_dump(exclude_unset=True), env_var_of)
    ]
    if file is not None:
        from_file = _validate(str(file), _read_config_file(file)).model_dump(exclude_unset=True)
        layers.append((from_file, dict.fromkeys(from_file, "config")))
    layers.append((_validate("command line", given, flag_of).model_dump(exclude_unset=True), flag_of))
    merged: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for values, label_of in layers:
        merged |= values
        sources |= {name: label_of[name] for name in values}
    # model_dump turned the provider tables into dicts; the settings keep them typed.
    merged["providers"] = {
        k: ProviderTable.model_validate(v) for k, v in (merged.get("providers") or {}).items()
    }
    merged["prices"] = {k: Price.model_validate(v) for k, v in (merged.get("prices") or {}).items()}
    merged["budgets"] = {k: Budget.model_validate(v) for k, v in (merged.get("budgets") or {}).items()}
    merged["agents"] = {k: AgentTable.model_validate(v) for k, v in (merged.get("agents") or {}).items()}
    tables = {k: TokenTable.model_validate(v) for k, v in (merged.pop("tokens", None) or {}).items()}
    tokens: tuple[NamedToken, ...] = ()
    tokens_error: ConfigError | None = None
    try:
        tokens = _named_tokens(tables, env, str(file), merged.get("auth_token"))
    except ConfigError as exc:
        # Raised by named_tokens(), when a transport needs the tokens: stdio and the CLI do not,
        # and need not see the HTTP server's token variables.
        tokens_error = exc
    return Settings(
        home=resolved_home,
        config_file=file,
        sources=sources,
        tokens=tokens,
        tokens_error=tokens_error,
        **merged,
    )


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
        assert token is not None  # exactly one of token and token_env (checked by _Options)
        if token in seen:
            raise ConfigError(
                source,
                where,
                f"its token is the same as {seen[token]}'s; every identity needs a token of its own",
            )
        seen[token] = where
        out.append(NamedToken(name, token, frozenset(table.roles), table.own_runs_only))
    return tuple(out)
