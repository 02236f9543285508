"""The architecture's arrows, checked on the source (docs/development/architecture.md): every project
import points down the package layers, no two modules import each other in a circle, no private name
crosses a module, no file grows into a monolith, and `import treesearch` loads neither torch nor strategies."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lower number = lower layer. A module may import from its own package or from a package of a lower
# layer, never from one of the same or a higher layer. Keep this table and docs/development/architecture.md
# together.
LAYERS: dict[str, int] = {
    "common": 0,  # errors, config, counters, seeds, atomic files, intervals
    "kernels": 1,  # compiled CPU kernels over plain tensors: attention over runs, their build
    "viz": 1,  # views of a tree: plain data in, SVG/HTML/PNG out
    "policies": 1,  # ASKS, CGEE, RSBCM as pure rules
    "cache": 2,  # KV store, cache manager, shared-prefix attention
    "models": 3,  # loading models; LanguageModel installs the attention
    "backends": 3,  # the Backend protocol, the server engine
    "core": 3,  # Problem, ThoughtTree, SearchOps
    "engine": 4,  # the local engine: scheduler, forward, decode step, labels, tokens
    "tasks": 4,  # built-in problems
    "strategies": 4,  # BFS, Beam, MCTS, DFS
    "search": 5,  # Searcher, solve_many and its sessions, verifier, results
    "runs": 6,  # results file, Ray driver and worker
    "bench": 7,  # treesearch bench's workloads, modes, report
    "calibrate": 8,  # fitting CGEE and ASKS
    "cli": 9,  # the commands
    "__main__": 10,
}
TOP = {"__init__"}  # treesearch/__init__.py re-exports lazily; it imports nothing at module level
# What strategies must never reach for: the model, the tokenizer, the cache.
STRATEGY_FORBIDDEN = {"engine", "cache", "models", "policies"}
NO_TORCH = ("treesearch", "treesearch.core", "treesearch.search", "treesearch.backends", "strategies")


def _modules() -> list[Path]:
    return sorted(list((ROOT / "treesearch").rglob("*.py")) + list((ROOT / "strategies").glob("*.py")))


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> list[tuple[str, list[str], int]]:
    """(module imported, names imported, line) for every project import, lazy ones included."""
    mod = _name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] in ("treesearch", "strategies"):
                out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [
                (a.name, [], node.lineno)
                for a in node.names
                if a.name.split(".")[0] in ("treesearch", "strategies")
            ]
    return out


def _package(module: str) -> str | None:
    """The LAYERS key of a module: strategies, else its package under treesearch."""
    parts = module.split(".")
    if parts[0] == "strategies":
        return "strategies"
    return parts[1] if len(parts) > 1 else None


def _targets(target: str, names: list[str]) -> list[str]:
    """`from treesearch.cache import kvstore` imports the module treesearch.cache.kvstore."""
    out = []
    for n in names or [""]:
        sub = f"{target}.{n}" if n else target
        out.append(sub if (ROOT / (sub.replace(".", "/") + ".py")).exists() else target)
    return out


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in _modules():
        mine = _name(path)
        g.add_node(mine)
        for target, names, line in _imports(path):
            for dep in _targets(target, names):
                if dep != mine and not mine.startswith(dep + "."):
                    g.add_edge(mine, dep, line=line)
    return g


def test_every_package_has_a_layer():
    missing = sorted({_package(_name(p)) for p in _modules()} - set(LAYERS) - TOP - {None})
    assert missing == [], f"add these packages to LAYERS (and docs/development/architecture.md): {missing}"


def test_the_top_level_holds_few_entries():
    entries = sorted(
        p.name
        for p in (ROOT / "treesearch").iterdir()
        if p.name not in ("__init__.py", "__main__.py", "py.typed", "__pycache__")
    )
    assert len(entries) <= 15, entries


def test_imports_point_down_the_layers():
    wrong = []
    for a, b, data in _graph().edges(data=True):
        pa, pb = _package(a), _package(b)
        if pb is None or pa == pb:
            continue
        if pa is None or LAYERS[pb] >= LAYERS[pa]:
            wrong.append(f"{a}:{data['line']} ({pa}) imports {b} ({pb})")
    assert wrong == []


def test_no_import_circles():
    assert list(nx.simple_cycles(_graph())) == []


def test_strategies_reach_no_model_tokenizer_or_cache():
    wrong = [
        f"{a} imports {b}"
        for a, b in _graph().edges()
        if a.startswith("strategies") and _package(b) in STRATEGY_FORBIDDEN
    ]
    assert wrong == []


def test_the_store_and_attention_know_nothing_above_them():
    deps = {
        m: {_package(b) + "." + b.rpartition(".")[2] for _, b in _graph().out_edges(f"treesearch.{m}")}
        for m in (
            "cache.kvstore",
            "cache.segment",
            "cache.owners",
            "cache.eviction",
            "cache.attention",
            "engine.tokens",
            "engine.forward",
            "cache.manager",
        )
    }
    store_parts = {"cache.segment", "cache.owners", "cache.eviction"}  # the store's own pieces
    assert deps["cache.kvstore"] <= {"common.errors", "policies.rsbcm"} | store_parts  # rsbcm: the LRU key
    assert deps["cache.segment"] == set()
    assert deps["cache.owners"] <= {"cache.segment"} and deps["cache.eviction"] <= {"cache.segment"}
    # attention knows no store and no engine; its maths may use the compiled kernels beneath it
    assert deps["cache.attention"] <= {"kernels.attend_kernel", "kernels.chunk_attend"}
    assert deps["engine.tokens"] <= {"common.errors"}
    assert not {d.partition(".")[0] for d in deps["engine.forward"]} & {"cache", "search", "core"} - {
        "cache"
    } and not deps["engine.forward"] & {"cache.kvstore", "cache.manager", "engine.local", "policies.asks"}
    assert not deps["engine.forward"] & store_parts
    assert not {d.partition(".")[0] for d in deps["cache.manager"]} & {"engine", "search", "core", "models"}


# Names that mean an object of a layer (the package that defines it). A parameter or attribute of one
# of these names typed `Any` in a module of that layer or below hides an upward reference from the
# import check above: type it with what the callee needs (plain data, or a Protocol of its own).
UPWARD_NAMES = {
    "engine": "engine",
    "eng": "engine",
    "sched": "engine",
    "scheduler": "engine",
    "runner": "engine",
    "searcher": "search",
    "session": "search",
    "manager": "cache",
    "cache": "cache",
}


def _mentions_any(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(
        (isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
        for n in ast.walk(annotation)
    )


def _any_typed_upward(path: Path) -> list[tuple[str, int, str]]:
    """Parameters and attributes named for an object of this layer or above and typed `Any`."""
    mine = _package(_name(path))
    if mine not in LAYERS:
        return []
    out = []

    def check(name: str, annotation: ast.expr | None, line: int) -> None:
        up = UPWARD_NAMES.get(name)
        if up is not None and LAYERS[mine] <= LAYERS[up] and _mentions_any(annotation):
            out.append((str(path.relative_to(ROOT)), line, name))

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs]:
                check(arg.arg, arg.annotation, arg.lineno)
        elif isinstance(node, ast.AnnAssign):
            t = node.target
            name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
            check(name, node.annotation, node.lineno)
    return out


def _is_bound(e: ast.expr, methods: set[str]) -> bool:
    """`self.<one of methods>`."""
    return (
        isinstance(e, ast.Attribute)
        and isinstance(e.value, ast.Name)
        and e.value.id == "self"
        and e.attr in methods
    )


def _bound_methods_handed_down(path: Path) -> list[str]:
    """A method of a class handed to a lower package's callable (`Lower(..., self._compute)`) or
    set on another object (`other.compute = self._compute`): a callback from below into this layer."""
    mine = _package(_name(path))
    lower = {
        n
        for target, names, _ in _imports(path)
        if _package(target) != mine and _package(target) in LAYERS
        for n in names
    }
    out = []
    for cls in ast.walk(ast.parse(path.read_text())):
        if not isinstance(cls, ast.ClassDef):
            continue
        methods = {
            f.name
            for f in cls.body
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
        }

        for node in ast.walk(cls):
            if isinstance(node, ast.Call):
                f = node.func
                callee = f.id if isinstance(f, ast.Name) else ""
                if callee in lower and any(
                    _is_bound(a, methods) for a in [*node.args, *(k.value for k in node.keywords)]
                ):
                    out.append(
                        f"{path.relative_to(ROOT)}:{node.lineno} hands a method of {cls.name} to {callee}"
                    )
            elif isinstance(node, ast.Assign) and _is_bound(node.value, methods):
                for t in node.targets:
                    if isinstance(t, ast.Attribute) and not (
                        isinstance(t.value, ast.Name) and t.value.id == "self"
                    ):
                        out.append(
                            f"{path.relative_to(ROOT)}:{node.lineno} sets a method of {cls.name} on another object"
                        )
    return out


# Known, outside the engine and the cache: a decorator that receives the Searcher it wraps. Fix and
# remove; never add.
ANY_TYPED_KNOWN = {("treesearch/search/limits.py", "searcher")}


def test_no_upward_object_is_handed_down_typed_any():
    wrong = [
        f"{path}:{line} {name}: Any"
        for p in _modules()
        for path, line, name in _any_typed_upward(p)
        if (path, name) not in ANY_TYPED_KNOWN
    ]
    assert wrong == []


def test_no_method_is_handed_down_as_a_callback():
    wrong = [w for p in _modules() for w in _bound_methods_handed_down(p)]
    assert wrong == []


def test_no_private_name_is_imported_across_modules():
    wrong = [
        f"{p.relative_to(ROOT)}:{line} imports {n} from {t}"
        for p in _modules()
        for t, names, line in _imports(p)
        for n in names
        if n.startswith("_") and n != "__version__"
    ]
    assert wrong == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_package_file_is_a_monolith_of_over_600_lines(path):
    assert len(path.read_text().splitlines()) <= 600


def test_importing_the_search_api_loads_neither_strategies_nor_torch_nor_ray():
    code = (
        "import sys, treesearch\n"
        "from treesearch import RKSCConfig, Sampling, Searcher, Problem, ThoughtTree, SearchResult, ServerEngine\n"
        "import treesearch.runs.distributed, treesearch.cli.run, treesearch.cli.main\n"
        "print(sorted(m for m in ('strategies', 'torch', 'transformers', 'ray') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
