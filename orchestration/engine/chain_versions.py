"""Chain versions as the runtime sees them: every configured snapshot of a chain name it starts a
run on (or finds in its configuration at start) is kept in the store as a numbered version
(:class:`~orchestration.store.KeepsChainVersions`), once per process; a run's version is the one
that, with the run's start-time options, is the snapshot the run holds. A store without the
ability keeps none: runs work the same, and only the numbers are missing from what is shown.

A version is what the configuration resolves a chain to, without any run's options (the gates
asked for at start, a task time limit): runs of one chain started with different options share
their version. Chains given as a list of specialists are all named ``custom`` and numbered as one
name."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestration.chains.catalog import Catalog, carried
from orchestration.core.clock import Clock
from orchestration.core.models import ChainSnapshot
from orchestration.errors import ConstructError, UnknownChain
from orchestration.store import ChainSource, ChainVersion, KeepsChainVersions, RunStore

#: runs' chain hashes whose version this process remembers (their number never changes)
REMEMBERED = 4096


class ChainVersions:
    """The runtime's view of the kept versions (see above)."""

    def __init__(self, store: RunStore, catalog: Callable[[], Catalog], clock: Clock) -> None:
        """``catalog``: the configuration as it is now (the runtime's may be replaced)."""
        self._store = store if isinstance(store, KeepsChainVersions) else None
        self._catalog_now = catalog
        self._clock = clock
        self._kept: set[str] = set()
        self._of_name: dict[str, list[ChainVersion]] = {}
        self._of_run: dict[str, ChainVersion] = {}
        #: runs' chain hashes no kept version matched (read again once something new is kept)
        self._unmatched: set[str] = set()

    @property
    def _catalog(self) -> Catalog:
        return self._catalog_now()

    @property
    def kept(self) -> bool:
        """Whether the store keeps versions."""
        return self._store is not None

    async def seen(self, chain: ChainSnapshot, source: ChainSource) -> ChainVersion | None:
        """Keep ``chain`` (a version as configured, or as a call's list of specialists resolves)
        unless this process kept it already; its version when it was kept now."""
        if self._store is None or chain.content_hash() in self._kept:
            return None
        label = self._catalog.label(chain.name) if source == "config" else None
        version = await self._store.keep_chain_version(chain, source, label, self._clock.now())
        self._kept.add(version.chain_hash)
        self._of_name.pop(chain.name, None)
        self._unmatched.clear()
        return version

    async def seen_at_start(self, chain: str | Sequence[str] | None) -> None:
        """Keep the version a start names (a chain's name, or a list of specialists)."""
        if self._store is not None:
            source: ChainSource = "call" if chain is not None and not isinstance(chain, str) else "config"
            await self.seen(self._catalog.resolve(chain), source)

    async def seen_in_configuration(self) -> int:
        """Keep the current version of every chain the configuration names; how many were new."""
        new = 0
        for name in sorted(self._catalog.chains):
            new += await self.seen(self._catalog.resolve(name), "config") is not None
        return new

    async def of_name(self, name: str, *, fresh: bool = False) -> list[ChainVersion]:
        """The kept versions of chain ``name``, oldest first (read once, or again when ``fresh``:
        another server may have kept more)."""
        if self._store is None:
            return []
        if fresh or name not in self._of_name:
            self._of_name[name] = await self._store.chain_versions(name)
        return self._of_name[name]

    async def of_run(self, chain: ChainSnapshot) -> ChainVersion | None:
        """The version a run holding ``chain`` is on (None: none kept matches it)."""
        wanted = chain.content_hash()
        found = self._of_run.get(wanted)
        if found is not None or self._store is None or wanted in self._unmatched:
            return found
        for fresh in (False, True):
            for version in reversed(await self.of_name(chain.name, fresh=fresh)):
                if carried(chain, version.chain).content_hash() == wanted:
                    if len(self._of_run) >= REMEMBERED:
                        self._of_run.clear()
                    self._of_run[wanted] = version
                    return version
        if len(self._unmatched) >= REMEMBERED:
            self._unmatched.clear()
        self._unmatched.add(wanted)
        return None

    async def numbered(self, name: str, ordinal: int) -> ChainVersion:
        """Version ``ordinal`` of chain ``name`` (``unknown_chain`` naming the kept ones when it
        has none such)."""
        for fresh in (False, True):
            versions = await self.of_name(name, fresh=fresh)
            for version in versions:
                if version.ordinal == ordinal:
                    return version
        known = ", ".join(f"v{v.ordinal}" for v in versions) or "none are kept in this store"
        raise UnknownChain(f"chain {name!r} has no version {ordinal}; its versions: {known}")

    async def current(self, chain: ChainSnapshot) -> ChainVersion | None:
        """The kept version that is the configuration's current one for a run holding ``chain``
        (None: the store keeps none, or the chain is gone from the configuration)."""
        try:
            configured = self._catalog.configured(chain)
        except ConstructError:
            return None
        await self.seen(configured, "call" if chain.name not in self._catalog.chains else "config")
        wanted = configured.content_hash()
        for fresh in (False, True):
            for version in await self.of_name(chain.name, fresh=fresh):
                if version.chain_hash == wanted:
                    return version
        return None


async def named(versions: ChainVersions, chain: ChainSnapshot) -> str:
    """How a run's chain version is named in an answer: ``v3`` when it is a kept version, else
    the start of its hash."""
    version = await versions.of_run(chain)
    return chain.content_hash()[:12] if version is None else f"v{version.ordinal}"


def parse_version(text: str) -> int | None:
    """``to`` as a version number (``3`` or ``v3``); None for ``current``. Raises ValueError."""
    cleaned = text.strip().lower()
    if cleaned == "current":
        return None
    number = int(cleaned.removeprefix("v"))
    if number < 1:
        raise ValueError("a version number is 1 or more")
    return number


__all__ = ["ChainVersions", "named", "parse_version"]
