"""Specialists and chains: the built-in catalog and the user's ``construct.toml``.

A chain is checked whole when it is loaded, and resolved into the snapshot a run records, so a run
never depends on the configuration again; a bad file is refused with
:class:`~orchestration.errors.ConfigError` naming the file, the field and what is wrong. What a
file may say is in docs/chains.md and docs/approvals.md.
"""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from orchestration.chains.checks import check_chain, check_child_chains
from orchestration.chains.schemas import resolve_schema
from orchestration.core.agent_steps import check_agent_steps, parse_agent_step
from orchestration.core.models import (
    AGENT_APPROVER,
    RESERVED_STEP_NAMES,
    AgentStep,
    ChainSnapshot,
    ChainStep,
    OnExpiry,
    OnFailure,
    SpecialistSnapshot,
)
from orchestration.errors import (
    ConfigError,
    InvalidArgument,
    UnknownChain,
    UnknownSpecialist,
    did_you_mean,
    plain_problem,
    quoted,
)

BUILTIN_SPECIALISTS = ("architect", "engineer", "reviewer", "researcher", "tester", "writer")
#: The built-in chain ``research``: three researchers, each with its own angle, then a writer
RESEARCH_ANGLES = (
    (
        "research-sources",
        "Your angle: the facts. Find what is established about the request, from primary sources "
        "where you can, and say how sure each finding is.",
    ),
    (
        "research-practice",
        "Your angle: practice. Find how people actually do this today: tools, examples, costs and "
        "the pitfalls they report.",
    ),
    (
        "research-critique",
        "Your angle: the case against. Find the risks, the counter-evidence and the alternatives a "
        "careful skeptic would raise.",
    ),
)
NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_-]{0,47}$")


@dataclass(frozen=True, slots=True)
class Specialist:
    name: str
    description: str
    persona: str


#: What happens to a chain's live runs when the chain changes: ``pinned`` (they stay on the version
#: they started with), ``manual`` (they move when someone asks: ``orchestrate_upgrade``),
#: ``at_boundary`` (they move by themselves when they next pause, where the move is compatible).
UpgradePolicy = Literal["pinned", "manual", "at_boundary"]


@dataclass(frozen=True, slots=True)
class ChainDefinition:
    name: str
    description: str
    steps: tuple[ChainStep, ...]
    #: how many ready steps of a run the provider backend runs at once
    max_parallel: int = 4
    #: child runs: how many may be live at once, and how deep (see :mod:`orchestration.engine.children`)
    max_children: int | None = None
    max_depth: int = 3
    #: the chain's gate policy (:attr:`~orchestration.core.models.ChainSnapshot.approvers`)
    approvers: tuple[str, ...] | None = None
    #: what happens to its live runs when the chain changes (:data:`UpgradePolicy`)
    upgrade: UpgradePolicy = "pinned"
    #: a label of the team's own for this definition (``version`` in the file), shown beside the
    #: version's number and hash; not part of the snapshot, so changing it alone changes no version
    label: str | None = None


def carried(old: ChainSnapshot, new: ChainSnapshot, *, gates: bool = True) -> ChainSnapshot:
    """Chain ``new`` (a version as configured) with the start-time options of a run started on
    ``old``: the steps it gated at start (unless ``gates`` is False) and the task time limits set
    at start, on the steps of ``new`` that ``old`` has too."""
    before = {s.name: s for s in old.steps}
    steps = []
    for step in new.steps:
        was = before.get(step.name)
        update: dict[str, object] = {}
        if was is not None and gates and was.approve_before:
            update["approve_before"] = True
        if was is not None and step.timeout_seconds is None and was.timeout_seconds is not None:
            update["timeout_seconds"] = was.timeout_seconds
        steps.append(step.model_copy(update=update) if update else step)
    return new.model_copy(update={"steps": tuple(steps)})


def _load_builtin_specialist(name: str) -> Specialist:
    text = resources.files("orchestration.chains.specialists").joinpath(f"{name}.md").read_text("utf-8")
    first, _, body = text.partition("\n")
    if not first.startswith("description:"):
        raise RuntimeError(f"built-in specialist file {name}.md must start with 'description:'")
    return Specialist(name, first.removeprefix("description:").strip(), body.strip())


