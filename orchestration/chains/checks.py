"""A chain's routes and bounds checked at load (:func:`check_chain`, used by the catalog): every
problem is named with its field, so a bad configuration never surprises a run. The rules they
check are :mod:`orchestration.core.routing`'s."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestration.core.graph import (
    check_graph,
    descendants,
    goes_back,
    is_parallel,
    predecessors_in,
)
from orchestration.core.models import (
    RESERVED_STEP_NAMES,
    ChainSnapshot,
    ChainStep,
)
from orchestration.core.routing import ASK, END, FAIL


def route_values(schema: dict[str, Any] | None, field: str) -> list[str] | str:
    """The values ``schema`` allows for its required string field ``field``, or what is wrong."""
    if schema is None:
        return "a step that routes needs an output_schema"
    props = schema.get("properties")
    if not isinstance(props, dict) or field not in props:
        return f"the step's output_schema has no field {field!r}"
    if field not in (schema.get("required") or []):
        return f"field {field!r} is not required by the step's output_schema, so an output could lack it"
    prop = props[field]
    allowed = prop.get("enum") if isinstance(prop, dict) else None
    if allowed is None and isinstance(prop, dict) and "const" in prop:
        allowed = [prop["const"]]
    if not isinstance(allowed, list) or not allowed or not all(isinstance(v, str) for v in allowed):
        return f"field {field!r} must allow a fixed set of strings (an enum) to be routed on"
    return list(allowed)


def check_chain(steps: Sequence[ChainStep]) -> tuple[str, str] | None:
    """The first configuration problem of a chain's routes and bounds, as ``(field, message)``
    with ``field`` relative to the chain (``steps[2].routes.revise``); None when it is sound.
    In a parallel chain (:mod:`orchestration.core.graph`) a route goes back to the routing step or one
    it runs after (a loop: the steps on the paths between them run again) or forward to a step
    that runs after it (a jump: the steps between are skipped), and ``on_exhausted`` names a
    step that runs after the routing step."""
    names = [s.name for s in steps]
    problem = check_graph(steps)
    if problem is not None:
        return problem
    graph = ChainSnapshot(name="check", steps=tuple(steps), specialists=()) if is_parallel(steps) else None
    for i, step in enumerate(steps):
        where = f"steps[{i}]"
        problem = (
            _check_name(where, step)
            or _check_routes(where, step, names, graph)
            or _check_on_exhausted(where, i, step, names, graph)
        )
        if problem is not None:
            return problem
    reached = reachable(steps)
    unreachable = [n for n in names if n not in reached]
    if unreachable:
        i = names.index(unreachable[0])
        return f"steps[{i}]", f"step {unreachable[0]!r} can never run: no route or earlier step leads to it"
    return None


def _check_name(where: str, step: ChainStep) -> tuple[str, str] | None:
    """A step may not take a name that a route uses as a target."""
    if step.name in RESERVED_STEP_NAMES:
        return (
            f"{where}.name",
            f"{step.name!r} is reserved (end, fail and ask are route targets); name the step otherwise",
        )
    return None


def _check_routes(
    where: str, step: ChainStep, names: list[str], graph: ChainSnapshot | None
) -> tuple[str, str] | None:
    """``route_on`` and ``routes`` together: every value the output_schema allows has a route, and
    every route names a value it allows and a target the step can go to."""
    if (step.routes is None) != (step.route_on is None):
        missing = "routes" if step.routes is None else "route_on"
        return f"{where}.{missing}", "route_on and routes go together: give both or neither"
    if step.route_on is None or step.routes is None:
        return None
    allowed = route_values(step.output_schema, step.route_on)
    if isinstance(allowed, str):
        return f"{where}.route_on", allowed
    for value, target in step.routes.items():
        problem = _check_route(step, value, target, allowed, names, graph)
        if problem is not None:
            return f"{where}.routes.{value}", problem
    unrouted = [v for v in allowed if v not in step.routes]
    if unrouted:
        return (
            f"{where}.routes",
            f"no route for {step.route_on} = {', '.join(map(repr, unrouted))}; every value "
            "the output_schema allows needs one",
        )
    return None


def _check_route(
    step: ChainStep,
    value: str,
    target: str,
    allowed: list[str],
    names: list[str],
    graph: ChainSnapshot | None,
) -> str | None:
    """What is wrong with the route ``value -> target`` of ``step``, if anything."""
    if value not in allowed:
        return f"the output_schema does not allow {step.route_on} = {value!r}; it allows: " + ", ".join(
            allowed
        )
    if target not in (END, FAIL) and target not in names:
        return f"unknown target {target!r}: name a step of the chain ({', '.join(names)}), 'end' or 'fail'"
    if (
        graph is not None
        and target in names
        and not goes_back(graph, step.name, target)
        and target not in descendants(graph, step.name)
    ):
        return (
            f"step {target!r} neither runs before {step.name!r} (a loop) nor after it (a jump); "
            "a route in a parallel chain goes to one or the other"
        )
    return None


def _check_on_exhausted(
    where: str, i: int, step: ChainStep, names: list[str], graph: ChainSnapshot | None
) -> tuple[str, str] | None:
    """``on_exhausted`` belongs to a routing step and names 'fail', 'ask', 'end' or a later step
    (in a parallel chain: one that runs after it)."""
    choice = step.on_exhausted
    if step.route_on is None and choice != FAIL:
        return f"{where}.on_exhausted", "only a step that routes (route_on) has on_exhausted"
    if choice in (END, FAIL, ASK):
        return None
    if graph is not None and choice not in descendants(graph, step.name):
        later = ", ".join(descendants(graph, step.name)) or "none"
    elif choice not in names or names.index(choice) <= i:
        later = ", ".join(names[i + 1 :]) or "none"
    else:
        return None
    return (
        f"{where}.on_exhausted",
        f"{choice!r} is not 'fail', 'ask', 'end' or a step after {step.name} (later steps: {later})",
    )


def reachable(steps: Sequence[ChainStep]) -> set[str]:
    """The steps a run can reach from the first: a step without routes goes on to the next one, a
    routing step to its targets and its ``on_exhausted`` step. In a parallel chain: from the steps
    that run after nothing, a step goes on to the steps that run after it (a routing step only
    when one of its routes or its ``on_exhausted`` jumps forward)."""
    if is_parallel(steps):
        return _reachable_graph(steps)
    names = [s.name for s in steps]
    seen: set[str] = set()
    todo = [names[0]] if names else []
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        i = names.index(name)
        step = steps[i]
        if step.routes is None:
            if i + 1 < len(names):
                todo.append(names[i + 1])
            continue
        todo += [t for t in step.routes.values() if t in names]
        if step.on_exhausted in names:
            todo.append(step.on_exhausted)
    return seen


def _reachable_graph(steps: Sequence[ChainStep]) -> set[str]:
    graph = ChainSnapshot(name="check", steps=tuple(steps), specialists=())
    names = [s.name for s in steps]
    after = {s.name: set(predecessors_in(steps, i)) for i, s in enumerate(steps)}
    seen: set[str] = set()
    todo = [n for n in names if not after[n]]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        step = graph.step(name)
        successors = [n for n in names if name in after[n]]
        if step.routes is None:
            todo += successors
            continue
        targets = [t for t in (*step.routes.values(), step.on_exhausted) if t in names]
        todo += targets
        if any(t in descendants(graph, name) for t in targets):
            todo += successors
    return seen


def check_child_chains(
    chains: Mapping[str, Sequence[ChainStep]], explicit_depth: set[str]
) -> tuple[str, str] | None:
    """The first problem of the chains' child steps, as ``(chain name, message)``: a step naming
    an unknown chain, or a chain that contains itself (directly or through others) where no chain
    on the cycle sets ``max_depth`` (``explicit_depth``: the chains that do)."""
    for name, chain in chains.items():
        for step in chain:
            if step.chain is not None and step.chain not in chains:
                known = ", ".join(sorted(chains))
                return name, f"step {step.name!r} runs unknown chain {step.chain!r}; known: {known}"
            if step.chain is not None and step.output_of is not None:
                names = [s.name for s in chains[step.chain]]
                if step.output_of not in names:
                    return name, (
                        f"step {step.name!r} takes output_of {step.output_of!r}, which is not a step of "
                        f"chain {step.chain!r} ({', '.join(names)})"
                    )
    for name in chains:
        cycle = _cycle_from(chains, name)
        if cycle is not None and not explicit_depth.intersection(cycle):
            return name, (
                f"chain {name!r} contains itself ({' -> '.join([*cycle, cycle[0]])}); set max_depth on "
                "one of these chains to bound the recursion"
            )
    return None


def _cycle_from(chains: Mapping[str, Sequence[ChainStep]], start: str) -> list[str] | None:
    """A path of child steps from ``start`` back to ``start``, if any."""
    todo: list[list[str]] = [[start]]
    seen: set[str] = set()
    while todo:
        path = todo.pop()
        for step in chains[path[-1]]:
            target = step.chain
            if target is None or target not in chains:
                continue
            if target == start:
                return path
            if target not in seen:
                seen.add(target)
                todo.append([*path, target])
    return None
