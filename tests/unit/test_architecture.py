"""The floor plan, enforced (DESIGN §5): ``server -> orchestration <- stores``; inside
``orchestration`` the layers ``core <- chains <- workers <- engine <- ops``; ``server`` and ``stores``
use ``orchestration`` only through its public names; no import circle; no private name of another
module; the environment read only by the settings; HTTP client code only in the workers.

Every rule is a function of a source tree (:class:`Tree`), run once on the real tree and once on a
tree with a planted violation, so that a rule that could never fail is itself a failure."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("orchestration", "server", "stores")

#: what each part of ``orchestration`` may import from the others (itself always allowed)
LAYERS: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "core": frozenset({"errors"}),
    "store": frozenset({"errors", "core"}),
    "tracing": frozenset({"errors", "core"}),
    "chains": frozenset({"errors", "core"}),
    "workers": frozenset({"errors", "core", "chains", "tracing"}),
    "engine": frozenset({"errors", "core", "chains", "workers", "store", "tracing"}),
    "ops": frozenset({"errors", "core", "chains", "workers", "store", "tracing", "engine"}),
}
#: the modules of ``orchestration`` that ``server`` and ``stores`` may import from: the layer
#: packages (their ``__all__``) and the three modules beside them
PUBLIC = frozenset(
    {"orchestration.core", "orchestration.chains", "orchestration.workers", "orchestration.engine"}
    | {"orchestration.ops", "orchestration.errors", "orchestration.store", "orchestration.tracing"}
)
#: what ``stores`` may use of ``orchestration``: the records, never the engine
STORES_MAY_USE = frozenset({"orchestration.core", "orchestration.errors", "orchestration.store"})
#: where the process environment may be read: the settings (and the one setting stdio's early
#: ``initialize`` needs before they can be loaded), and the one lookup of an agent's token at call
#: time (module -> the functions allowed in it; empty: the whole module)
ENVIRONMENT_READERS: dict[str, frozenset[str]] = {
    "server.settings.config": frozenset({"load_settings"}),
    "server.settings.early": frozenset({"early_settings"}),
    "orchestration.workers.mcp_agents": frozenset({"token_from_environment"}),
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported from (a module of the tree, or a third-party one)
    names: tuple[str, ...]  # the names taken from it (empty for ``import x``)
    line: int


@dataclass
class Tree:
    root: Path
    modules: dict[str, Path] = field(default_factory=dict)

    @classmethod
    def of(cls, root: Path) -> Tree:
        tree = cls(root)
        for top in TOPS:
            for path in sorted((root / top).rglob("*.py")):
                parts = list(path.relative_to(root).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                tree.modules[".".join(parts)] = path
        return tree

    def parsed(self, module: str) -> ast.Module:
        return ast.parse(self.modules[module].read_text(), filename=str(self.modules[module]))

    def imports(self, module: str) -> Iterator[Import]:
        package = module if self.modules[module].name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(self.parsed(module)):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(module, alias.name, (), node.lineno)
            elif isinstance(node, ast.ImportFrom):
                target = node.module or ""
                if node.level:  # relative: resolve against the importing package
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    target = ".".join([*base, target] if target else base)
                names = tuple(alias.name for alias in node.names)
                submodules = [n for n in names if f"{target}.{n}" in self.modules]
                for name in submodules:
                    yield Import(module, f"{target}.{name}", (), node.lineno)
                rest = tuple(n for n in names if n not in submodules)
                if rest or not submodules:
                    yield Import(module, target, rest, node.lineno)

    def internal_imports(self) -> Iterator[Import]:
        for module in self.modules:
            for imp in self.imports(module):
                if imp.target.split(".")[0] in TOPS:
                    yield imp


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "orchestration" and len(parts) > 1 else None


def circles(tree: Tree) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's SCCs)."""
    edges: dict[str, set[str]] = {m: set() for m in tree.modules}
    for imp in tree.internal_imports():
        if imp.target in tree.modules and imp.target != imp.source:
            edges[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = [stack.pop()]
            while group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def private_imports(tree: Tree) -> list[str]:
    """``from a import _x`` where ``_x`` is not the importer's own package's private module."""
    bad = []
    for imp in tree.internal_imports():
        owner, _, leaf = imp.target.rpartition(".")
        inside = imp.source == owner or imp.source.startswith(owner + ".")
        # a private module: only its own package (and that package's modules) may import it
        if leaf.startswith("_") and not leaf.endswith("__") and not inside:
            bad.append(f"{imp.source}:{imp.line} imports the private module {imp.target}")
        for name in imp.names:
            if name.startswith("_") and not name.startswith("__"):
                bad.append(f"{imp.source}:{imp.line} imports {imp.target}.{name}")
    return bad


def private_attributes(tree: Tree) -> list[str]:
    """``x._name`` reached on an object other than ``self`` or ``cls`` (friend access)."""
    bad = []
    for module in tree.modules:
        for node in ast.walk(tree.parsed(module)):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr[1] == "_":
                continue
            base = node.value
            if not (isinstance(base, ast.Name) and base.id in ("self", "cls")):
                bad.append(f"{module}:{node.lineno} reaches {ast.unparse(node)}")
    return bad


def layer_violations(tree: Tree) -> list[str]:
    bad = []
    for imp in tree.internal_imports():
        top, target_top = imp.source.split(".")[0], imp.target.split(".")[0]
        if top == "orchestration" and target_top in ("server", "stores"):
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} (orchestration imports neither)")
        elif top == "stores" and target_top == "server":
            bad.append(f"{imp.source}:{imp.line} imports {imp.target} (stores never import server)")
        elif top == "orchestration":
            mine, theirs = _layer(imp.source), _layer(imp.target)
            if mine and theirs and mine != theirs and theirs not in LAYERS.get(mine, frozenset()):
                bad.append(f"{imp.source}:{imp.line} imports {imp.target}: {mine} may not use {theirs}")
        elif target_top == "orchestration":
            allowed = STORES_MAY_USE if top == "stores" else PUBLIC
            if imp.target not in allowed:
                bad.append(f"{imp.source}:{imp.line} imports {imp.target}, not the public API")
        elif top == "server" and target_top == "stores" and imp.target != "stores":
            bad.append(f"{imp.source}:{imp.line} imports {imp.target}, not the stores package")
    return bad


