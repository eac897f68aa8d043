"""The ``provider`` worker backend: the server calls the model itself.

:class:`ProviderSettings` resolves which provider and model a run uses, once, at start, into the
run's execution contract. :class:`ProviderWorker` makes one attempt at a task, bounded per provider
by ``max_concurrency`` and held back by a provider's ``retry-after``, validates a typed answer at
the boundary, and returns a failure as data with the retry policy's verdict folded in. Keys are
held only in :class:`ProviderEndpoint` (excluded from its repr) and in the HTTP adapters.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal
from urllib.parse import urlsplit

import anyio
import httpx2

from orchestration.chains.prompts import TaskPrompt
from orchestration.chains.schemas import validate_output
from orchestration.core.clock import Clock, SystemClock
from orchestration.core.inputs import ContractResolver, StartRequest
from orchestration.core.models import (
    ChainSnapshot,
    ChainStep,
    ExecutionContract,
    Telemetry,
    TypedError,
    WorkerBackend,
)
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptOutcome, AttemptSucceeded
from orchestration.errors import InvalidArgument, InvalidOutput, hint
from orchestration.tracing import model_call
from orchestration.workers.anthropic import ANTHROPIC_BASE_URL, AnthropicClient
from orchestration.workers.model_calls import (
    ProviderCallError,
    ProviderClient,
    ProviderErrorCode,
    ProviderRequest,
    ProviderResponse,
    StructuredOutputMode,
)
from orchestration.workers.openai_compat import (
    OPENAI_BASE_URL,
    OPENROUTER_BASE_URL,
    MaxTokensField,
    OpenAICompatClient,
)
from orchestration.workers.port import DeltaSink
from orchestration.workers.retry import RetryPolicy, Rng, failed_outcome

ProviderName = Literal["anthropic", "openrouter", "openai"]
PROVIDERS: tuple[ProviderName, ...] = ("anthropic", "openrouter", "openai")
KEY_VARIABLES: Mapping[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openrouter": "OPENROUTER_API_KEY",
    "openai": "OPENAI_API_KEY",
}
DEFAULT_BASE_URLS: Mapping[str, str] = {
    "anthropic": ANTHROPIC_BASE_URL,
    "openrouter": OPENROUTER_BASE_URL,
    "openai": OPENAI_BASE_URL,
}


@dataclass(frozen=True, slots=True)
class ProviderEndpoint:
    name: ProviderName
    base_url: str
    api_key: str | None = field(default=None, repr=False)
    #: where the key came from, for messages ("ANTHROPIC_API_KEY", "config file"); never the key
    key_source: str | None = None
    max_concurrency: int = 4
    #: OpenAI-compatible endpoints: the body field of the output limit; None picks it from the base
    #: URL (see :func:`~orchestration.workers.openai_compat.default_max_tokens_field`)
    max_tokens_field: MaxTokensField | None = None
    #: how a typed step's request asks for structured output (``auto``: the best the endpoint
    #: supports; see :data:`~orchestration.workers.model_calls.StructuredOutputMode`)
    structured_output: StructuredOutputMode = "auto"
    #: ask for streamed answers (deltas reach ``on_delta`` as they arrive); an endpoint that
    #: refuses a stream is called plainly from then on, so on is the safe default
    stream: bool = True

    @property
    def key_optional(self) -> bool:
        """Local OpenAI-compatible servers (llama.cpp, vLLM, Ollama on loopback) need no key."""
        host = urlsplit(self.base_url).hostname or ""
        return self.name != "anthropic" and (host in ("localhost", "::1") or host.startswith("127."))


def _check_provider(name: str, where: str) -> ProviderName:
    if name not in PROVIDERS:
        raise InvalidArgument(f"{where} {name!r} is not a provider; use one of: {', '.join(PROVIDERS)}")
    return name


@dataclass(frozen=True)
class ProviderSettings:
    """What the server knows about providers (built by the server from its config and env)."""

    endpoints: Mapping[str, ProviderEndpoint]
    default_provider: str | None = None
    default_model: str | None = None
    max_attempts: int = 3
    max_tokens: int = 4096
    request_timeout_seconds: float | None = None
    #: the provider a non-``claude-*`` model goes to when none is named: ``openrouter``, or
    #: ``openai`` when ``CONSTRUCT_OPENAI_BASE_URL`` points at another compatible server
    compat_provider: ProviderName = "openrouter"

    @property
    def max_connections(self) -> int:
        """The HTTP connections the provider calls of one process can use at once: each provider's
        calls are bounded by its ``max_concurrency`` (:class:`ProviderWorker`'s limiters), so the
        shared client's pool of this size never makes a call wait for a connection."""
        return max(1, sum(endpoint.max_concurrency for endpoint in self.endpoints.values()))

    def infer_provider(self, model: str) -> ProviderName:
        return "anthropic" if model.startswith("claude-") else self.compat_provider

    def resolve_step(
        self, step: ChainStep, provider: str | None, model: str | None
    ) -> tuple[ProviderName, str]:
        chosen_model = model or step.model or self.default_model
        if not chosen_model:
            raise InvalidArgument(
                f"no model for step {step.name!r}: "
                + hint("start_run", needs=("model",), form="pass")
                + ", set it on the chain "
                "step, or set CONSTRUCT_MODEL"
            )
        named = provider or step.provider or self.default_provider
        chosen = (
            _check_provider(named, "provider") if named is not None else self.infer_provider(chosen_model)
        )
        endpoint = self.endpoints.get(chosen)
        if endpoint is None or (endpoint.api_key is None and not endpoint.key_optional):
            raise InvalidArgument(
                f"step {step.name!r} uses provider {chosen!r}, which needs an API key: set "
                f"{KEY_VARIABLES[chosen]} (or api_key under [providers.{chosen}] in construct.toml)"
            )
        return chosen, chosen_model

    def resolve_contract(
        self, provider: str | None, model: str | None, chain: ChainSnapshot
    ) -> ExecutionContract:
        """The provider contract of a run. Every step is checked now (keys included), so a run
        that could not execute is refused before anything is stored."""
        resolved = [self.resolve_step(step, provider, model) for step in chain.steps]
        run_provider, run_model = resolved[0]
        return ExecutionContract(
            worker_backend="provider",
            provider=provider or self.default_provider or run_provider,
            model=model or self.default_model or run_model,
            max_attempts=self.max_attempts,
        )


class ProviderWorker:
    """:class:`~orchestration.workers.port.TaskWorker` for the provider backend."""

    def __init__(
        self,
        settings: ProviderSettings,
        http: httpx2.AsyncClient,
        *,
        clock: Clock | None = None,
        rng: Rng | None = None,
        policy: RetryPolicy | None = None,
        clients: Mapping[str, ProviderClient] | None = None,
        hold_wait_cap_seconds: float = 30.0,
    ) -> None:
        self.settings = settings
        #: how long a call waits in memory for a provider's retry-after before giving up on it
        self.hold_wait_cap_seconds = hold_wait_cap_seconds
        #: per provider: no call before this time (a 429's retry-after, shared by the process)
        self._held_until: dict[str, datetime] = {}
        self.clock = clock or SystemClock()
        self.rng: Rng = rng or random.random
        self.policy = policy or RetryPolicy(max_attempts=settings.max_attempts)
        self._clients: dict[str, ProviderClient] = dict(clients or {})
        self._http = http
        self._limits = {
            name: anyio.CapacityLimiter(endpoint.max_concurrency)
            for name, endpoint in settings.endpoints.items()
        }

    def client(self, provider: str) -> ProviderClient:
        client = self._clients.get(provider)
        if client is not None:
            return client
        endpoint = self.settings.endpoints.get(provider)
        if endpoint is None:
            raise InvalidArgument(f"provider {provider!r} is not configured on this server")
        if endpoint.name == "anthropic":
            if endpoint.api_key is None:
                raise InvalidArgument(f"provider anthropic needs {KEY_VARIABLES['anthropic']}")
            client = AnthropicClient(
                self._http,
                api_key=endpoint.api_key,
                base_url=endpoint.base_url,
                structured_output=endpoint.structured_output,
                stream=endpoint.stream,
            )
        else:
            client = OpenAICompatClient(
                self._http,
                base_url=endpoint.base_url,
                api_key=endpoint.api_key,
                max_tokens_field=endpoint.max_tokens_field,
                structured_output=endpoint.structured_output,
                stream=endpoint.stream,
            )
        self._clients[provider] = client
        return client

    def _route(self, contract: ExecutionContract, step: ChainStep) -> tuple[str, str]:
        provider = step.provider or contract.provider
        model = step.model or contract.model
        if provider is None or model is None:
            raise InvalidArgument(f"run has no provider/model for step {step.name!r}")
        return provider, model

    async def execute(
        self,
        contract: ExecutionContract,
        step: ChainStep,
        prompt: TaskPrompt,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        sink: DeltaSink | None = None,
    ) -> AttemptOutcome:
        provider, model = self._route(contract, step)
        schema = step.output_schema
        request = ProviderRequest(
            model=model,
            system=prompt.system,
            user=prompt.user + _correction(previous_errors) if schema is not None else prompt.user,
            # The run's own limit, recorded at start (its budget reserves it), else the server's.
            max_tokens=contract.costs.max_tokens
            if contract.costs and contract.costs.max_tokens
            else self.settings.max_tokens,
            timeout_seconds=self.settings.request_timeout_seconds,
            output_schema=schema,
        )
        write = sink.writer(prompt.task_id, attempt) if sink is not None else None
        on_delta = _stream_guard(contract, request.max_tokens, write)
        if on_delta is not None:
            request = replace(request, on_delta=on_delta)
        try:
            return await self._call(contract, provider, request, attempt, previous_errors)
        finally:
            if sink is not None:
                sink.ended(prompt.task_id, attempt)

    async def _call(
        self,
        contract: ExecutionContract,
        provider: str,
        request: ProviderRequest,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
    ) -> AttemptOutcome:
        """The call of one attempt (see :meth:`execute`) and what its answer makes of it."""
        model, schema = request.model, request.output_schema
        try:
            client = self.client(provider)
        except InvalidArgument as exc:
            error = TypedError(code="invalid_request", message=str(exc))
            return AttemptFailedOutcome(error, Telemetry())
        limiter = self._limits.get(provider) or anyio.CapacityLimiter(1)
        try:
            async with limiter:
                held = await self._wait_for_provider(provider)
                if held is not None:
                    return self._failed(contract, attempt, previous_errors, held, Telemetry())
                endpoint = self.settings.endpoints.get(provider)
                base_url = endpoint.base_url if endpoint is not None else None
                with model_call(provider, model, base_url, request.max_tokens, schema is not None) as traced:
                    try:
                        response = await client.complete(request)
                    except ProviderCallError as exc:
                        traced.failed(exc.error, exc.telemetry)
                        raise
                    traced.succeeded(response.telemetry, response.stop_reason)
        except ProviderCallError as exc:
            self._hold(provider, exc.error)
            return self._failed(contract, attempt, previous_errors, exc.error, exc.telemetry)
        return self._answered(contract, attempt, previous_errors, request, response)

    def _answered(
        self,
        contract: ExecutionContract,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        request: ProviderRequest,
        response: ProviderResponse,
    ) -> AttemptOutcome:
        """What a reply makes of the attempt: its answer, or a failure when it reports more output
        than ``request`` allowed (:func:`_over_max_tokens`) or does not match the step's schema."""
        over = _over_max_tokens(contract, request.max_tokens, response.telemetry)
        if over is not None:
            return self._failed(contract, attempt, previous_errors, over, response.telemetry)
        schema = request.output_schema
        if schema is None:
            return AttemptSucceeded(response.text, response.telemetry)
        try:
            value = validate_output(schema, response.text)
        except InvalidOutput as exc:
            error = TypedError(
                code=InvalidOutput.code,
                message=exc.message,
                retryable=True,
                http_status=response.telemetry.http_status,
                provider_request_id=response.telemetry.provider_request_id,
            )
            return self._failed(contract, attempt, previous_errors, error, response.telemetry)
        return AttemptSucceeded(response.text, response.telemetry, value)

    def _hold(self, provider: str, error: TypedError) -> None:
        """After a 429 with retry-after: hold back every call to ``provider`` until then."""
        if error.http_status != 429 or not error.retry_after_seconds:
            return
        until = self.clock.now() + timedelta(seconds=error.retry_after_seconds)
        current = self._held_until.get(provider)
        if current is None or until > current:
            self._held_until[provider] = until

    async def _wait_for_provider(self, provider: str) -> TypedError | None:
        """Wait out a hold on ``provider``: a 429 with ``retry-after`` holds back every call of the
        process to that provider, not just the task that got it. A call made before that time
        waits for it in memory up to ``hold_wait_cap_seconds``; past that, the error to record
        instead of calling (``rate_limited`` with the remaining wait, which the runtime records as
        the task's durable ``not_before``)."""
        until = self._held_until.get(provider)
        if until is None:
            return None
        remaining = (until - self.clock.now()).total_seconds()
        if remaining <= 0:
            return None
        if remaining > self.hold_wait_cap_seconds:
            return TypedError(
                code="rate_limited",
                message=f"provider {provider} asked this server to wait until {until.isoformat()} "
                "(a retry-after on another call); this call was not made",
                retryable=True,
                http_status=429,
                retry_after_seconds=remaining,
            )
        await anyio.sleep(remaining)
        return None

    def _failed(
        self,
        contract: ExecutionContract,
        attempt: int,
        previous_errors: tuple[TypedError, ...],
        error: TypedError,
        telemetry: Telemetry,
    ) -> AttemptFailedOutcome:
        """The failed outcome of this attempt, with the retry policy's decision folded in."""
        return failed_outcome(
            self.policy, contract, attempt, previous_errors, error, telemetry, self.rng, self.clock
        )


def _over_max_tokens(contract: ExecutionContract, max_tokens: int, telemetry: Telemetry) -> TypedError | None:
    """The error of a reply that reports more output tokens than the request's ``max_tokens``, in
    a run with a budget; None otherwise. The budget let the call start on the promise that it
    spends at most ``max_tokens`` output tokens (its reservation); a provider that reports more
    does not honour the limit (an endpoint reading the other field: ``max_tokens_field``), so its
    answer is not used and the task fails (``over_max_tokens``, not retried: the same request
    would overshoot again). The usage stays as reported, charged to the budget, whose next check
    then refuses the next call."""
    costs = contract.costs
    spent = telemetry.output_tokens
    if costs is None or costs.budget is None or spent is None or spent <= max_tokens:
        return None
    return TypedError(
        code=ProviderErrorCode.OVER_MAX_TOKENS,
        message=f"the provider reported {spent} output tokens for a call limited to max_tokens="
        f"{max_tokens}, which the run's budget counted on; the answer is not used. The endpoint does "
        "not honour the limit: check its max_tokens_field",
        retryable=False,
        http_status=telemetry.http_status,
        provider_request_id=telemetry.provider_request_id,
    )


#: A streamed answer longer than ``max_tokens`` times this many characters has spent more output
#: tokens than its limit: a token is much shorter than that on average, in prose and code alike.
MAX_CHARS_PER_TOKEN = 8


def _stream_guard(
    contract: ExecutionContract, max_tokens: int, write: Callable[[str], None] | None
) -> Callable[[str], None] | None:
    """In a run with a budget: what receives a streamed answer's pieces (passing them on to
    ``write``) and stops the stream once its text is longer than ``max_tokens`` allows (see
    :data:`MAX_CHARS_PER_TOKEN`), as :func:`_over_max_tokens` refuses a whole answer that reports
    more: the call ends there, its usage counted as ``max_tokens`` output tokens (at least what
    it spent), and the task fails with ``over_max_tokens``. Without a budget: ``write``."""
    costs = contract.costs
    if costs is None or costs.budget is None:
        return write
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    written = 0

    def on_delta(text: str) -> None:
        nonlocal written
        written += len(text)
        if written > limit:
            error = TypedError(
                code=ProviderErrorCode.OVER_MAX_TOKENS,
                message=f"the streamed answer passed {limit} characters, more than max_tokens={max_tokens} "
                "output tokens can hold, which the run's budget counted on; the stream was stopped and the "
                "answer is not used. The endpoint does not honour the limit: check its max_tokens_field",
                retryable=False,
            )
            raise ProviderCallError(error, Telemetry(output_tokens=max_tokens))
        if write is not None:
            write(text)

    return on_delta


def _correction(previous_errors: tuple[TypedError, ...]) -> str:
    """For a typed step: what was wrong with the latest rejected answer, for the next attempt."""
    rejected = next((e for e in reversed(previous_errors) if e.code == InvalidOutput.code), None)
    if rejected is None:
        return ""
    return (
        "\n## Your previous answer was rejected\n\n"
        f"{rejected.message}\n\n"
        'Answer again, with only a JSON object that matches the schema under "Answer format".\n'
    )


def contract_resolver(default_backend: WorkerBackend, settings: ProviderSettings | None) -> ContractResolver:
    """The runtime's contract resolver: the backend given at start, else ``default_backend``
    (``CONSTRUCT_WORKER_BACKEND`` / the config file); provider contracts via ``settings``.

    An inline run records ``settings.max_attempts`` (``CONSTRUCT_MAX_ATTEMPTS``) too: its agent
    steps are the tasks it has attempts of (the host's answers have none), and they take the
    configured bound as a provider run's steps do. The bound is the contract's, recorded at start,
    so a run keeps the one it started with when the server restarts with another setting."""

    def resolve(request: StartRequest, chain: ChainSnapshot) -> ExecutionContract:
        backend = request.worker_backend or default_backend
        if backend == "inline":
            if request.provider or request.model:
                raise InvalidArgument(
                    "provider and model apply to worker_backend='provider'; this run would use 'inline'"
                )
            if settings is None:
                return ExecutionContract(worker_backend="inline")
            return ExecutionContract(worker_backend="inline", max_attempts=settings.max_attempts)
        if settings is None:
            raise InvalidArgument("the provider backend is not configured on this server")
        return settings.resolve_contract(request.provider, request.model, chain)

    return resolve
