"""The fake provider's per-run keys: a ``[run:NAME]`` marker in the prompts counts the calls of many
runs of one chain apart, and scripts still apply by task."""

from __future__ import annotations

import httpx2

from tests.fakes.fake_provider import FakeProvider, task_key


def test_a_run_marker_prefixes_the_task_key() -> None:
    step = 'You are step 1 of 3 ("architect", the architect) in the chain "build".'
    assert task_key(["persona", step + "\n## Request\n\nBuild it [run:r7]"]) == "r7/architect"
    assert task_key(["[task:engineer] persona", "Do it [run:r8]"]) == "r8/engineer"
    assert task_key(["persona", "Do it [run:r9]"]) == "r9/default"
    # Without a marker, the keys are what they always were.
    assert task_key(["persona", step]) == "architect"
    assert task_key(["persona", "no marker"]) == "default"


async def test_per_run_keys_count_apart_and_play_the_task_script() -> None:
    scenario = {"architect": [{"error": "overloaded"}, {"text": "design"}], "r2/architect": [{"text": "own"}]}
    with FakeProvider(scenario) as fake:
        async with httpx2.AsyncClient(base_url=fake.base_url) as http:

            async def ask(run: str) -> int:
                body = {
                    "model": "m",
                    "max_tokens": 8,
                    "system": "[task:architect] persona",
                    "messages": [{"role": "user", "content": f"Build it [run:{run}]"}],
                }
                response = await http.post("/v1/messages", json=body, headers={"x-api-key": "k"})
                return response.status_code

            # Each run has its own cursor through the "architect" script; r2 has a script of its own.
            assert [await ask("r1"), await ask("r1"), await ask("r3")] == [529, 200, 529]
            assert await ask("r2") == 200
        assert fake.calls() == {"r1/architect": 2, "r3/architect": 1, "r2/architect": 1}


def test_a_later_visit_of_a_step_has_its_own_task_key() -> None:
    """Loops are scripted per task instance (``reviewer~2`` answers differently from ``reviewer``),
    from the task id the prompt of a later visit states."""
    again = 'You are step 3 of 3 ("reviewer", the reviewer), round 2 (task reviewer~2) in the chain "x".'
    assert task_key(["persona", again]) == "reviewer~2"
    assert task_key(["persona", again + "\n\nDo it [run:r1]"]) == "r1/reviewer~2"
    first = 'You are step 3 of 3 ("reviewer", the reviewer) in the chain "x": a -> b (c).'
    assert task_key(["persona", first]) == "reviewer"
