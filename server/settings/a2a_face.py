"""The ``[a2a]`` table of the config file: how long the A2A face (every chain served as an A2A
agent, :mod:`server.a2a.sdk_face`) holds a blocking ``SendMessage``, and how it sends push
notifications (:mod:`server.a2a.push_notifier`).

Push notifications are offered only with a signing key: ``push_signing_key_file`` (a PEM file) or
``push_signing_key_env`` (the environment variable that holds the PEM text, read once by
:func:`~server.settings.config.load_settings`). The key signs every notification (a JWS a webhook
checks against the server's published key set) and seals the secrets of the configs in the store;
servers sharing a store must share it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: the longest webhook URL a push notification config may name
MAX_URL_CHARS = 2000


class A2aTable(BaseModel):
    """The ``[a2a]`` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    blocking_wait_seconds: float = Field(
        default=600.0,
        ge=1,
        le=3600,
        allow_inf_nan=False,
        description="the longest a blocking `SendMessage` (one without `returnImmediately`) waits for "
        "its task to need its caller or end; past it the answer is the task still `working`, which "
        "the caller follows with `GetTask` or a stream (a stopping server answers at once)",
    )
    push_signing_key_file: Path | None = Field(
        default=None,
        description="a PEM file with the P-256 (ES256) private key that signs push notifications and "
        "seals their configs' secrets in the store; or give `push_signing_key_env`. Without either, "
        "push notifications are not offered",
    )
    push_signing_key_env: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="the environment variable that holds that PEM key, read at startup",
    )
    push_max_configs: int = Field(
        default=10, ge=1, le=100, description="push notification configs one task may have at most"
    )
    push_private_urls: bool = Field(
        default=False,
        description="true: a webhook URL may name `localhost` or a loopback, private or link-local "
        "address (refused by default: a caller could otherwise make this server post to its own "
        "network)",
    )
    push_resend_window_seconds: float = Field(
        default=600.0,
        ge=0,
        le=7 * 86400,
        allow_inf_nan=False,
        description="at startup, the last state of every task with push configs is sent again (the "
        "notification the last process may not have delivered): tasks still working, and tasks that "
        "ended less than this many seconds ago",
    )

    @model_validator(mode="after")
    def _one_key(self) -> A2aTable:
        if self.push_signing_key_file is not None and self.push_signing_key_env is not None:
            raise ValueError("[a2a] takes push_signing_key_file or push_signing_key_env, not both")
        return self
