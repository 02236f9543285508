"""The searches an engine serves: per search its `Stats`, a key (the cache keeps prompt counts
per key) and the distinct token contexts it ran (`Stats.unique_tokens`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from treesearch.common.stats import Stats
from treesearch.engine.tokens import TokenTrie


@dataclass
class _Search:
    stats: Stats
    key: int
    unique: TokenTrie = field(default_factory=TokenTrie)
    shared: bool = False  # begun with `begin`: one of the searches sharing the engine


class SearchLedger:
    """Searches by their Stats object (held here, so its id stays unique while the search lives)."""

    def __init__(self) -> None:
        self._serial = itertools.count()
        self._by_stats: dict[int, _Search] = {}

    def begin(self) -> Stats:
        stats = Stats()
        self._get(stats).shared = True
        return stats

    def end(self, stats: Stats) -> int | None:
        """Forget the search counted in stats; returns its key (None if it never ran)."""
        done = self._by_stats.pop(id(stats), None)
        return None if done is None else done.key

    def key(self, stats: Stats) -> int:
        return self._get(stats).key

    def live_keys(self) -> set[int]:
        return {s.key for s in self._by_stats.values()}

    def shared(self) -> bool:
        """Whether a live search shares the engine (solve_many, `treesearch run`, a Ray worker)."""
        return any(s.shared for s in self._by_stats.values())

    def saw(self, stats: Stats, ids: Sequence[int]) -> None:
        """The search ran the model over the context ids."""
        self._get(stats).unique.add(ids)

    def unique(self, stats: Stats) -> int:
        return self._get(stats).unique.size

    def _get(self, stats: Stats) -> _Search:
        found = self._by_stats.get(id(stats))
        if found is None:
            found = self._by_stats[id(stats)] = _Search(stats, next(self._serial))
        return found
