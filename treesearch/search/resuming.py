"""What `Searcher.resume` needs besides the strategy's replay: the settings a saved search must
share with the Searcher that continues it, a copy of its tree without KV handles, and the
tokenization memory a fresh engine is given so the resumed search equals an uninterrupted one."""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from treesearch.backends.protocol import Backend
from treesearch.common.errors import ResumeError
from treesearch.core.problem import Problem
from treesearch.core.tree import ThoughtTree


def describe(obj: Any) -> Any:
    """A JSON-able description of a dataclass's settings (else its class name), for resume checks."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return json.loads(json.dumps(dataclasses.asdict(obj), default=repr))
    return type(obj).__name__


def search_settings(problem: Problem, strategy: Any, sampling: Any, seed: int) -> dict[str, Any]:
    """The settings recorded in tree.meta that a resumed search must match."""
    return {
        "problem": problem.name,
        "seed": seed,
        "strategy": type(strategy).__name__,
        "strategy_config": describe(strategy),
        "sampling": describe(sampling),
    }


def check_resumable(tree: ThoughtTree, mine: dict[str, Any]) -> None:
    """ResumeError naming the first setting of the saved search that differs from `mine`."""
    m = tree.meta
    for key, value in mine.items():
        if key in m and m[key] != value:
            raise ResumeError(
                f"the saved search has {key}={m[key]!r} but this Searcher has {value!r}; build the "
                f"Searcher with the saved search's {key} to continue it"
            )


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
