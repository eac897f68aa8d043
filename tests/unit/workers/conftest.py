"""The fake provider over real HTTP for the workers' tests: one server per module, its scenario and
counters cleared for each test, and a client that ignores proxy settings."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx2
import pytest

from orchestration.workers.model_calls import make_http_client
from tests.fakes.fake_provider import FakeProvider


@pytest.fixture(scope="module")
def server() -> Iterator[FakeProvider]:
    with FakeProvider() as running:
        yield running


@pytest.fixture
def fake(server: FakeProvider) -> FakeProvider:
    """The module's server, with an empty scenario and zeroed counters for each test."""
    server.set_scenario(None)
    return server


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    # trust_env=False: a proxy configured in the environment must not intercept 127.0.0.1.
    async with make_http_client(trust_env=False, read_timeout=10.0) as client:
        yield client
