from __future__ import annotations

from pathlib import Path

import pytest

from orchestration.chains.catalog import BUILTIN_SPECIALISTS, Catalog
from orchestration.errors import ConfigError, InvalidArgument, UnknownChain, UnknownSpecialist


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "construct.toml"
    path.write_text(text)
    return path


def test_builtin_specialists_have_real_personas() -> None:
    catalog = Catalog.builtin()
    assert set(BUILTIN_SPECIALISTS) <= set(catalog.specialists)
    for spec in catalog.specialists.values():
        assert spec.description and len(spec.persona.split()) > 150, spec.name
    assert [s.specialist for s in catalog.chains["default"].steps] == ["architect", "engineer", "reviewer"]


def test_user_file_adds_specialists_and_chains(tmp_path: Path) -> None:
    (tmp_path / "sec.md").write_text("You are a security engineer. Find the holes.")
    path = write(
        tmp_path,
        """
store = "sqlite"   # server keys are ignored by the catalog
[specialists.security]
description = "Threat-models the design"
persona_file = "sec.md"

[chains.secure]
description = "with an audit"
steps = ["architect", { specialist = "engineer", approve_before = true }, "security", "engineer"]
""",
    )
    catalog = Catalog.load(path)
    assert catalog.specialists["security"].persona.startswith("You are a security engineer")
    chain = catalog.resolve("secure")
    assert [s.name for s in chain.steps] == ["architect", "engineer", "security", "engineer-2"]
    assert chain.step("engineer").approve_before and not chain.step("engineer-2").approve_before
    assert {s.name for s in chain.specialists} == {"architect", "engineer", "security"}


@pytest.mark.parametrize(
    ("text", "field", "problem"),
    [
        ("[chains.x]\nsteps = []\n", "chains.x.steps", "at least 1"),
        ('[chains.x]\nsteps = ["nobody"]\n', "chains.x.steps[0].specialist", "unknown specialist 'nobody'"),
        ('[chains.x]\nsteps = ["architect", "Bad"]\n', "chains.x.steps[1]", "not a valid name"),
        (
            '[chains.x]\nsteps = [{ specialist = "engineer", on_failure = "maybe" }]\n',
            "chains.x.steps[0].on_failure",
            "'fail' or 'continue'",
        ),
        (
            '[chains.x]\nsteps = [{ specialist = "engineer", colour = "red" }]\n',
            "chains.x.steps[0].colour",
            "unknown field; a step takes: specialist, chain, output_of, name, approve_before",
        ),
        (
            '[chains.x]\nsteps = [{ specialist = "engineer", aprove_before = true }]\n',
            "chains.x.steps[0].aprove_before",
            "unknown field (did you mean 'approve_before'?)",
        ),
        ('[chains.x]\nstep = ["architect"]\n', "chains.x.step", "unknown field (did you mean 'steps'?)"),
        (
            '[specialists.s]\ndescripton = "d"\npersona = "p"\n',
            "specialists.s.descripton",
            "unknown field (did you mean 'description'?)",
        ),
        (
            '[specialists.s]\ndescription = "d"\n',
            "specialists.s",
            "exactly one of 'persona' or 'persona_file'",
        ),
        ('[specialists.s]\npersona = "p"\n', "specialists.s.description", "is required"),
        ('[specialists.Bad]\ndescription = "d"\npersona = "p"\n', "specialists.Bad", "not a valid name"),
        (
            '[specialists.s]\ndescription = "d"\npersona_file = "missing.md"\n',
            "specialists.s.persona_file",
            "cannot read",
        ),
        ("this is = = not toml", "(file)", "not valid TOML"),
    ],
)
def test_bad_files_name_file_field_and_problem(tmp_path: Path, text: str, field: str, problem: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        Catalog.load(path)
    assert info.value.file == str(path)
    assert info.value.field == field
    assert problem in info.value.problem
    assert str(path) in str(info.value) and field in str(info.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Catalog.load(tmp_path / "nope.toml")


def test_resolution_errors_list_what_is_known() -> None:
    catalog = Catalog.builtin()
    with pytest.raises(UnknownChain, match="known chains: default"):
        catalog.resolve("nope")
    with pytest.raises(UnknownSpecialist, match="architect, engineer"):
        catalog.resolve(["architect", "wizard"])
    with pytest.raises(InvalidArgument, match="its steps are: architect, engineer, reviewer"):
        catalog.resolve(None, approve_before=["tester"])
    with pytest.raises(InvalidArgument):
        catalog.resolve([])


def test_snapshot_hash_changes_with_persona() -> None:
    a = Catalog.builtin().resolve(["writer"])
    b = Catalog.builtin().extended(
        {"specialists": {"writer": {"description": "d", "persona": "other"}}}, "t", Path(".")
    )
    assert a.content_hash() == Catalog.builtin().resolve(["writer"]).content_hash()
    assert a.content_hash() != b.resolve(["writer"]).content_hash()


def test_the_same_resolution_is_the_same_snapshot_object_shared_by_every_run_of_it() -> None:
    """Issue 24 (memory per live run): the runs of one chain share its snapshot, and what is
    derived from it once per object (its hash, its stored and shown forms), not a copy each."""
    catalog = Catalog.builtin()
    first = catalog.resolve(None)
    assert catalog.resolve(None) is first and catalog.resolve("default") is not None
    assert catalog.resolve(["architect", "engineer"]) is catalog.resolve(("architect", "engineer"))
    gated = catalog.resolve(None, ["engineer"])
    assert gated is not first and gated is catalog.resolve(None, ("engineer",))
    assert gated.steps[1].approve_before and not first.steps[1].approve_before
    assert first.content_hash() == catalog.resolve(None).content_hash()
    with pytest.raises(UnknownChain):
        catalog.resolve("no-such-chain")
    with pytest.raises(UnknownChain):  # a refusal is never remembered as a snapshot
        catalog.resolve("no-such-chain")
