"""One search's view of an engine that several searches share (`solve_many`): a `Backend` with its
own `Stats` and its owners namespaced as (session id, node), so searches never release each
other's K/V and RSBCM ranks every block by its best owner's omega across the live searches.

A session's generate / score goes straight to the engine from the search's own thread, with
`stats=` the session's: the local engine's scheduler (`treesearch.engine.scheduler`) puts the rows
into its running batch and returns when they are done; a server backend sends them at once and
the server batches them. Everything else a search touches (tokens, owners) runs under the
engine's lock, between the scheduler's steps.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from treesearch.common.errors import SearchCancelled
from treesearch.common.stats import Stats


class Stop:
    """Shared by the sessions of one run: set once, every later call of theirs raises SearchCancelled."""

    def __init__(self) -> None:
        self.why: BaseException | None = None

    def check(self) -> None:
        if self.why is not None:
            raise SearchCancelled(str(self.why) or type(self.why).__name__)


class SearchSession:
    """One search's Backend over a shared engine (see the module docstring)."""

    _ids = itertools.count()

    def __init__(self, engine: Any, stop: Stop | None = None) -> None:
        self.engine = engine
        self.stop = stop or Stop()
        self.lock = getattr(engine, "lock", None) or threading.RLock()  # a server backend has none
        self.id = next(self._ids)
        self.name = engine.name
        self.num_layers = engine.num_layers
        self.features = engine.features
        self.config = getattr(engine, "config", None)
        with self.lock:
            begin = getattr(engine, "begin_search", None)
            self.stats: Stats = begin() if begin is not None else Stats()
        self.priority: Callable[[Hashable], float | None] | None = None
        self._owners: set = set()

    def generate(
        self,
        prompts: Sequence[str],
        sampling: Any = None,
        *,
        seeds: Sequence[int] | None = None,
        owners: Sequence[Hashable] | None = None,
    ) -> list:
        self.stop.check()
        return self.engine.generate(
            prompts,
            sampling,
            seeds=None if seeds is None else list(seeds),
            owners=self._own(owners),
            stats=self.stats,
        )

    def score(
        self,
        prompts: Sequence[str],
        labels: Sequence[str],
        *,
        owners: Sequence[Hashable] | None = None,
        exit_rule: Any = None,
    ) -> list:
        self.stop.check()
        return self.engine.score(
            prompts, list(labels), owners=self._own(owners), exit_rule=exit_rule, stats=self.stats
        )

    def _own(self, owners: Sequence[Hashable] | None) -> list | None:
        if owners is None:
            return None
        out = [None if o is None else (self.id, o) for o in owners]
        with self.lock:
            self._owners.update(o for o in out if o is not None)
        return out

    # -- everything else goes straight to the engine, under its lock ------------------------------
    def tokenize(self, text: str) -> list[int]:
        with self.lock:
            return self.engine.tokenize(text)

    def token_offsets(self, generation: Any) -> list[tuple[int, int]]:
        with self.lock:
            return self.engine.token_offsets(generation)

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        with self.lock:
            self.engine.remember_generation(prompt, prompt_ids, token_ids)

    def label_token_ids(self, labels: Sequence[str]) -> list[int]:
        with self.lock:
            return self.engine.label_token_ids(labels)

    @property
    def max_context(self) -> int | None:
        return getattr(self.engine, "max_context", None)

    def new_search(self) -> None:
        """A session serves one search: nothing to reset."""

    def set_priority(self, fn: Callable[[Hashable], float | None] | None) -> None:
        self.priority = fn

    def acquire(self, owner: Hashable, handle: Any) -> None:
        with self.lock:
            self._owners.add((self.id, owner))
            self.engine.acquire((self.id, owner), handle)

    def release(self, owner: Hashable) -> None:
        with self.lock:
            self.engine.release((self.id, owner))

    def pin_owner(self, owner: Hashable) -> None:
        with self.lock:
            self._owners.add((self.id, owner))
            self.engine.pin_owner((self.id, owner))

    def cancel(self, why: BaseException) -> None:
        """Stop this search's call in flight (the local engine drops its rows)."""
        scheduler = getattr(self.engine, "scheduler", None)
        if scheduler is not None:
            scheduler.cancel({id(self.stats)}, why)

    def close(self) -> None:
        """The search is over: release everything it holds (its blocks become free at once)."""
        with self.lock:
            for owner in self._owners:
                self.engine.release(owner)
            self._owners = set()
            end = getattr(self.engine, "end_search", None)
            if end is not None:
                end(self.stats)


def session_priority(sessions: dict[int, SearchSession]) -> Callable[[Hashable], float | None]:
    """The engine's RSBCM priority over namespaced owners: (session id, node) -> that session's
    omega of the node; anything else (a protected root prompt's key) is unscored."""

    def priority(owner: Hashable) -> float | None:
        if isinstance(owner, tuple) and len(owner) == 2 and owner[0] in sessions:
            fn = sessions[owner[0]].priority
            return None if fn is None else fn(owner[1])
        return None

    return priority
