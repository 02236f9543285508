"""States as JSON: the default `Problem.state_to_json` / `state_from_json` encoding, and the check
that a problem's states survive a save, so a resumed search sees the states it saved.

The default encoding keeps JSON's own types as they are (str, int, float, bool, None, list, dict
with str keys) and writes the Python containers JSON lacks as tagged objects, so they load back as
what they were:

    (1, 2)          -> {"__tuple__": [1, 2]}
    {"b", "a"}      -> {"__set__": ["a", "b"]}          (elements in a fixed order)
    frozenset({1})  -> {"__frozenset__": [1]}
    {1: "x"}        -> {"__items__": [[1, "x"]]}        (a dict with a key that is not a str)
    {"__set__": 1}  -> {"__dict__": {"__set__": 1}}     (a dict that would read as a tag)

Anything else (a dataclass, a custom class) is refused: the problem defines its own pair.
"""

from __future__ import annotations

import json
from typing import Any

TAGS = ("__tuple__", "__set__", "__frozenset__", "__items__", "__dict__")


class NotJSON(TypeError):
    """A value the default encoding cannot write; `value` is the offending part of the state."""

    def __init__(self, value: Any) -> None:
        super().__init__(f"Object of type {type(value).__name__} is not JSON serializable")
        self.value = value


def encode(state: Any) -> Any:
    """The state as JSON data, containers JSON lacks tagged (module docstring); NotJSON otherwise."""
    if state is None or isinstance(state, (str, bool, int, float)):
        return state
    if isinstance(state, list):
        return [encode(v) for v in state]
    if isinstance(state, tuple):
        return {"__tuple__": [encode(v) for v in state]}
    if isinstance(state, (set, frozenset)):
        items = sorted((encode(v) for v in state), key=_order)
        return {("__set__" if isinstance(state, set) else "__frozenset__"): items}
    if isinstance(state, dict):
        if not all(isinstance(k, str) for k in state):
            return {"__items__": sorted(([encode(k), encode(v)] for k, v in state.items()), key=_order)}
        plain = {k: encode(v) for k, v in state.items()}
        return {"__dict__": plain} if len(plain) == 1 and next(iter(plain)) in TAGS else plain
    raise NotJSON(state)


def decode(data: Any) -> Any:
    """The state `encode` wrote (JSON data of an older file, with no tags, comes back as it is)."""
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        tag, value = next(iter(data.items()))
        if tag == "__tuple__" and isinstance(value, list):
            return tuple(decode(v) for v in value)
        if tag == "__set__" and isinstance(value, list):
            return {decode(v) for v in value}
        if tag == "__frozenset__" and isinstance(value, list):
            return frozenset(decode(v) for v in value)
        if tag == "__items__" and isinstance(value, list):
            return {decode(k): decode(v) for k, v in value}
        if tag == "__dict__" and isinstance(value, dict):
            return {k: decode(v) for k, v in value.items()}
    return {k: decode(v) for k, v in data.items()}


def _order(item: Any) -> str:
    """A fixed order for a set's elements of any JSON type: their canonical JSON text."""
    return json.dumps(item, sort_keys=True, allow_nan=True)


def as_saved(data: Any) -> Any:
    """JSON data as a saved file gives it back (tuples become lists, non-JSON values their repr):
    what `treesearch.search.persist.save_payload` writes."""
    return json.loads(json.dumps(data, default=repr, allow_nan=True))


def round_trip_error(problem: Any, nid: int, state: Any, saved: Any) -> str | None:
    """Why node `nid`'s state does not come back from its saved form `saved` (state_to_json's data)
    as itself, in one line naming the state and the two methods; None when it does."""
    cls = type(problem).__name__
    fix = (
        f"define {cls}.state_to_json(state) and {cls}.state_from_json(data) so that "
        f"state_from_json(state_to_json(state)) == state, or the resumed search would see another state"
    )
    try:
        back = problem.state_from_json(as_saved(saved))
    except Exception as exc:
        return (
            f"{cls}: the state of node {nid}, {state!r:.80}, cannot be rebuilt from its saved form "
            f"{as_saved(saved)!r:.80} ({type(exc).__name__}: {exc}); {fix}"
        )
    if type(back) is type(state) and back == state:
        return None
    return (
        f"{cls}: the state of node {nid}, {state!r:.80}, comes back from the saved file as "
        f"{back!r:.80}; {fix}"
    )