# ------------------------------------------------------------------------------------------
# The TOML schema


def _check_name(value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            f"{value!r} is not a valid name: use 1-48 lowercase letters, digits, '-' or '_', "
            "starting with a letter"
        )
    return value


def _check_approvers(value: list[str] | None) -> list[str] | None:
    """An ``approvers`` list as written, or a ``ValueError``: no name twice, no surrounding
    blanks, and ``"agent"`` spelled exactly (``Agent`` would be a person's name nobody has)."""
    if value is None:
        return None
    for name in value:
        if name != name.strip():
            raise ValueError(f"approver {name!r} has surrounding blanks")
        if name != AGENT_APPROVER and name.casefold() == AGENT_APPROVER:
            raise ValueError(f"approver {name!r}: the calling agent is spelled {AGENT_APPROVER!r}")
        if value.count(name) > 1:
            raise ValueError(f"approver {name!r} is listed twice")
    return value


#: An ``approvers`` list: 1-100 names of 1-200 characters (checked by :func:`_check_approvers`).
_Approvers = list[Annotated[str, Field(min_length=1, max_length=200)]] | None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _SpecialistConfig(_Strict):
    description: str = Field(min_length=1, max_length=300)
    persona: str | None = Field(default=None, min_length=1)
    persona_file: str | None = None


class _StepConfig(_Strict):
    #: who runs the step: a specialist, another chain as a child run (``chain``), or another MCP
    #: agent (``agent``: see :func:`_agent_step`); exactly one
    specialist: str | None = None
    chain: str | None = None
    output_of: str | None = None
    name: str | None = None
    approve_before: bool = False
    approve_after: bool = False
    on_failure: OnFailure = "fail"
    provider: str | None = None
    model: str | None = None
    timeout_seconds: float | None = Field(default=None, gt=0)
    #: a built-in schema's name or a JSON Schema table; checked by :func:`resolve_schema`, which
    #: says more than a pydantic union error would
    output_schema: Any = None
    route_on: str | None = Field(default=None, min_length=1, max_length=100)
    routes: dict[str, str] | None = None
    max_visits: int = Field(default=3, ge=1, le=100)
    on_exhausted: str = "fail"
    after: list[str] | None = Field(default=None, max_length=50)
    instruction: str | None = Field(default=None, max_length=4000)
    expires_after_seconds: float | None = Field(default=None, gt=0)
    on_expiry: OnExpiry = "reject"
    approvers: _Approvers = Field(default=None, min_length=1, max_length=100)
    #: a step that delegates to another MCP agent (see :mod:`orchestration.core.agent_steps`)
    agent: str | None = Field(default=None, min_length=1, max_length=48)
    tool: str | None = Field(default=None, min_length=1, max_length=128)
    arguments: dict[str, Any] | None = None
    output_step: str | None = Field(default=None, min_length=1, max_length=100)
    #: a step that sends a message to an A2A agent: the message, a template as ``arguments``' strings
    message: str | None = Field(default=None, min_length=1, max_length=100_000)

    _names = field_validator("specialist", "name", "chain", "output_of")(
        lambda v: v if v is None else _check_name(v)
    )
    _approvers = field_validator("approvers")(_check_approvers)


class _ChainConfig(_Strict):
    description: str = ""
    max_parallel: int = Field(default=4, ge=1, le=64)
    max_children: int | None = Field(default=None, ge=1, le=1000)
    max_depth: int = Field(default=3, ge=0, le=20)
    #: the policy of every gate whose step sets none, and of the run's budget gates (docs/approvals.md)
    approvers: _Approvers = Field(default=None, min_length=1, max_length=100)
    steps: list[str | _StepConfig] = Field(min_length=1, max_length=50)
    upgrade: UpgradePolicy = "pinned"
    version: str | None = Field(default=None, min_length=1, max_length=64)

    _approvers = field_validator("approvers")(_check_approvers)


class _CatalogConfig(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)
    specialists: dict[str, _SpecialistConfig] = Field(default_factory=dict)
    chains: dict[str, _ChainConfig] = Field(default_factory=dict)


