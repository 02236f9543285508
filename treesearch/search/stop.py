"""Why a search stopped where it did: `StopReason` (a stable code and a sentence), read off the
finished tree by `diagnose`, so no strategy has to report it.

A search *ran to its end* (`SearchResult.stop_reason` is None) when its tree holds a finished
branch (an unpruned terminal node) or an unpruned node left unexpanded at the depth limit (the
strategy's `max_depth`, else the problem's). Otherwise every branch ended before either, and the
code says why, the first that applies:
- "budget": the strategy stopped with states still unexplored (DFS's `max_states`, MCTS's `iterations`);
- "context_full": a prompt did not fit the model's context window (`treesearch.search.limits`);
- "no_children": an expansion gave no children (the model generated nothing, or nothing parsed);
- "all_pruned": every other branch was pruned (e.g. by DFS's `threshold`).
A search that an exception stopped (status "interrupted" / "failed") gets a code from the
exception's type: "cache_budget" (CacheBudgetError), "context_full" (ContextTooLongError,
ServerContextError), "interrupted" (Ctrl-C, a stopped run), else "error"; an input solve_many
refused (status "invalid") gets "invalid_input".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from treesearch.core.tree import ThoughtTree

EARLY = ("budget", "context_full", "no_children", "all_pruned")  # the search ended early
STOPPED = ("cache_budget", "context_full", "interrupted", "error", "invalid_input")  # by an exception
CODES = tuple(dict.fromkeys(EARLY + STOPPED))  # every code a StopReason may carry
ERROR_CODES = {
    "CacheBudgetError": "cache_budget",
    "ContextTooLongError": "context_full",
    "ServerContextError": "context_full",
    "KeyboardInterrupt": "interrupted",
    "SearchCancelled": "interrupted",
}
BUDGETS = ("max_states", "iterations")  # strategy settings that bound its work


@dataclass(frozen=True)
class StopReason:
    """Why a search ended early: `code` (one of the codes above; stable, for programs) and
    `message` (a sentence naming what happened, for people)."""

    code: str
    message: str

    def __str__(self) -> str:
        from treesearch.viz.notes import stop_line

        return stop_line(self.to_json()) or self.code

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}

    @classmethod
    def from_json(cls, data: Any) -> StopReason | None:
        """The saved reason; None for a file written before stop reasons or a search that ran to its end."""
        if not isinstance(data, dict) or not isinstance(data.get("code"), str):
            return None
        return cls(data["code"], str(data.get("message", "")))


def stopped_by(status: str, error: str | None) -> StopReason:
    """The reason of a search that did not finish: `error` is "ExceptionType: message"."""
    error = (error or "an unknown error").rstrip(": ")  # "KeyboardInterrupt: " -> "KeyboardInterrupt"
    if status == "invalid":
        return StopReason("invalid_input", f"the input was refused: {error}")
    return StopReason(ERROR_CODES.get(error.partition(":")[0], "error"), f"the search stopped on {error}")


def depth_limit(strategy: Any, max_depth: int) -> int:
    """The depth a strategy searches to: its own `max_depth` when set, else the problem's."""
    own = getattr(strategy, "max_depth", None)
    return own if isinstance(own, int) and not isinstance(own, bool) else max_depth


def diagnose(tree: ThoughtTree, limit: int, strategy: Any = None) -> StopReason | None:
    """None when the search ran to its end (see the module docstring), else why it did not."""
    if not len(tree):
        return None
    open_, overflow, empty, pruned, silent = [], [], [], [], True
    for n in sorted(tree.graph):
        d = tree.node(n)
        expanded = "empty_expansion" in d
        if d["status"] != "pruned" and (d.get("terminal") or (d["depth"] >= limit and not expanded)):
            return None  # a finished branch, or one the depth limit stopped
        if tree.children(n):
            continue
        if d.get("context_overflow"):
            overflow.append(n)
        elif expanded:
            empty.append(n)
            silent = silent and not any(d.get("generations") or [])
        elif d["status"] == "pruned":
            pruned.append(n)
        else:
            open_.append(n)
    head = f"no branch reached an answer or the depth limit ({limit})"
    if open_:
        name = type(strategy).__name__ if strategy is not None else "the strategy"
        spent = ", ".join(f"{k}={getattr(strategy, k)}" for k in BUDGETS if hasattr(strategy, k))
        budget = f" when its budget ({spent}) was spent" if spent else ""
        left = _n(len(open_), "state")
        return StopReason("budget", f"{head}; {name} stopped{budget} with {left} unexplored")
    why = (
        "the model generated no text: check expand_prompt and the sampling's stop strings"
        if silent
        else "the generated text parsed to no new state"
    )
    parts = [
        (overflow, "context_full", f"{_n(len(overflow), 'prompt')} did not fit the model's context window"),
        (empty, "no_children", f"{_n(len(empty), 'expansion')} gave no children ({why})"),
        (pruned, "all_pruned", f"{_n(len(pruned), 'branch was', 'branches were')} pruned"),
    ]
    present = [(code, text) for nodes, code, text in parts if nodes]
    if not present:  # every leaf is finished or at the limit: handled above; kept for odd hand-made trees
        return None
    return StopReason(present[0][0], f"{head}; " + ", ".join(text for _, text in present))


def _n(k: int, word: str, plural: str | None = None) -> str:
    return f"{k} {word if k == 1 else plural or word + 's'}"
