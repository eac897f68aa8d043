"""What the push notification config calls of A2A do to runs (the wire is
:mod:`server.a2a.sdk_face`; the sending, :mod:`server.a2a.push_notifier`).

- **Who.** Each call needs what ``run_status`` needs (the ``read`` role, and the run among those
  the caller may see): a config makes the run's state, content included, reach a URL, which is
  reading the run. The same holds for a config given with ``SendMessage``
  (``configuration.taskPushNotificationConfig``), set on the task the message starts or continues.
- **Durable.** A config is a fact on its run (``push_configured``, removed by
  ``push_config_deleted``: :mod:`orchestration.engine.push_configs`); the client's ``token`` and
  ``authentication.credentials`` are recorded only sealed (:mod:`server.a2a.push_keys`). A config
  without an id takes the task's id (as the A2A SDK's own server does). Setting a config again as
  it is records nothing (a resent ``SendMessage`` sets nothing twice); with another URL, token or
  authentication it replaces the one of its id.
- **Answers.** ``Get`` and ``List`` answer the id, the task, the URL and the authentication
  scheme; never the token nor the credentials (the client has them; the server hands no secret
  back).
- **Refusals** (coded, the message first): a task that ended (``invalid_state``), a URL that is not
  ``http(s)://host`` or carries credentials (``invalid_argument``), longer than
  :data:`~server.settings.a2a_face.MAX_URL_CHARS` or an id, token or credentials over their limits
  (``too_large``), a URL naming ``localhost`` or a loopback, private or link-local address unless
  ``[a2a] push_private_urls`` (``invalid_argument``; a host name is not resolved here), more than
  ``[a2a] push_max_configs`` configs on a task (``too_large``), an unknown config
  (``push_config_not_found``).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from orchestration.core import PushConfigured, RunHead
from orchestration.engine import delete_push_config, push_configs_in, set_push_config
from orchestration.errors import InvalidArgument, RunNotFound, TooLarge, quoted
from server.a2a.chain_agent import ChainAgent
from server.a2a.push_keys import PushKeys, SealBroken, seal_context
from server.identity import Caller
from server.settings.a2a_face import MAX_URL_CHARS

#: the longest token or credentials a config may carry
MAX_SECRET_CHARS = 4096
#: the longest authentication scheme name
MAX_SCHEME_CHARS = 50


class PushConfigNotFound(RunNotFound):
    code = "push_config_not_found"


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """A push notification config as a call carries it (``token`` and ``credentials`` in clear:
    they are sealed before anything is recorded) or as an answer shows it (without them)."""

    config_id: str
    task_id: str
    url: str
    token: str | None = None
    auth_scheme: str | None = None
    credentials: str | None = None


def shown(task_id: str, fact: PushConfigured) -> WebhookConfig:
    """A recorded config as an answer shows it: no secret."""
    return WebhookConfig(
        config_id=fact.config_id, task_id=task_id, url=fact.url, auth_scheme=fact.auth_scheme
    )


def check_url(url: str, private_allowed: bool) -> None:
    """Refuse a webhook URL this server does not post to (see the module docstring)."""
    if len(url) > MAX_URL_CHARS:
        raise TooLarge(f"the webhook url is {len(url)} characters; at most {MAX_URL_CHARS} are taken")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidArgument("the webhook url must be http(s)://host[:port][/path]")
    if parts.username is not None or parts.password is not None:
        raise InvalidArgument("the webhook url must not carry credentials: give them as authentication")
    if private_allowed:
        return
    host = parts.hostname.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        raise InvalidArgument(
            "the webhook url names localhost; this server posts to public addresses only "
            "([a2a] push_private_urls = true allows it)"
        )
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return  # a name: not resolved here
    if not address.is_global:
        raise InvalidArgument(
            f"the webhook url names the non-public address {host}; this server posts to public addresses "
            "only ([a2a] push_private_urls = true allows it)"
        )


class WebhookConfigs:
    """The push notification configs of the runs behind the A2A face (``keys`` seals their
    secrets)."""

    def __init__(self, agent: ChainAgent, keys: PushKeys) -> None:
        self._agent = agent
        self._keys = keys

    async def _readable(self, caller: Caller, task_id: str) -> RunHead:
        return await self._agent.head(caller, task_id, "run_status")

    def check(self, config: WebhookConfig) -> None:
        """Refuse what no task would take of ``config`` (before a message starts a run with it)."""
        settings = self._agent.services().settings
        most = settings.limits().max_id_chars
        if len(config.config_id) > most:
            raise TooLarge(f"the config id is {len(config.config_id)} characters; ids have at most {most}")
        check_url(config.url, settings.a2a.push_private_urls)
        for name, secret in (("token", config.token), ("authentication.credentials", config.credentials)):
            if secret is not None and len(secret) > MAX_SECRET_CHARS:
                raise TooLarge(
                    f"the {name} is {len(secret)} characters; at most {MAX_SECRET_CHARS} are taken"
                )
        if config.auth_scheme is not None and (
            len(config.auth_scheme) > MAX_SCHEME_CHARS or not config.auth_scheme.isalnum()
        ):
            raise InvalidArgument(
                f"the authentication scheme must be a word of at most {MAX_SCHEME_CHARS} letters or digits "
                "(Bearer, Basic, ...)"
            )

    async def set(self, caller: Caller, config: WebhookConfig) -> WebhookConfig:
        """Record ``config`` on its task (replacing the one of its id)."""
        head = await self._readable(caller, config.task_id)
        self.check(config)
        services = self._agent.services()
        settings = services.settings
        config_id = config.config_id or head.run_id
        if len(config_id) > settings.limits().max_id_chars:
            raise TooLarge("the task's id is too long to be a config's id; give the config an id")
        run_id = head.run_id

        def sealed(secret: str | None, field: str) -> str | None:
            return None if not secret else self._keys.seal(secret, seal_context(run_id, config_id, field))

        for recorded in await self._in_force(head):
            if recorded.config_id == config_id and self._same(run_id, recorded, config):
                return shown(run_id, recorded)  # set again as it is: nothing recorded twice
        fact = PushConfigured(
            seq=0,
            at=head.updated_at,  # both set when it is recorded
            config_id=config_id,
            url=config.url,
            sealed_token=sealed(config.token, "token"),
            auth_scheme=config.auth_scheme or None,
            sealed_credentials=sealed(config.credentials, "credentials"),
            by=caller.recorded,
        )
        _, recorded = await set_push_config(services.runtime, run_id, fact, settings.a2a.push_max_configs)
        return shown(run_id, recorded)

    async def _in_force(self, head: RunHead) -> list[PushConfigured]:
        if not head.push_configs:
            return []
        facts = await self._agent.services().runtime.read_facts(head.run_id)
        return push_configs_in(head, facts)

    def _same(self, run_id: str, recorded: PushConfigured, config: WebhookConfig) -> bool:
        """Whether ``config`` is what ``recorded`` holds (its secrets opened to compare)."""

        def opened(sealed: str | None, field: str) -> str | None:
            if sealed is None:
                return None
            try:
                return self._keys.open(sealed, seal_context(run_id, recorded.config_id, field))
            except SealBroken:
                return None

        return (
            recorded.url == config.url
            and recorded.auth_scheme == (config.auth_scheme or None)
            and opened(recorded.sealed_token, "token") == (config.token or None)
            and opened(recorded.sealed_credentials, "credentials") == (config.credentials or None)
        )

    async def listed(self, caller: Caller, task_id: str) -> list[WebhookConfig]:
        """The task's configs in force, in the order they were first set."""
        head = await self._readable(caller, task_id)
        return [shown(head.run_id, fact) for fact in await self._in_force(head)]

    async def get(self, caller: Caller, task_id: str, config_id: str) -> WebhookConfig:
        for config in await self.listed(caller, task_id):
            if config.config_id == config_id:
                return config
        raise PushConfigNotFound(f"task {task_id} has no push notification config {quoted(config_id)}")

    async def delete(self, caller: Caller, task_id: str, config_id: str) -> None:
        """Remove a config; idempotent (an unknown one is no error, as the A2A specification asks)."""
        head = await self._readable(caller, task_id)
        await delete_push_config(self._agent.services().runtime, head.run_id, config_id, caller.recorded)
