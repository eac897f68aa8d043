"""A 429 with retry-after holds back the process's other calls to that provider (parallel
siblings included), not just the task that got it; other providers are not held (unit level,
with an injected client and a manual clock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import anyio
import httpx2

from orchestration.chains.prompts import TaskPrompt
from orchestration.core.clock import ManualClock
from orchestration.core.models import ChainStep, ExecutionContract, Telemetry, TypedError
from orchestration.core.outcomes import AttemptFailedOutcome, AttemptSucceeded
from orchestration.workers.model_calls import ProviderCallError, ProviderRequest, ProviderResponse
from orchestration.workers.provider_worker import ProviderEndpoint, ProviderSettings, ProviderWorker

CONTRACT = ExecutionContract(worker_backend="provider", provider="openai", model="m", max_attempts=3)
PROMPT = TaskPrompt("t", "researcher", "system", "user")
RATE_LIMITED = TypedError(
    code="rate_limited", message="slow down", retryable=True, http_status=429, retry_after_seconds=120
)


@dataclass
class Client:
    """Answers 429 (retry-after 120 s) to the first request, then text."""

    requests: list[str] = field(default_factory=list)

    async def complete(self, request: ProviderRequest) -> ProviderResponse:
        self.requests.append(request.user)
        if len(self.requests) == 1:
            raise ProviderCallError(RATE_LIMITED, Telemetry(http_status=429))
        return ProviderResponse("answer", Telemetry(http_status=200))


def worker_with(clients: dict[str, Client], clock: ManualClock, http: httpx2.AsyncClient) -> ProviderWorker:
    endpoints = {name: ProviderEndpoint("openai", "http://127.0.0.1:9", None) for name in clients}
    settings = ProviderSettings(endpoints=endpoints, default_model="m")
    return ProviderWorker(
        settings, http, clock=clock, rng=lambda: 0.0, clients=clients, hold_wait_cap_seconds=5
    )


async def test_a_429_with_retry_after_holds_back_sibling_calls_to_the_same_provider() -> None:
    clock = ManualClock()
    held, other = Client(), Client()
    async with httpx2.AsyncClient() as http:
        worker = worker_with({"openai": held, "openrouter": other}, clock, http)
        step_a = ChainStep(name="a", specialist="researcher")
        step_b = ChainStep(name="b", specialist="researcher")
        first = await worker.execute(CONTRACT, step_a, PROMPT, 1, ())
        assert isinstance(first, AttemptFailedOutcome) and first.error.code == "rate_limited"
        # A sibling's call to the same provider, within the retry-after: not made, failed as
        # rate_limited with a durable not_before at the provider's time.
        sibling = await worker.execute(CONTRACT, step_b, PROMPT, 1, ())
        assert isinstance(sibling, AttemptFailedOutcome)
        assert sibling.error.code == "rate_limited" and sibling.error.retryable
        assert "this call was not made" in sibling.error.message
        assert sibling.not_before is not None and sibling.not_before >= clock.now() + timedelta(seconds=119)
        assert len(held.requests) == 1
        # Another provider is not held back.
        elsewhere = await worker.execute(
            CONTRACT.model_copy(update={"provider": "openrouter"}), step_b, PROMPT, 1, ()
        )
        assert isinstance(elsewhere, AttemptFailedOutcome) and len(other.requests) == 1
        # Once the provider's time has come, calls are made again.
        clock.advance(121)
        later = await worker.execute(CONTRACT, step_b, PROMPT, 2, (sibling.error,))
        assert isinstance(later, AttemptSucceeded) and len(held.requests) == 2


async def test_a_short_hold_is_waited_out_in_memory() -> None:
    clock = ManualClock()
    short = RATE_LIMITED.model_copy(update={"retry_after_seconds": 0.05})

    @dataclass
    class ShortClient(Client):
        async def complete(self, request: ProviderRequest) -> ProviderResponse:
            self.requests.append(request.user)
            if len(self.requests) == 1:
                raise ProviderCallError(short, Telemetry(http_status=429))
            return ProviderResponse("answer", Telemetry(http_status=200))

    client = ShortClient()
    async with httpx2.AsyncClient() as http:
        worker = worker_with({"openai": client}, clock, http)
        step = ChainStep(name="a", specialist="researcher")
        await worker.execute(CONTRACT, step, PROMPT, 1, ())
        with anyio.fail_after(10):
            sibling = await worker.execute(
                CONTRACT, ChainStep(name="b", specialist="researcher"), PROMPT, 1, ()
            )
        # Made after the wait (the manual clock does not move, so the wait is the hold's 0.05 s).
        assert isinstance(sibling, AttemptSucceeded) and len(client.requests) == 2