def _reads_environment(node: ast.AST) -> bool:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os":
        return node.attr in ("environ", "environb", "getenv", "getenvb", "putenv", "unsetenv")
    return (
        isinstance(node, ast.ImportFrom)
        and node.module == "os"
        and any(a.name in ("environ", "environb", "getenv", "getenvb") for a in node.names)
    )


def environment_reads(tree: Tree) -> list[str]:
    bad = []
    for module in tree.modules:
        allowed = ENVIRONMENT_READERS.get(module)
        if allowed is not None and not allowed:
            continue
        parsed = tree.parsed(module)
        inside_allowed: set[int] = set()
        for fn in ast.walk(parsed):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) and allowed and fn.name in allowed:
                inside_allowed |= {id(n) for n in ast.walk(fn)}
        for node in ast.walk(parsed):
            if _reads_environment(node) and id(node) not in inside_allowed:
                bad.append(f"{module}:{getattr(node, 'lineno', 0)} reads the environment")
    return bad


def http_clients_outside_workers(tree: Tree) -> list[str]:
    bad = []
    for module, path in tree.modules.items():
        if "workers" in path.relative_to(tree.root).parts:
            continue
        bad += [
            f"{module}:{imp.line} imports {imp.target}"
            for imp in tree.imports(module)
            if imp.target.split(".")[0] in ("httpx", "httpx2")
        ]
    return bad


#: a third-party library used through one adapter module only (its top-level name -> the module;
#: one per layer that needs it); the optional A2A SDK too, so that a server without the ``a2a``
#: extra imports it only when an agent speaks A2A (the client, in the workers) or when it serves
#: its chains over A2A (the server face)
LIBRARY_ADAPTERS: dict[str, tuple[str, ...]] = {
    "jwt": ("server.transports.jwt_adapter",),
    "a2a": ("orchestration.workers.a2a_agents", "server.a2a.sdk_face"),
}


