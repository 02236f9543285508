"""Context limits inside a search: a node whose prompt cannot fit in the model's context window is
marked on the tree and left out of the batch, so one branch that grew too long never stops the
search (and never reaches torch with positions past the model's maximum).

Policy, checked before any model work with the engine's own tokenization:
- expand: prompt tokens + sampling.max_new_tokens > lm.max_context -> the node gets no children:
  node["context_overflow"] = True, node["empty_expansion"] = True, status "pruned".
- evaluate (LM-valued nodes only): value-prompt tokens > lm.max_context -> node["context_overflow"]
  = True, status "pruned", and its score is the lowest label weight clipped into value_range (the
  value of a verifier certain the branch is worst), so strategies rank it last without NaN or inf.
A backend with `max_context = None` (a server whose context is unknown) is not checked here: the
server refuses what does not fit (`treesearch.common.errors.ServerContextError`).
A direct `Engine.generate` / `Engine.score` call with a prompt that does not fit still raises
`ContextTooLongError` (the engine checks every batch before running it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


def within_context(kind: str) -> Callable:
    """Decorate `Searcher.expand` (kind "expand") or `Searcher.evaluate` ("evaluate") so that the
    nodes whose prompts cannot fit are handled by the policy above and the rest run as usual."""
    if kind not in ("expand", "evaluate"):
        raise ValueError(f"kind={kind!r}; use 'expand' or 'evaluate'")

    def wrap(op: Callable) -> Callable:
        @functools.wraps(op)
        def guarded(searcher: Any, nodes: list[int]) -> list:
            nodes = list(nodes)
            over = set(_overflowing(searcher, nodes, kind))
            if not over:
                return op(searcher, nodes)
            fits = [n for n in nodes if n not in over]
            done = dict(zip(fits, op(searcher, fits))) if fits else {}
            for n in over:
                d = searcher.tree.node(n)
                d["context_overflow"] = True
                searcher.tree.set_status(n, "pruned")
                if kind == "expand":
                    d["empty_expansion"] = True
                    done[n] = []
                else:
                    d["score"] = done[n] = floor_value(searcher.problem)
            return [done[n] for n in nodes]

        return guarded

    return wrap


def floor_value(problem: Any) -> float:
    """The score of a node whose value prompt does not fit: the lowest label weight, clipped into
    the problem's value_range."""
    lo, hi = problem.value_range
    weights = [float(w) for w in (problem.labels or {}).values()]
    v = min(weights) if weights else lo
    return float(min(max(v, lo), hi))


def _overflowing(searcher: Any, nodes: list[int], kind: str) -> list[int]:
    p, engine = searcher.problem, searcher.engine
    limit = max_context(engine)
    if limit is None:
        return []
    out = []
    for n in nodes:
        state = searcher.tree.node(n)["state"]
        if kind == "expand":
            prompt, extra = p.expand_prompt(state), searcher.sampling.max_new_tokens
        else:
            if p.value(state) is not None:
                continue
            prompt, extra = p.value_prompt(state), 0
        if isinstance(prompt, str) and prompt and len(engine.tokenize(prompt)) + extra > limit:
            out.append(n)
    return out


def max_context(engine: Any) -> int | None:
    """The context window the search checks prompts against: a backend's `max_context` where it
    declares one (a server: given by the user, None = the server checks), else the local engine's
    model's."""
    if hasattr(engine, "max_context"):
        return engine.max_context
    return engine.lm.max_context
