"""The provider backend's settings, built from the server's settings: for each provider its base URL,
API key, output-limit field and structured-output mode, each the config table's, else the
environment's, else the default (docs/providers.md). Keys live only in the returned endpoints (kept
out of their repr); nothing here logs them.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from orchestration.workers import (
    DEFAULT_BASE_URLS,
    KEY_VARIABLES,
    PROVIDERS,
    MaxTokensField,
    ProviderEndpoint,
    ProviderName,
    ProviderSettings,
    StructuredOutputMode,
)
from server.settings.config import Settings


def _configured_base_url(settings: Settings, name: ProviderName) -> str | None:
    table = settings.providers.get(name)
    if table is not None and table.base_url:
        return table.base_url
    by_env: dict[str, str | None] = {
        "anthropic": settings.anthropic_base_url,
        "openrouter": settings.openrouter_base_url,
        "openai": settings.openai_base_url,
    }
    return by_env[name]


def _max_tokens_field(settings: Settings, name: ProviderName) -> MaxTokensField | None:
    table = settings.providers.get(name)
    if table is not None and table.max_tokens_field is not None:
        return table.max_tokens_field
    return settings.openai_max_tokens_field if name == "openai" else None


def _structured_output(settings: Settings, name: ProviderName) -> StructuredOutputMode:
    table = settings.providers.get(name)
    if table is not None and table.structured_output is not None:
        return table.structured_output
    chosen = settings.openai_structured_output if name == "openai" else None
    return chosen or "auto"


def _environment_key(settings: Settings, name: ProviderName) -> str | None:
    by_env: dict[str, str | None] = {
        "anthropic": settings.anthropic_api_key,
        "openrouter": settings.openrouter_api_key,
        "openai": settings.openai_api_key,
    }
    return by_env[name]


def provider_settings(settings: Settings) -> ProviderSettings:
    endpoints: dict[str, ProviderEndpoint] = {}
    for name in PROVIDERS:
        table = settings.providers.get(name)
        key: str | None = None
        key_source: str | None = None
        if table is not None and table.api_key:
            key, key_source = table.api_key, f"[providers.{name}] in the config file"
        elif (from_env := _environment_key(settings, name)) is not None:
            key, key_source = from_env, KEY_VARIABLES[name]
        endpoints[name] = ProviderEndpoint(
            name=name,
            base_url=_configured_base_url(settings, name) or DEFAULT_BASE_URLS[name],
            api_key=key,
            key_source=key_source,
            max_concurrency=table.max_concurrency if table is not None else 4,
            max_tokens_field=_max_tokens_field(settings, name),
            structured_output=_structured_output(settings, name),
            stream=table.stream if table is not None else True,
        )
    openai_url = _configured_base_url(settings, "openai")
    compat: ProviderName = "openrouter"
    if openai_url and "openrouter.ai" not in (urlsplit(openai_url).hostname or ""):
        compat = "openai"
    return ProviderSettings(
        endpoints=endpoints,
        default_provider=settings.provider,
        default_model=settings.model,
        max_attempts=settings.max_attempts,
        max_tokens=settings.max_tokens,
        request_timeout_seconds=settings.provider_timeout_seconds,
        compat_provider=compat,
    )


def missing_key_warning(settings: Settings) -> str | None:
    """What a server whose default backend is ``provider`` says at startup (in its log, its
    ``run_status`` warnings and the ``instructions`` a host receives) when the provider its runs
    go to has no API key: such runs are refused at start, which a host would otherwise learn only
    from its first run. None when there is a key, or the default backend is ``inline``."""
    if settings.worker_backend != "provider":
        return None
    providers = provider_settings(settings)
    if settings.provider is not None:
        names: list[str] = [settings.provider]
    elif settings.model:
        names = [providers.infer_provider(settings.model)]
    else:
        names = list(PROVIDERS)  # the model is chosen per run: any provider with a key may serve
    endpoints = [providers.endpoints.get(name) for name in names]
    if any(e is not None and (e.api_key is not None or e.key_optional) for e in endpoints):
        return None
    keys = " or ".join(KEY_VARIABLES[name] for name in names if name in KEY_VARIABLES)
    return (
        f"the worker backend is provider and no API key is set for {' or '.join(names)}: set {keys} "
        "(or api_key under [providers.<name>] in construct.toml); until then runs on the provider "
        "backend are refused at start, and runs with worker_backend inline work"
    )
