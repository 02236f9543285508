"""The root prompts' pins on an engine that searches share (`solve_many`, `treesearch run`, a Ray
worker): each live search pins its root prompt, and a kept cache can split a root prompt over a
template's blocks and one of its own, so there a call can need more than its search alone. Before
such a call fails, the pins go: the prompts stay held, evictable and recomputed on demand
(lossless). A search alone on its own engine keeps its pin, as its least budget says."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

from treesearch.cache.manager import CacheManager, Row
from treesearch.common.errors import CacheBudgetError
from treesearch.engine.ledger import SearchLedger


class Shared(Protocol):
    """What the pins read: the cache and the searches that share it (an engine, its runner)."""

    cache: CacheManager
    searches: SearchLedger


def loosen_pins(shared: Shared) -> bool:
    """On a shared engine, unpin every root prompt; True if any was pinned."""
    return bool(shared.searches.shared() and shared.cache.drop_prompt_pins())


def must_store(cache: CacheManager, row: Row, owner: Hashable) -> bool:
    """Whether the row's prompt must stay cached now: it had to when the call was made, and its
    owner's prompt is still pinned (rows queued before `loosen_pins` keep the flag they had)."""
    return row.must_store and cache.prompt_pinned(owner)


def check_call_budget(shared: Shared, rows: list[Row], extra: int, *, rows_held: int) -> None:
    """`CacheManager.check_budget` of a call at submission (failing only while no admitted row
    holds K/V that could free: rows_held == 0), once more after `loosen_pins` before it fails."""
    fail = not rows_held
    try:
        shared.cache.check_budget(rows, extra, fail=fail)
    except CacheBudgetError:
        if not loosen_pins(shared):
            raise
        for r in rows:
            r.must_store = False  # no prompt is pinned any more
        shared.cache.check_budget(rows, extra, fail=fail)
