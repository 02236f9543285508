"""The architecture's arrows, checked on the source: every project import points down a layer
(docs/architecture.md), no private name crosses a module, no package file grows past 450 lines,
and `import treesearch` needs neither strategies nor torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Lower number = lower layer. A module may import only modules of a lower layer, or of its own
# package at the same layer (bench.*, viz.*, tasks.*, strategies.*). See docs/architecture.md.
LAYERS: dict[str, int] = {
    # 0: leaves
    "errors": 0, "seeds": 0, "atomicfile": 0, "limits": 0, "stats": 0, "viz": 0, "eos": 0, "rsbcm": 0,
    # 1: data structures with no model
    "config": 1, "cluster": 1, "tokens": 1, "kvstore": 1, "attention": 1, "persist": 1, "backend": 1,
    # 2: the loaded model's wrapper and the pure policy rules
    "model": 2, "cgee": 2, "searches": 2, "decoder": 2,
    # 3: below the engine: the forward pass and the cache manager
    "forward": 3, "kvcache": 3,
    # 4: policies that run model work through the cache manager
    "asks": 4, "labels": 4,
    # 3-4: model loading (dummy-weight models; runtime dispatches to them)
    "dummy": 3, "runtime": 4,
    # 5: the local engine; many searches' calls merged (over any engine)
    "engine": 5, "server": 5, "server_http": 4, "batching": 5,
    # 6: the thought tree and the problem contract
    "tree": 6, "problem": 6,
    # 7: the built-in problems and the verifier (CGEE over a backend)
    "tasks": 7, "verify": 7, "ops": 7, "result": 7, "arguments": 7, "many": 7,
    # 8: the search
    "searcher": 8,
    # 9 and up: strategies and the tools on top
    "strategies": 9, "backend_cli": 9, "runs": 9, "ray_worker": 9, "distributed": 10, "bench": 10, "calibration_sets": 10, "calibrate": 11,
    "preflight": 11, "loading": 12, "search_flags": 12, "run_cli": 13, "cli": 14, "__main__": 15,
}
# The one upward arrow: the Searcher's default strategy (BFS), imported where it is used.
ALLOWED_UP = {("searcher", "strategies"),
              ("arguments", "strategies")}  # and a strategy name given for an object: the error names the class
# What strategies must never reach for: the model, the tokenizer, the cache.
STRATEGY_FORBIDDEN = {"engine", "kvcache", "kvstore", "forward", "attention", "runtime", "tokens", "asks"}


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
                base = pkg.split(".")[:len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] in ("treesearch", "strategies"):
                out.append((target, [a.name for a in node.names], node.lineno))
        elif isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names if a.name.split(".")[0] in ("treesearch", "strategies")]
    return out


def _key(module: str) -> str | None:
    """The LAYERS key of a module: strategies.*, else the first part under treesearch."""
    parts = module.split(".")
    if parts[0] == "strategies":
        return "strategies"
    return parts[1] if len(parts) > 1 else None


def _resolve(target: str, names: list[str]) -> list[str]:
    """`from treesearch import engine` imports the module treesearch.engine."""
    if target == "treesearch":
        return [f"treesearch.{n}" for n in names]
    return [target]


def test_every_module_has_a_layer():
    missing = sorted({_key(_name(p)) for p in _modules()} - set(LAYERS) - {None})
    assert missing == [], f"add these modules to LAYERS (and docs/architecture.md): {missing}"


def test_imports_point_down_the_layers():
    wrong = []
    for path in _modules():
        mine = _key(_name(path))
        if mine is None:
            continue
        for target, names, line in _imports(path):
            for dep in _resolve(target, names):
                theirs = _key(dep)
                if theirs is None or theirs == mine or (mine, theirs) in ALLOWED_UP:
                    continue
                if LAYERS[theirs] >= LAYERS[mine]:
                    wrong.append(f"{path.relative_to(ROOT)}:{line} {mine} (layer {LAYERS[mine]}) imports "
                                 f"{theirs} (layer {LAYERS[theirs]})")
    assert wrong == []


def test_strategies_reach_no_model_tokenizer_or_cache():
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {t}" for p in (ROOT / "strategies").glob("*.py")
             for t, names, line in _imports(p) for dep in _resolve(t, names) if _key(dep) in STRATEGY_FORBIDDEN]
    assert wrong == []


def test_the_store_and_attention_know_nothing_above_them():
    deps = {m: {_key(d) for t, n, _ in _imports(ROOT / "treesearch" / f"{m}.py") for d in _resolve(t, n)}
            for m in ("kvstore", "attention", "tokens", "forward", "kvcache")}
    assert deps["kvstore"] <= {"errors", "rsbcm"}  # rsbcm: the default LRU key, a leaf
    assert deps["attention"] == set()
    assert deps["tokens"] <= {"errors"}
    assert not deps["forward"] & {"kvstore", "kvcache", "engine", "asks", "cgee", "tree", "searcher"}
    assert not deps["kvcache"] & {"engine", "forward", "asks", "cgee", "tree", "searcher"}


def test_no_private_name_is_imported_across_modules():
    wrong = [f"{p.relative_to(ROOT)}:{line} imports {n} from {t}" for p in _modules()
             for t, names, line in _imports(p) for n in names if n.startswith("_") and n != "__version__"]
    assert wrong == []


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_package_file_is_over_450_lines(path):
    assert len(path.read_text().splitlines()) <= 450


def test_importing_treesearch_loads_neither_strategies_nor_torch_nor_ray():
    code = ("import sys, treesearch\n"
            "from treesearch import RKSCConfig, Sampling\n"
            "import treesearch.distributed, treesearch.run_cli  # Ray is imported only when a run uses it\n"
            "print(sorted(m for m in ('strategies', 'torch', 'transformers', 'ray') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
