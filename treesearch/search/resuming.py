"""What `Searcher.resume` needs besides the strategy's replay: the settings a saved search must
share with the Searcher that continues it, a copy of its tree without KV handles, and the
tokenization memory a fresh engine is given so the resumed search equals an uninterrupted one."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

from treesearch.backends.protocol import Backend
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import ResumeError
from treesearch.core.problem import Problem
from treesearch.core.tree import ThoughtTree


def describe(obj: Any) -> Any:
    """A JSON-able description of a dataclass's settings (else its class name), for resume checks."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return json.loads(json.dumps(dataclasses.asdict(obj), default=repr))
    return type(obj).__name__


def model_settings(model: Any) -> dict[str, Any]:
    """The model a search runs on, as a resume compares it: its name and, for a local model, the
    dtype its weights compute in (another dtype writes other tokens)."""
    out: dict[str, Any] = {"model": getattr(model, "name", type(model).__name__)}
    dtype = getattr(model, "dtype", None) if hasattr(model, "model") else None  # a LanguageModel
    if dtype is not None:
        out["dtype"] = str(dtype).removeprefix("torch.")
    return out


def config_settings(config: RKSCConfig) -> dict[str, Any]:
    """The RKSC settings that change what a search finds: the KV sharing mode (with ASKS's gate)
    and CGEE (with its thresholds). The cache budget, eviction order, block size, step tokens and
    fast decode are left out: they change when K/V is computed, never a result (the lossless
    invariants), so a search may be resumed under another budget."""
    out: dict[str, Any] = {"kv_sharing": config.kv_sharing}
    if config.kv_sharing == "asks":
        out["asks_gate"] = {"asks_alpha": config.asks_alpha, "asks_tau": config.asks_tau}
    out["cgee"] = "on" if config.cgee else "off"
    if config.cgee:
        out["cgee_thresholds"] = {
            k: getattr(config, k) for k in ("tau_conf", "margin", "theta", "eps", "min_layer")
        }
    return out


def search_settings(
    problem: Problem, strategy: Any, sampling: Any, seed: int, config: RKSCConfig | None = None
) -> dict[str, Any]:
    """The settings recorded in tree.meta that a resumed search must match (with the model's,
    `model_settings`, and the input)."""
    out = {
        "problem": problem.name,
        "max_depth": problem.max_depth,
        "samples_per_expand": problem.samples_per_expand,
        "seed": seed,
        "strategy": type(strategy).__name__,
        "strategy_config": describe(strategy),
        "sampling": describe(sampling),
    }
    if config is not None:
        out.update(config_settings(config))
    return out


# settings whose values give the same search: exact sharing is lossless, so "off" and "exact" agree
_SAME = {"kv_sharing": {"off": "exact"}}


def mismatch(meta: dict[str, Any], mine: dict[str, Any]) -> tuple[str, Any, Any] | None:
    """The first setting of `mine` that the saved search (its tree.meta) recorded with another
    value, as (name, saved value, mine); of two dicts, the first field that differs, named
    "key.field". None when all agree. A key the file lacks (an older file) is not compared."""
    for key, value in mine.items():
        if key not in meta:
            continue
        saved = meta[key]
        if isinstance(saved, dict) and isinstance(value, dict):
            for field in list(value) + [f for f in saved if f not in value]:
                if plain(saved.get(field)) != plain(value.get(field)):
                    return f"{key}.{field}", saved.get(field), value.get(field)
            continue
        same = _SAME.get(key, {})
        if plain(same.get(saved, saved)) != plain(same.get(value, value)):
            return key, saved, value
    return None


def saved_search(
    saved: Any, problem: Problem, mine: dict[str, Any], x: Any = None
) -> tuple[ThoughtTree, dict | None]:
    """The tree of a saved search (a SearchResult, its tree, or a file `SearchResult.save` wrote)
    and its stats, once its settings agree with `mine` (a file's before `problem` rebuilds its
    states) and, when x is given, its input is x; ResumeError naming the first that differs."""
    from treesearch.search.result import SearchResult

    if isinstance(saved, (str, Path)):
        from treesearch.search.persist import load_payload

        meta = load_payload(saved)["tree"].get("graph")
        check_resumable(meta if isinstance(meta, dict) else {}, mine)
        saved = SearchResult.load(saved, problem)
    prev = saved.stats if isinstance(saved, SearchResult) else None
    tree = saved.tree if isinstance(saved, SearchResult) else saved
    if not isinstance(tree, ThoughtTree) or not len(tree):
        raise ResumeError(
            f"resume needs a SearchResult, a ThoughtTree with a root or a saved file; got {saved!r:.60}"
        )
    check_resumable(tree.meta, mine)
    if x is not None and not same_input(problem, x, tree):
        raise ResumeError(
            f"the saved search has input={tree.meta.get('input')!r} but this resume was given "
            f"{str(x)!r}; resume without an input to continue the saved one, or solve({str(x)!r}) "
            "for a new search"
        )
    return tree, prev


def check_resumable(meta: dict[str, Any], mine: dict[str, Any]) -> None:
    """ResumeError naming the first setting of the saved search (its tree.meta) that differs from `mine`."""
    found = mismatch(meta, mine)
    if found is not None:
        key, saved, value = found
        raise ResumeError(
            f"the saved search has {key}={saved!r} but this Searcher has {value!r}; build the "
            f"Searcher with the saved search's {key} to continue it"
        )


def same_input(problem: Problem, x: Any, tree: ThoughtTree) -> bool:
    """True when input x starts the saved search: the same text, or a root state whose saved
    form (`state_to_json`) equals that of x's initial state ("4 5 6 10" and "4, 5, 6, 10" agree)."""
    meta = tree.meta
    if str(x) == meta.get("input") and type(x).__name__ == meta.get("input_type", type(x).__name__):
        return True
    root = tree.node(tree.root)["state"]
    try:
        return plain(problem.state_to_json(problem.initial_state(x))) == plain(problem.state_to_json(root))
    except Exception:  # a state that cannot be saved: compare the states themselves
        return bool(problem.initial_state(x) == root)


def plain(data: Any) -> Any:
    """JSON data as a file gives it back (tuples are lists), for comparing saved forms."""
    return json.loads(json.dumps(data, default=repr, allow_nan=True))


def fresh_copy(tree: ThoughtTree) -> ThoughtTree:
    """A deep copy of a tree without KV handles (they belong to the engine that made them)."""
    out = ThoughtTree()
    out.meta = copy.deepcopy(tree.meta)
    for n, d in tree.graph.nodes(data=True):
        attrs = copy.deepcopy({k: v for k, v in d.items() if k != "kv"})
        out.graph.add_node(n, kv=None, **attrs)
    for u, v, e in tree.graph.edges(data=True):
        out.graph.add_edge(u, v, **copy.deepcopy(e))
    return out


def prime_tokens(engine: Backend, problem: Problem, tree: ThoughtTree) -> None:
    """Give a fresh engine the tokenization memory of the search so far: each expanded node's
    prompt, then its generations' token ids, in node-id order (a parent before its children).
    Chain-style prompts extend a parent's prompt + generation and must keep the generated ids,
    not a re-tokenization of their text, for a resumed search to equal an uninterrupted one."""
    for n in sorted(tree.graph):
        d = tree.node(n)
        if not any(d.get("generation_ids") or []):  # none, or a server's (no ids): nothing to remember
            continue
        prompt = problem.expand_prompt(d["state"])
        if not isinstance(prompt, str) or not prompt:
            continue
        ids = engine.tokenize(prompt)
        for gen in d["generation_ids"]:
            engine.remember_generation(prompt, ids, gen)
