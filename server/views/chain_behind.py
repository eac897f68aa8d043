"""Whether a run's chain has a newer version in the configuration than the one the run runs on,
and what moving it would do (:mod:`orchestration.core.upgrades`): shown with the run, so that a
run that stays on an older version says why; and the number (and label) of the version the run is
on, where the store keeps chain versions."""

from __future__ import annotations

from typing import TypeVar

from orchestration.chains import Catalog
from orchestration.core import CannotMove, ChainSnapshot, RunHead, plan_upgrade
from orchestration.engine import ChainVersions
from orchestration.errors import ConstructError
from server.views.run_view import BehindView, RunView

_Shown = TypeVar("_Shown", bound=RunView)


class ChainNews:
    """The configuration's current version of each chain version runs were seen on (the catalog
    of a process does not change while it runs, so each is resolved once)."""

    def __init__(self, catalog: Catalog, versions: ChainVersions | None = None) -> None:
        self.catalog = catalog
        self.versions = versions
        self._current: dict[str, ChainSnapshot | None] = {}

    def current(self, head: RunHead) -> ChainSnapshot | None:
        """The chain ``head``'s run would move to, or None when it is on it (or its chain is gone)."""
        if head.chain_hash not in self._current:
            try:
                chain: ChainSnapshot | None = self.catalog.resolve_again(head.chain)
            except ConstructError:
                chain = None
            if chain is not None and chain.content_hash() == head.chain_hash:
                chain = None
            self._current[head.chain_hash] = chain
        return self._current[head.chain_hash]

    def behind(self, head: RunHead) -> BehindView | None:
        """What :class:`~server.views.run_view.BehindView` says of a live run; None when it is on
        its chain's current version."""
        current = None if head.status.is_terminal else self.current(head)
        if current is None:
            return None
        policy = self.catalog.upgrade_policy(head.chain)
        view = BehindView(current_version=current.content_hash()[:12], upgrade=policy, verdict="would_move")
        if policy == "pinned":
            return view.model_copy(
                update={"verdict": "pinned", "reason": f"chain {head.chain.name!r} is pinned"}
            )
        verdict = plan_upgrade(head, current)
        if isinstance(verdict, CannotMove):
            kind = "blocked" if verdict.code == "upgrade_blocked" else "not_now"
            return view.model_copy(update={"verdict": kind, "reason": verdict.reason})
        return view

    async def shown(self, view: _Shown, head: RunHead) -> _Shown:
        """``view`` saying whether its run is behind and which version it is on (a copy when it
        says either; ``view`` itself when not)."""
        behind = self.behind(head)
        if self.versions is not None and self.versions.kept:
            on = await self.versions.of_run(head.chain)
            if on is not None:
                chain = view.chain.model_copy(update={"version": on.ordinal, "label": on.label})
                view = view.model_copy(update={"chain": chain})
            current = None if behind is None else await self.versions.current(head.chain)
            if behind is not None and current is not None:
                behind = behind.model_copy(update={"current_version": f"v{current.ordinal}"})
        return view if behind is None else view.model_copy(update={"behind": behind})


__all__ = ["ChainNews"]