def _adapters_of(target: str) -> str:
    return " or ".join(LIBRARY_ADAPTERS[target.split(".")[0]])


def library_imports_outside_adapters(tree: Tree) -> list[str]:
    """A library of :data:`LIBRARY_ADAPTERS` imported by a module other than its adapters."""
    return [
        f"{module}:{imp.line} imports {imp.target} (only {_adapters_of(imp.target)} may)"
        for module in tree.modules
        for imp in tree.imports(module)
        if module not in LIBRARY_ADAPTERS.get(imp.target.split(".")[0], (module,))
    ]


def repeated_names(tree: Tree) -> list[str]:
    """Two modules of one name in different packages (``prompts`` for task prompts and for MCP
    prompts): a name says one thing in the whole tree. Package ``__init__`` files are exempt."""
    seen: dict[str, list[str]] = {}
    for module, path in tree.modules.items():
        if path.name != "__init__.py":
            seen.setdefault(path.stem, []).append(module)
    return [" and ".join(sorted(ms)) for name, ms in sorted(seen.items()) if len(ms) > 1]


def unreal_exports(tree: Tree) -> list[str]:
    """A name in a package's ``__all__`` that is neither one of its modules nor bound in its
    ``__init__`` (an export list that went stale when a module moved)."""
    bad = []
    for module, path in tree.modules.items():
        if path.name != "__init__.py":
            continue
        parsed = tree.parsed(module)
        bound = {a.asname or a.name for n in parsed.body if isinstance(n, ast.ImportFrom) for a in n.names}
        bound |= {
            t.id
            for n in parsed.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        bound |= {
            n.name
            for n in parsed.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        for node in parsed.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or not _assigns_all(node):
                continue
            value = node.value
            names = [
                e.value
                for e in getattr(value, "elts", [])
                if isinstance(e, ast.Constant) and isinstance(e.value, str)
            ]
            bad += [
                f"{module}.__all__ names {name}, which it neither has nor binds"
                for name in names
                if name not in bound and f"{module}.{name}" not in tree.modules
            ]
    return bad


def _defined(parsed: ast.Module) -> set[str]:
    """The names a module defines itself (functions, classes, assignments, also under a
    top-level ``if`` or ``try``), not the names it imports. (Python 3.11: no ``type`` statements.)"""
    names: set[str] = set()
    statements = list(parsed.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.If | ast.Try):
            statements += [*node.body, *node.orelse, *getattr(node, "finalbody", [])]
    return names


def second_paths(tree: Tree) -> list[str]:
    """One public path per name: a module's ``__all__`` lists only names it defines; a name is
    imported from the module that defines it or from a package that exports it, never through
    another module that merely imported it; a package's ``__init__`` exports only its own
    modules' names."""
    bad = []
    defined = {m: _defined(tree.parsed(m)) for m, p in tree.modules.items() if p.name != "__init__.py"}
    for module, path in tree.modules.items():
        parsed = tree.parsed(module)
        exported = {
            e.value
            for node in parsed.body
            if isinstance(node, ast.Assign | ast.AnnAssign) and _assigns_all(node)
            for e in getattr(node.value, "elts", [])
            if isinstance(e, ast.Constant) and isinstance(e.value, str)
        }
        if path.name == "__init__.py":
            bad += [
                f"{module} re-exports {name} from {imp.target}, outside the package"
                for imp in tree.imports(module)
                if imp.target.split(".")[0] in TOPS and not imp.target.startswith(f"{module}.")
                for name in imp.names
                if name in exported
            ]
        else:
            bad += [
                f"{module}.__all__ lists {n}, which it does not define" for n in exported - defined[module]
            ]
        for imp in tree.imports(module):
            if imp.target in defined:
                bad += [
                    f"{module}:{imp.line} imports {name} from {imp.target}, which does not define it"
                    for name in imp.names
                    if name not in defined[imp.target]
                ]
    return bad


#: "issue 23", "issues 11 and 23", "issue #9": where code came from is history, kept in commits
ISSUE_REFERENCE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def issue_references(tree: Tree) -> list[str]:
    """Code says what and why; which issue asked for it lives in the commits and the changelog."""
    return [
        f"{module}:{number}: {line.strip()[:80]}"
        for module, path in tree.modules.items()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ISSUE_REFERENCE.search(line)
    ]


#: the size rule as a structure rule: a function fits on a screen (docstring included); a longer one
#: is split by what its parts decide, never by size alone
MAX_FUNCTION_LINES = 60


def long_functions(tree: Tree) -> list[str]:
    bad = []
    for module in tree.modules:
        for node in ast.walk(tree.parsed(module)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    bad.append(f"{module}:{node.lineno} {node.name} is {lines} lines")
    return bad


RULES = {
    "circles": lambda tree: [" <-> ".join(group) for group in circles(tree)],
    "private_imports": private_imports,
    "private_attributes": private_attributes,
    "layers": layer_violations,
    "environment": environment_reads,
    "http_clients": http_clients_outside_workers,
    "library_adapters": library_imports_outside_adapters,
    "repeated_names": repeated_names,
    "unreal_exports": unreal_exports,
    "long_functions": long_functions,
    "second_paths": second_paths,
    "issue_references": issue_references,
}

#: third-party internals, each reached in one adapter module whose reliance a test pins
#: (tests/unit/server/test_sdk_reliance.py, tests/unit/server/test_uvicorn_adapter.py,
#: tests/stores/test_aiosqlite_reliance.py); nothing else may reach them
ADAPTERS: frozenset[str] = frozenset({"server.sdk", "server.transports.uvicorn_adapter", "stores._aiosqlite"})


@pytest.fixture(scope="module")
def tree() -> Tree:
    return Tree.of(ROOT)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_the_tree_keeps_the_rule(tree: Tree, rule: str) -> None:
    found = RULES[rule](tree)
    if rule == "private_attributes":
        found = [f for f in found if f.split(":")[0] not in ADAPTERS]
    assert not found, "\n".join(found)


def _assigns_all(node: ast.stmt) -> bool:
    if isinstance(node, ast.Assign):
        return any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    return (
        isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "__all__"
    )


def test_each_package_says_what_it_is_and_exports_its_names(tree: Tree) -> None:
    for module, path in tree.modules.items():
        if path.name != "__init__.py":
            continue
        parsed = tree.parsed(module)
        assert ast.get_docstring(parsed), f"{module}/__init__.py has no docstring"
        exported = [n for n in parsed.body if _assigns_all(n)]
        assert exported, f"{module}/__init__.py has no __all__"


# --- every rule fails on a planted violation ---------------------------------------------------


def _plant(tmp_path: Path, files: dict[str, str]) -> Tree:
    for top in TOPS:
        (tmp_path / top).mkdir(parents=True, exist_ok=True)
        (tmp_path / top / "__init__.py").write_text('"""x"""\n__all__: list[str] = []\n')
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        init = path.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
        path.write_text(text)
    return Tree.of(tmp_path)


PLANTED = {
    "circles": {
        "orchestration/engine/a.py": "from orchestration.engine.b import B\n",
        "orchestration/engine/b.py": "from orchestration.engine.a import A\n",
    },
    "private_imports": {
        "orchestration/engine/a.py": "from orchestration.engine.b import _hidden\n",
        "orchestration/engine/b.py": "_hidden = 1\n",
    },
    "private_attributes": {"orchestration/engine/a.py": "def f(drive):\n    return drive._append\n"},
    "layers": {
        "orchestration/core/a.py": "from orchestration.engine.runtime import Runtime\n",
        "orchestration/engine/runtime.py": "Runtime = 1\n",
    },
    "environment": {"server/mcp/tools.py": "import os\nLEVEL = os.environ.get('LEVEL')\n"},
    "http_clients": {"server/views/page.py": "import httpx2\n"},
    "library_adapters": {"server/transports/auth.py": "from jwt import decode\n"},
    "long_functions": {"orchestration/core/a.py": "def f():\n" + "    x = 1\n" * 60},
    "repeated_names": {"server/mcp/prompts.py": "", "orchestration/chains/prompts.py": ""},
    "unreal_exports": {
        "server/cli/__init__.py": '"""The CLI."""\n__all__ = ["main", "costs"]\n',
        "server/cli/main.py": "",
    },
    "issue_references": {"orchestration/core/a.py": '"""The fold, made fast (issue 11)."""\n'},
    "second_paths": {
        "orchestration/core/inputs.py": "class StartRequest: ...\n",
        "orchestration/engine/runtime.py": "from orchestration.core.inputs import StartRequest\n",
        "server/app.py": "from orchestration.engine.runtime import StartRequest\n",
    },
}

#: violations each rule must also see (one planted tree per line)
ALSO_PLANTED = [
    (
        "second_paths",
        {
            "orchestration/core/inputs.py": "class Limits: ...\n",
            "orchestration/engine/runtime.py": (
                "from orchestration.core.inputs import Limits\n__all__ = ['Limits']\n"
            ),
        },
    ),
    (
        "second_paths",
        {
            "orchestration/core/approvals.py": "Decision = str\n",
            "orchestration/engine/__init__.py": (
                '"""x"""\nfrom orchestration.core.approvals import Decision\n__all__ = ["Decision"]\n'
            ),
        },
    ),
    ("library_adapters", {"orchestration/workers/mcp_agents.py": "from a2a.client import Client\n"}),
    ("layers", {"server/app.py": "from orchestration.engine.runtime import Runtime\n"}),
    ("layers", {"stores/memory.py": "from orchestration.engine import Runtime\n"}),
    ("layers", {"orchestration/engine/runtime.py": "from orchestration.ops.forking import fork_run\n"}),
    ("layers", {"orchestration/core/models.py": "from stores import open_store\n"}),
    ("layers", {"server/app.py": "from stores.postgres import PostgresStore\n"}),
    ("private_imports", {"server/app.py": "from stores import _common\n"}),
    ("environment", {"stores/__init__.py": "from os import environ\n"}),
    ("environment", {"server/settings/config.py": "import os\ndef other():\n    return dict(os.environ)\n"}),
    (
        "environment",
        {"orchestration/workers/mcp_agents.py": "import os\ndef f():\n    return os.getenv('X')\n"},
    ),
    (
        "circles",
        {"server/mcp/a.py": "import server.mcp.b\n", "server/mcp/b.py": "from server.mcp import a\n"},
    ),
]


@pytest.mark.parametrize("rule", sorted(PLANTED))
def test_each_rule_fails_on_a_planted_violation(tmp_path: Path, rule: str) -> None:
    assert RULES[rule](_plant(tmp_path, PLANTED[rule]))


@pytest.mark.parametrize(
    ("rule", "files"), ALSO_PLANTED, ids=[f"{rule}-{i}" for i, (rule, _) in enumerate(ALSO_PLANTED)]
)
def test_the_rules_see_more_violations(tmp_path: Path, rule: str, files: dict[str, str]) -> None:
    assert RULES[rule](_plant(tmp_path, files))


def test_allowed_imports_are_not_flagged(tmp_path: Path) -> None:
    tree = _plant(
        tmp_path,
        {
            "orchestration/engine/drive.py": "from orchestration.core.models import RunHead\n",
            "orchestration/workers/mcp_agents.py": (
                "import os\ndef token_from_environment(n):\n    return os.environ.get(n)\n"
            ),
            "server/app.py": "from orchestration.engine import Runtime\nfrom stores import open_store\n",
            "stores/sqlite.py": "from stores._common import x\nfrom orchestration.core import RunHead\n",
            "stores/_common.py": "x = 1\n",
        },
    )
    assert {rule: RULES[rule](tree) for rule in RULES} == {rule: [] for rule in RULES}
