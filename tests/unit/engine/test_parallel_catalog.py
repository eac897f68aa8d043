"""Parallel chains in the catalog (``after``, ``instruction``, ``max_parallel``), the built-in
``research`` chain, and what each step of a parallel run sees in its prompt."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.chains.catalog import RESEARCH_ANGLES, Catalog
from orchestration.core import StartRequest
from orchestration.core.clock import ManualClock
from orchestration.core.decide import AwaitHost, next_actions
from orchestration.core.graph import ancestors
from orchestration.core.routing import chain_format
from orchestration.errors import ConfigError
from tests.unit.helpers import make_runtime
from tests.unit.parallel import RESEARCHERS


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "construct.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        (
            '[chains.x]\nsteps = ["architect", { specialist = "engineer", after = ["nobody"] }]\n',
            "chains.x.steps[1].after",
            "unknown step 'nobody'",
        ),
        (
            '[chains.x]\nsteps = ["architect", { specialist = "engineer", after = ["engineer"] }]\n',
            "chains.x.steps[1].after",
            "cannot run after itself",
        ),
        (
            '[chains.x]\nsteps = [{ specialist = "architect", after = ["reviewer"] }, '
            '{ specialist = "engineer", after = ["architect"] }, { specialist = "reviewer" }]\n',
            "chains.x.steps[0].after",
            "cycle: architect -> engineer -> reviewer -> architect",
        ),
        (
            '[chains.x]\nsteps = ["architect", '
            '{ specialist = "engineer", after = ["architect", "architect"] }]\n',
            "chains.x.steps[1].after",
            "named twice",
        ),
        (
            '[chains.x]\nsteps = [{ specialist = "engineer", instruction = "  " }]\n',
            "chains.x.steps[0].instruction",
            "instruction is empty",
        ),
        (
            '[chains.x]\nmax_parallel = 0\nsteps = ["engineer"]\n',
            "chains.x.max_parallel",
            "must be at least 1",
        ),
        (
            # a route to a step that runs neither before nor after the routing step
            '[chains.x]\nsteps = ["engineer", { name = "side", specialist = "tester", after = [] }, '
            '{ specialist = "reviewer", after = ["engineer"], output_schema = "verdict", '
            'route_on = "verdict", routes = { approve = "end", revise = "side", reject = "fail" } }]\n',
            "chains.x.steps[2].routes.revise",
            "neither runs before 'reviewer' (a loop) nor after it (a jump)",
        ),
        (
            '[chains.x]\nsteps = ["engineer", { name = "side", specialist = "tester", after = [] }, '
            '{ specialist = "reviewer", after = ["engineer"], output_schema = "verdict", '
            'route_on = "verdict", routes = { approve = "end", revise = "engineer", reject = "fail" }, '
            'on_exhausted = "side" }]\n',
            "chains.x.steps[2].on_exhausted",
            "'side' is not 'fail', 'ask', 'end' or a step after reviewer",
        ),
        (
            # the writer runs after a reviewer whose routes all end or loop: it can never run
            '[chains.x]\nsteps = ["engineer", { specialist = "reviewer", after = ["engineer"], '
            'output_schema = "verdict", route_on = "verdict", '
            'routes = { approve = "end", revise = "engineer", reject = "fail" } }, '
            '{ specialist = "writer", after = ["reviewer"] }]\n',
            "chains.x.steps[2]",
            "can never run",
        ),
    ],
)
def test_bad_parallel_chains_name_file_field_and_problem(
    tmp_path: Path, text: str, field: str, problem: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        Catalog.load(path)
    assert (info.value.file, info.value.field) == (str(path), field)
    assert problem in info.value.problem


def test_after_instruction_and_max_parallel_reach_the_snapshot(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
[chains.survey]
max_parallel = 2
steps = [
  { name = "one", specialist = "researcher", after = [], instruction = "Look at costs." },
  { name = "two", specialist = "researcher", after = [] },
  { specialist = "writer", after = ["one", "two"] },
]
""",
    )
    chain = Catalog.load(path).resolve("survey")
    assert chain.max_parallel == 2
    assert chain.step("writer").after == ("one", "two")
    assert chain.step("one").instruction == "Look at costs."
    assert ancestors(chain, "writer") == ["one", "two"]
    assert Catalog.builtin().resolve("default").max_parallel == 4


def test_builtin_research_runs_three_researchers_then_a_writer() -> None:
    catalog = Catalog.builtin()
    chain = catalog.resolve("research")
    assert [s.name for s in chain.steps] == [*RESEARCHERS, "writer"]
    assert [s.instruction for s in chain.steps[:3]] == [angle for _, angle in RESEARCH_ANGLES]
    assert len({s.instruction for s in chain.steps[:3]}) == 3
    assert chain.step("writer").after == RESEARCHERS
    # A run of it is a format 2 record (a server without parallel steps refuses it); the default
    # chain is unchanged and stays format 1.
    assert chain_format(chain) == 2
    assert chain_format(catalog.resolve("default")) == 1
    assert [s.after for s in catalog.resolve("default").steps] == [None, None, None]


async def test_researchers_start_together_and_the_writer_sees_every_finding_labelled() -> None:
    runtime = make_runtime()
    head, _ = await runtime.start(StartRequest("Should we adopt X?", chain="research"))
    # The three researchers' host tasks are prepared in the run's first write.
    assert head.version == 1
    assert next_actions(head, ManualClock().now()) == tuple(AwaitHost(name) for name in RESEARCHERS)
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    first = await runtime.prompt_for(head, "research-sources")
    assert RESEARCH_ANGLES[0][1] in first.user
    assert RESEARCH_ANGLES[1][1] not in first.user
    assert "## Work so far" not in first.user
    for name in RESEARCHERS:
        await runtime.submit_host_output(head.run_id, name, f"findings of {name}")
    await runtime.drive(head.run_id)
    head = await runtime.status(head.run_id)
    writer = await runtime.prompt_for(head, "writer")
    for name in RESEARCHERS:
        assert f"### {name} (researcher)\n\nfindings of {name}" in writer.user
    assert "writer (after research-sources, research-practice, research-critique)" in writer.user