def _agent_step(step: _StepConfig, raw: Mapping[str, Any], source: str, where: str) -> AgentStep | None:
    """The step's :class:`AgentStep` (None for a specialist's step), or a ``ConfigError``."""
    problem = parse_agent_step(
        specialist=step.specialist,
        agent=step.agent,
        tool=step.tool,
        arguments=step.arguments,
        output_step=step.output_step,
        provider=step.provider or step.model,
        agents=raw.get("agents"),
        message=step.message,
    )
    if isinstance(problem, tuple):
        raise ConfigError(source, f"{where}.{problem[0]}", problem[1])
    return problem


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("str", "_StepConfig"):
            # pydantic names the union member it tried; the user does not need to see it
            continue
        else:
            out += f".{part}" if out else str(part)
    return out or "(file)"


# ------------------------------------------------------------------------------------------


#: how many resolved chain snapshots a catalog keeps (:meth:`Catalog.resolve`); past it, it starts again
RESOLVED_KEPT = 256


@dataclass(frozen=True)
class Catalog:
    """The specialists and chains a server knows. Immutable once loaded."""

    specialists: Mapping[str, Specialist]
    chains: Mapping[str, ChainDefinition]
    source: str = "built-in"
    _snapshots: dict[str, SpecialistSnapshot] = field(default_factory=dict, compare=False)
    #: the snapshots resolved lately, by what was resolved (see :meth:`resolve`)
    _resolved: dict[tuple[str | tuple[str, ...] | None, tuple[str, ...]], ChainSnapshot] = field(
        default_factory=dict, compare=False
    )

    @classmethod
    def builtin(cls) -> Catalog:
        specialists = {name: _load_builtin_specialist(name) for name in BUILTIN_SPECIALISTS}
        default = ChainDefinition(
            "default",
            "architect designs, engineer builds, reviewer reviews",
            tuple(ChainStep(name=n, specialist=n) for n in ("architect", "engineer", "reviewer")),
        )
        review_loop = ChainDefinition(
            "review-loop",
            "architect designs, engineer builds, reviewer approves (the run ends), asks for a "
            "revision (back to the engineer with the notes, at most 3 engineer rounds, then a human "
            "decides) or rejects (the run fails)",
            (
                ChainStep(name="architect", specialist="architect"),
                ChainStep(name="engineer", specialist="engineer", max_visits=3),
                ChainStep(
                    name="reviewer",
                    specialist="reviewer",
                    output_schema=resolve_schema("verdict"),
                    route_on="verdict",
                    routes={"approve": "end", "revise": "engineer", "reject": "fail"},
                    on_exhausted="ask",
                ),
            ),
        )
        assert check_chain(review_loop.steps) is None
        research = ChainDefinition(
            "research",
            "three researchers work at the same time, each on its own angle; a writer merges their findings",
            (
                *(
                    ChainStep(name=name, specialist="researcher", after=(), instruction=angle)
                    for name, angle in RESEARCH_ANGLES
                ),
                ChainStep(
                    name="writer",
                    specialist="writer",
                    after=tuple(n for n, _ in RESEARCH_ANGLES),
                    instruction="Merge the three researchers' findings into one report: where they "
                    "agree, where they differ, and what is still open.",
                ),
            ),
        )
        assert check_chain(research.steps) is None
        return cls(specialists, {"default": default, "review-loop": review_loop, "research": research})

    @classmethod
    def load(cls, path: Path | None) -> Catalog:
        """The built-in catalog extended (and overridden) by the TOML file at ``path``."""
        base = cls.builtin()
        if path is None:
            return base
        shown = str(path)
        try:
            raw = tomllib.loads(path.read_text("utf-8"))
        except FileNotFoundError:
            raise ConfigError(shown, "(file)", "the file does not exist") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(shown, "(file)", f"cannot be read: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(shown, "(file)", f"is not valid TOML: {exc}") from None
        return base.extended(raw, shown, path.parent)

    def extended(self, raw: Mapping[str, Any], source: str, base_dir: Path) -> Catalog:
        """This catalog with the specialists and chains of a user's file added (a name already
        known is overridden): ``raw`` is the parsed TOML read from ``source`` (named in every
        ``ConfigError``), ``base_dir`` the folder its ``persona_file`` paths are relative to. The
        file's specialists come first, so its chains may use them; then each chain, and then the
        child chains across all of them (:func:`~orchestration.chains.checks.check_child_chains`)."""
        config = _parsed_config(raw, source)
        specialists = dict(self.specialists)
        for name, spec in config.specialists.items():
            specialists[name] = _user_specialist(name, spec, source, base_dir)
        chains = dict(self.chains)
        for name, chain in config.chains.items():
            chains[name] = _user_chain(name, chain, _StepContext(specialists, raw, source))
        explicit = {n for n, c in config.chains.items() if "max_depth" in c.model_fields_set}
        problem = check_child_chains({n: c.steps for n, c in chains.items()}, explicit)
        if problem is not None:
            raise ConfigError(source, f"chains.{problem[0]}", problem[1])
        return Catalog(specialists, chains, source)

    # -- resolution at start ------------------------------------------------------------------

    def resolve(self, chain: str | Sequence[str] | None, approve_before: Sequence[str] = ()) -> ChainSnapshot:
        """Resolve a chain given at start (a chain name, or a list of specialist names) into the
        snapshot the run keeps. ``approve_before`` names steps to gate (in addition to the chain's
        own gates). Raises UnknownChain, UnknownSpecialist or InvalidArgument.

        The same arguments resolve to the same snapshot *object* (the catalog is immutable, a
        snapshot frozen): the runs of one chain share it, and with it what is derived from it once
        per object (its hash, its stored and shown forms: :mod:`orchestration.core.memo`), instead
        of a copy per live run. At most :data:`RESOLVED_KEPT` are kept."""
        key = (chain if chain is None or isinstance(chain, str) else tuple(chain), tuple(approve_before))
        found = self._resolved.get(key)
        if found is None:
            found = self._resolve(chain, approve_before)
            if len(self._resolved) >= RESOLVED_KEPT:
                self._resolved.clear()
            self._resolved[key] = found
        return found

    @property
    def moves_at_boundary(self) -> bool:
        """Whether any chain's runs move by themselves when it changes (``at_boundary``)."""
        return any(c.upgrade == "at_boundary" for c in self.chains.values())

    def label(self, name: str) -> str | None:
        """The ``version`` label the configuration gives chain ``name`` (None: none, or no such
        chain)."""
        definition = self.chains.get(name)
        return None if definition is None else definition.label

    def upgrade_policy(self, chain: ChainSnapshot) -> UpgradePolicy:
        """What happens to runs of ``chain`` when it changes: its ``upgrade`` in the configuration
        (``pinned`` for a chain given as a list of specialists, or since removed)."""
        definition = self.chains.get(chain.name)
        return "pinned" if definition is None else definition.upgrade

    def resolve_again(
        self,
        old: ChainSnapshot,
        chain: str | Sequence[str] | None = None,
        approve_before: Sequence[str] | None = None,
    ) -> ChainSnapshot:
        """The chain a run started on ``old`` gets from the configuration as it is now: ``chain``
        if given, else the same name (or the same specialists, for a chain given as a list; a
        chain since removed is ``unknown_chain``), with ``old``'s start-time options: the steps it
        gated at start when ``approve_before`` is None, and the task time limits set at start."""
        spec = self._spec_of(old) if chain is None else chain if isinstance(chain, str) else tuple(chain)
        return carried(old, self.resolve(spec, approve_before or ()), gates=approve_before is None)

    def configured(self, old: ChainSnapshot) -> ChainSnapshot:
        """The current version of the chain a run started on ``old``, as configured (without the
        run's start-time options): what :class:`~orchestration.store.KeepsChainVersions` keeps."""
        return self.resolve(self._spec_of(old))

    def _spec_of(self, old: ChainSnapshot) -> str | tuple[str, ...]:
        """The chain name a run started on ``old`` gave, or its specialists for a chain given as a
        list (``unknown_chain`` later when the name was since removed)."""
        if old.name == "custom" and old.name not in self.chains:
            return tuple(s.specialist for s in old.steps)
        return old.name

    def _resolve(self, chain: str | Sequence[str] | None, approve_before: Sequence[str]) -> ChainSnapshot:
        if chain is None or isinstance(chain, str):
            definition = self._named_chain(chain)
        else:
            definition = self._custom_chain(chain)
        steps = _gated(definition.steps, approve_before)
        used = sorted({s.specialist for s in steps if s.chain is None and s.agent is None})
        snapshots = tuple(
            SpecialistSnapshot(
                name=n, description=self.specialists[n].description, persona=self.specialists[n].persona
            )
            for n in used
        )
        return ChainSnapshot(
            name=definition.name,
            steps=tuple(steps),
            specialists=snapshots,
            max_parallel=definition.max_parallel,
            max_children=definition.max_children,
            max_depth=definition.max_depth,
            approvers=definition.approvers,
        )

    def _named_chain(self, chain: str | None) -> ChainDefinition:
        """The chain of that name (None: ``default``)."""
        if chain is not None and not chain.strip():
            # Not the default chain: a blank name is more likely a bug than a choice.
            raise InvalidArgument(
                "chain is empty; omit it for the default chain, or give a chain name "
                f"({', '.join(sorted(self.chains))}) or a list of specialist names"
            )
        name = "default" if chain is None else chain
        if name not in self.chains:
            raise UnknownChain(
                f"unknown chain {quoted(name)}{did_you_mean(name, self.chains)}; known chains: "
                f"{', '.join(sorted(self.chains))} "
                "(or pass a list of specialist names)"
            )
        return self.chains[name]

    def _custom_chain(self, specialists: Sequence[str]) -> ChainDefinition:
        """The chain ``custom`` of these specialists in order, with the defaults of a chain."""
        if not specialists:
            raise InvalidArgument("chain is an empty list; give at least one specialist name")
        if len(specialists) > 50:
            raise InvalidArgument("a chain has at most 50 steps")
        for spec in specialists:
            if spec not in self.specialists:
                raise UnknownSpecialist(
                    f"unknown specialist {quoted(spec)}; known specialists: "
                    f"{', '.join(sorted(self.specialists))}"
                )
        steps = _unique_names([ChainStep(name=s, specialist=s) for s in specialists])
        reserved = [s.name for s in steps if s.name in RESERVED_STEP_NAMES]
        if reserved:
            raise InvalidArgument(
                f"a chain step cannot be called {quoted(reserved[0])} (end, fail and ask are route "
                "targets); define a chain that gives the step another name"
            )
        return ChainDefinition("custom", "", tuple(steps))


def _gated(steps: Sequence[ChainStep], approve_before: Sequence[str]) -> list[ChainStep]:
    """``steps`` with a gate before each step ``approve_before`` names (each must be one of them)."""
    step_names = [s.name for s in steps]
    for gated in approve_before:
        if gated not in step_names:
            raise InvalidArgument(
                f"approve_before names step {quoted(gated)}, which is not in the chain; "
                f"its steps are: {', '.join(step_names)}"
            )
    return [s.model_copy(update={"approve_before": True}) if s.name in approve_before else s for s in steps]


# ------------------------------------------------------------------------------------------
# A user's file: its specialists, its chains and their steps (Catalog.extended)


def _parsed_config(raw: Mapping[str, Any], source: str) -> _CatalogConfig:
    """The file's ``specialists`` and ``chains`` tables, validated, or the first problem found."""
    try:
        return _CatalogConfig.model_validate(raw)
    except ValidationError as exc:
        errors = exc.errors()
        # For a step given as a table, the error of the "plain string" branch of the union is
        # noise: report the table's own problem. A misspelled required field is both unknown and
        # missing: the unknown one, with its did-you-mean, says what to fix.
        errors = [e for e in errors if "str" not in e["loc"]] or errors
        err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
        message = plain_problem(err) if err["type"] != "extra_forbidden" else _unknown_field(err["loc"])
        raise ConfigError(source, _loc(err["loc"]), message) from None


def _unknown_field(loc: Sequence[int | str]) -> str:
    """What to say of the unknown field at ``loc`` (pydantic's "Extra inputs are not permitted"
    names no alternative): the close known field, else the fields that table takes."""
    if "_StepConfig" in loc:
        model: type[BaseModel] = _StepConfig
        noun = "a step"
    elif loc[0] == "specialists":
        model, noun = _SpecialistConfig, "a specialist"
    else:
        model, noun = _ChainConfig, "a chain"
    known = list(model.model_fields)
    hint = did_you_mean(str(loc[-1]), known)
    if model is _ChainConfig:
        # A step's field (``approve_before``) written on the chain: say where it goes.
        steps_only = [f for f in _StepConfig.model_fields if f not in known]
        name = str(loc[-1])
        if name in steps_only or did_you_mean(name, [*known, *steps_only]) != hint:
            close = name if name in steps_only else difflib.get_close_matches(name, steps_only, n=1)[0]
            where = f"{close!r} is a field of a step, not of a chain"
            said = f"; {where}" if close == name else f" (did you mean {close!r}? {where})"
            return (
                f"unknown field{said}: write the step as a table, as in "
                f'steps = [{{ specialist = "...", {close} = ... }}]'
            )
    return f"unknown field{hint}" if hint else f"unknown field; {noun} takes: {', '.join(known)}"


def _checked_name(name: str, source: str, where: str) -> str:
    """``name``, or a ``ConfigError`` at ``where`` when it is not a valid name."""
    try:
        return _check_name(name)
    except ValueError as exc:
        raise ConfigError(source, where, str(exc)) from None


def _user_specialist(name: str, spec: _SpecialistConfig, source: str, base_dir: Path) -> Specialist:
    """The specialist of ``[specialists.<name>]``: its persona given inline or read from a file."""
    where = f"specialists.{name}"
    _checked_name(name, source, where)
    if (spec.persona is None) == (spec.persona_file is None):
        raise ConfigError(source, where, "give exactly one of 'persona' or 'persona_file'")
    persona = spec.persona
    if spec.persona_file is not None:
        file = base_dir / spec.persona_file
        try:
            persona = file.read_text("utf-8").strip()
        except OSError as exc:
            raise ConfigError(
                source, f"{where}.persona_file", f"cannot read {file}: {exc.strerror}"
            ) from None
        if not persona:
            raise ConfigError(source, f"{where}.persona_file", f"{file} is empty")
    assert persona is not None
    return Specialist(name, spec.description, persona)


@dataclass(frozen=True, slots=True)
class _StepContext:
    """What every step of a user's chain is read against."""

    #: the specialists known once the file's own are added
    specialists: Mapping[str, Specialist]
    #: the whole file (its ``agents`` table names the agents a step may delegate to)
    raw: Mapping[str, Any]
    source: str


def _user_chain(name: str, chain: _ChainConfig, context: _StepContext) -> ChainDefinition:
    """The chain of ``[chains.<name>]``: its steps read one by one, named, then checked as a chain."""
    source = context.source
    where = f"chains.{name}"
    _checked_name(name, source, where)
    steps = [_user_step(item, context, f"{where}.steps[{i}]") for i, item in enumerate(chain.steps)]
    try:
        steps = _unique_names(steps)
    except ValueError as exc:
        raise ConfigError(source, f"{where}.steps", str(exc)) from None
    problem = check_chain(steps) or check_agent_steps(steps)
    if problem is not None:
        raise ConfigError(source, f"{where}.{problem[0]}", problem[1])
    return ChainDefinition(
        name,
        chain.description,
        tuple(steps),
        chain.max_parallel,
        chain.max_children,
        chain.max_depth,
        None if chain.approvers is None else tuple(chain.approvers),
        chain.upgrade,
        chain.version,
    )


def _user_step(item: str | _StepConfig, context: _StepContext, where: str) -> ChainStep:
    """One step of a user's chain: a specialist's name, or a table that names a specialist, a
    chain (a child run) or an agent."""
    if isinstance(item, str):
        # Checked before the step's record is made, which would refuse a bad name with pydantic's
        # own error instead of the file's ConfigError.
        _checked_name(item, context.source, where)
        return _specialist_step(_StepConfig(specialist=item), context, where)
    if item.chain is not None:
        return _child_step(item, context.source, where)
    return _specialist_step(item, context, where)


def _specialist_step(config: _StepConfig, context: _StepContext, where: str) -> ChainStep:
    """A step run by a specialist, or delegated to another MCP agent (:func:`_agent_step`)."""
    source = context.source
    if config.output_of is not None:
        raise ConfigError(source, f"{where}.output_of", "only a step with 'chain' has output_of")
    agent = _agent_step(config, context.raw, source, where)
    if agent is None and config.specialist not in context.specialists:
        raise ConfigError(
            source,
            f"{where}.specialist",
            f"unknown specialist {config.specialist!r}; known: {', '.join(sorted(context.specialists))}",
        )
    _check_gate_settings(config, source, where)
    schema = None
    if config.output_schema is not None:
        try:
            schema = resolve_schema(config.output_schema)
        except ValueError as exc:
            raise ConfigError(source, f"{where}.output_schema", str(exc)) from None
    return ChainStep(
        name=config.name or config.specialist or str(config.agent),
        specialist=config.specialist or f"agent:{config.agent}",
        agent=agent,
        approve_before=config.approve_before,
        approve_after=config.approve_after,
        on_failure=config.on_failure,
        provider=config.provider,
        model=config.model,
        timeout_seconds=config.timeout_seconds,
        output_schema=schema,
        route_on=config.route_on,
        routes=config.routes,
        max_visits=config.max_visits,
        on_exhausted=config.on_exhausted,
        after=None if config.after is None else tuple(config.after),
        instruction=config.instruction,
        expires_after_seconds=config.expires_after_seconds,
        on_expiry=config.on_expiry,
        approvers=None if config.approvers is None else tuple(config.approvers),
    )


def _check_gate_settings(config: _StepConfig, source: str, where: str) -> None:
    """A gate's expiry and approvers are refused on a step without gates, and ``on_expiry`` on a
    gate that never expires."""
    gated = config.approve_before or config.approve_after or config.on_exhausted == "ask"
    for key in ("expires_after_seconds", "approvers"):
        if getattr(config, key) is not None and not gated:
            raise ConfigError(
                source, f"{where}.{key}", "the step has no gate (set approve_before or approve_after)"
            )
    if "on_expiry" in config.model_fields_set and config.expires_after_seconds is None:
        raise ConfigError(
            source,
            f"{where}.on_expiry",
            "on_expiry needs expires_after_seconds (the gate never expires otherwise)",
        )


def _child_step(config: _StepConfig, source: str, where: str) -> ChainStep:
    """A step that runs another chain as a child run (:mod:`orchestration.engine.children`)."""
    assert config.chain is not None
    if config.specialist is not None or config.agent is not None:
        raise ConfigError(source, where, "give exactly one of 'specialist', 'chain' or 'agent'")
    for key in ("tool", "arguments", "output_step"):
        if getattr(config, key) is not None:
            raise ConfigError(source, f"{where}.{key}", "only a step with 'agent' has " + key)
    for key in ("output_schema", "route_on", "provider", "model"):
        if key in config.model_fields_set:
            raise ConfigError(
                source, f"{where}.{key}", "a step that runs a chain takes its child's output as it is"
            )
    return ChainStep(
        name=config.name or config.chain,
        specialist=f"chain:{config.chain}",
        chain=config.chain,
        output_of=config.output_of,
        approve_before=config.approve_before,
        approve_after=config.approve_after,
        on_failure=config.on_failure,
        timeout_seconds=config.timeout_seconds,
        max_visits=config.max_visits,
        after=None if config.after is None else tuple(config.after),
        instruction=config.instruction,
        expires_after_seconds=config.expires_after_seconds,
        on_expiry=config.on_expiry,
        approvers=None if config.approvers is None else tuple(config.approvers),
    )


def _unique_names(steps: Sequence[ChainStep]) -> list[ChainStep]:
    """Give repeated specialists distinct step names (engineer, engineer-2, ...); explicit duplicate
    names are an error."""
    seen: dict[str, int] = {}
    out: list[ChainStep] = []
    explicit = [s.name for s in steps]
    for step in steps:
        name = step.name
        if name in seen:
            if explicit.count(name) > 1 and step.name != step.specialist:
                raise ValueError(f"step name {name!r} is used twice")
            seen[name] += 1
            name = f"{name}-{seen[step.name]}"
            while name in explicit:
                seen[step.name] += 1
                name = f"{step.name}-{seen[step.name]}"
        else:
            seen[name] = 1
        out.append(step.model_copy(update={"name": name}) if name != step.name else step)
    return out
