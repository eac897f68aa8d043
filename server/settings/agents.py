"""The ``[agents.NAME]`` tables of the config file: other MCP agents (or A2A agents, ``protocol =
"a2a"``) that chain steps delegate to (docs/chains.md, Agents). A table has exactly one of ``url``
and ``command``; an A2A agent has ``url``. The token is never
read here: the agent worker reads ``token_env`` at each call, so it is never stored and a rotated
token is used at the next call.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from orchestration.chains import NAME_PATTERN
from orchestration.workers import AgentEndpoint, AgentProtocol

_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class AgentTable(BaseModel):
    """One ``[agents.NAME]`` table: ``url`` (``http`` or ``https``, no credentials in it) with
    ``token_env``, or ``command`` with ``env``, ``pass_env`` and ``cwd``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    protocol: AgentProtocol = Field(
        default="mcp",
        description="`mcp`: a tool of another MCP server; `a2a`: an A2A agent at `url` (its agent card's "
        "base URL), to which steps send a `message`",
    )
    url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="the agent's Streamable HTTP endpoint (`http` or `https`, no credentials in it); "
        "or give `command`",
    )
    token_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=_ENV_NAME,
        description="with `url`: the environment variable of the bearer token, read at each call, never "
        "stored",
    )
    command: list[str] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="a stdio agent: the command and its arguments, started for each call",
    )
    env: dict[str, str] | None = Field(
        default=None, description="with `command`: variables set for it (not secrets: the file is plain text)"
    )
    pass_env: list[str] | None = Field(
        default=None,
        max_length=100,
        description="with `command`: variables passed through from this server's environment",
    )
    cwd: str | None = Field(
        default=None, min_length=1, max_length=2000, description="with `command`: its working directory"
    )
    call_timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="how long one request waits for its answer"
    )
    follow_wait_seconds: float = Field(
        default=30.0, gt=0, le=300, description="each `run_status` wait of a followed remote run"
    )
    paused_poll_seconds: float = Field(
        default=5.0, gt=0, le=3600, description="how often a paused remote run is polled"
    )
    poll_cap_seconds: float = Field(
        default=30.0, gt=0, le=3600, description="the longest wait between polls, backing off"
    )
    unknown_status_seconds: float = Field(
        default=60.0,
        gt=0,
        le=86400,
        description="a remote status this server does not know, for this long, fails the attempt "
        "(`agent_protocol`)",
    )

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL (the agent's Streamable HTTP endpoint)")
        if parts.username is not None or parts.password is not None:
            raise ValueError("must not carry credentials; give the token's variable in token_env")
        return value

    @field_validator("pass_env")
    @classmethod
    def _names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not re.fullmatch(_ENV_NAME, name):
                raise ValueError(f"{name[:60]!r} is not an environment variable name")
        return value

    @model_validator(mode="after")
    def _one_transport(self) -> AgentTable:
        if (self.url is None) == (self.command is None):
            raise ValueError("give exactly one of url (Streamable HTTP) and command (stdio)")
        if self.url is not None and (self.env or self.pass_env or self.cwd):
            raise ValueError("env, pass_env and cwd apply to a stdio agent (command), not to url")
        if self.protocol == "a2a" and self.url is None:
            raise ValueError('an A2A agent (protocol = "a2a") needs url: its agent card\'s base URL')
        if self.command is not None and self.token_env is not None:
            raise ValueError("token_env applies to url; a stdio agent gets its secrets through pass_env")
        return self


def check_agent_names(tables: Mapping[str, AgentTable] | None) -> Mapping[str, AgentTable] | None:
    """Every ``[agents.NAME]`` name must be a name a chain step can use (ValueError)."""
    for name in tables or {}:
        if not NAME_PATTERN.fullmatch(name):
            raise ValueError(
                f"agent name {name[:60]!r}: use 1-48 lowercase letters, digits, '-' or '_', "
                "starting with a letter"
            )
    return tables


def agent_endpoints(tables: Mapping[str, AgentTable]) -> dict[str, AgentEndpoint]:
    """The agent worker's endpoints, one per table."""
    return {
        name: AgentEndpoint(
            name=name,
            url=t.url,
            protocol=t.protocol,
            token_env=t.token_env,
            command=None if t.command is None else tuple(t.command),
            env=dict(t.env or {}),
            pass_env=tuple(t.pass_env or ()),
            cwd=t.cwd,
            call_timeout_seconds=t.call_timeout_seconds,
            follow_wait_seconds=t.follow_wait_seconds,
            paused_poll_seconds=t.paused_poll_seconds,
            poll_cap_seconds=t.poll_cap_seconds,
            unknown_status_seconds=t.unknown_status_seconds,
        )
        for name, t in tables.items()
    }


__all__ = ["AgentTable", "agent_endpoints", "check_agent_names"]
