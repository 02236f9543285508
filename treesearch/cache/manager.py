"""The cache manager: what K/V is resident in the store, and why.

It alone reads the store's budget and segments. For each engine call it plans the rows: each
row's longest cached prefix (`lookup`) and what one row needs under a budget (`need_bytes`,
`check_budget`). After the engine's forwards it stores the K/V they computed (`store_kv`).
It keeps owners (thought-tree nodes holding contexts; root prompts in RSBCM's protected tier),
the reference counts of what the running step reads, and counts,
per search, the prompt contexts that ran through each segment, so that when a search ends the
cache keeps what its prompts and the live searches' prompts use (few-shot templates) and forgets
the rest (`end_search`).

Budget rules (see `treesearch.cache.kvstore` and `treesearch.policies.rsbcm`): the budget bounds all
K/V, running rows' open segments and the decode step's buffer included (`KVStore.open_rows`: a
step's K/V is allocated, all or none, while the step is planned). A call first checks that the
budget can hold any one row's context and buffer, and a root prompt's blocks with it (else
`CacheBudgetError` naming the minimum, before any forward); then each batch asks the store for its
rows' own K/V (open segments, `KVStore.open_rows`), and a batch the store refuses is split (a row
waits for room, which finished rows and eviction make). The K/V a call computes in passing (new
prompt tokens, generated tokens) is optional: it is kept, whole or its first blocks, only in room
that displaces nothing owned; what does not fit is kept as tokens, recomputed if ever needed
(`stats.recomputed_tokens`). Results never depend on the budget.

This module runs no model and calls nothing above it: the engine computes K/V (evicted segments
made resident again, runs several rows share: `treesearch.engine.runner`) and hands it down.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from treesearch.cache.attention import Prefix
from treesearch.cache.kvstore import Chain, KVStore, Segment
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import CacheBudgetError
from treesearch.common.stats import Stats, distinct
from treesearch.policies.rsbcm import UNSCORED, LRUPolicy, Priority, RootPrompt, RSBCMPolicy

Handle = tuple[Segment, int]  # a context end in the KV store: (segment, used tokens)


@dataclass
class Row:
    """One prompt of an engine call, as the cache plans it."""

    ids: list[int]
    chain: Chain = field(default_factory=list)  # cached (segment, used) pairs it attends over
    matched: int = 0  # tokens served from the cache (the chain's length)
    asks_ref: int | None = None  # row (in this batch) whose K/V this row attached to
    asks_sigma: float | None = None
    prepass: int = 0  # of `matched`, tokens ASKS's pre-pass computed for it a step before: not reused
    bare: bool = False  # attend over no cached prefix: compute the whole prompt (a budget too small for both)
    cut: int = 0  # cached tokens a bare row computes again (counted as recomputed)
    must_store: bool = False  # its prompt's K/V must be cached (a protected owner's, e.g. the root's)
    stats: Stats | None = None  # where the work done for this row is counted (its search's)
    search: Hashable = None  # the search it belongs to (its prompt counts are kept per search)
    held: list[Chain] = field(default_factory=list)  # pinned for it while it waits a step (ASKS's pre-pass)


def bare_copy(r: Row) -> Row:
    """The row computed without its cached prefix (what a budget too small for both runs)."""
    return Row(ids=r.ids, bare=True, cut=r.matched, must_store=r.must_store, stats=r.stats, search=r.search)


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


class CacheManager:
    """Owns the KV store of one engine: planning, residency, owners, pins and the budget."""

    def __init__(
        self,
        bytes_per_token: int,
        config: RKSCConfig,
        stats: Stats,
        *,
        share_min_tokens: int = 8,
    ) -> None:
        self.config = config
        self.stats = stats
        self.share_min_tokens = share_min_tokens
        self.policy = RSBCMPolicy()
        order = self.policy if config.eviction == "omega" else LRUPolicy()
        self.store = KVStore(bytes_per_token, config.block_size, budget=config.cache_budget, policy=order)
        self._call_pins: list[Chain] = []  # chains read in the running step (their reference counts)
        self._protected: set = set()  # owners whose prompts are held by RootPrompt(owner) (`protect`)
        self._prompt_hits: dict[int, set] = {}  # segment id -> searches whose prompt contexts ran through it
        self._evicted_seen = 0  # store.evicted_blocks already counted in some Stats

    # -- owners and priority (RSBCM) ----------------------------------------------------------------
    def set_priority(self, fn: Priority | None) -> None:
        """Install owner -> omega (see `treesearch.policies.rsbcm`)."""
        self.policy.priority = fn

    def owner_omega(self, owner: Hashable) -> float:
        """The owner's omega (UNSCORED for None or an owner not scored yet)."""
        return UNSCORED if owner is None else self.policy.owner_omega(owner)

    def acquire(self, owner: Hashable, handle: Handle | None) -> None:
        """`owner` holds the K/V of the context ending at `handle` (no-op for None)."""
        if handle is not None:
            self.store.acquire(owner, handle)

    def release(self, owner: Hashable) -> None:
        """`owner` lets go of every context it holds; blocks no one holds become free (evicted first)."""
        self.store.release(owner)
        if owner in self._protected:
            self._protected.discard(owner)
            self.store.release(RootPrompt(owner))

    def protect(self, owner: Hashable) -> None:
        """The prompts of this owner's calls (the root node's) must be cached when computed and go
        in RSBCM's protected tier (evicted after everything else) until `release(owner)`."""
        self._protected.add(owner)

    def protected(self, owner: Hashable | None) -> bool:
        return owner is not None and owner in self._protected

    def new_search(self, last: Hashable = None) -> None:
        """Between searches run one after another: release every owner, keep only the K/V that
        the last search's prompt contexts ran through, and start the counters afresh."""
        for owner in self.store.owners():
            self.store.release(owner)
        self._protected.clear()
        self.end_search(last, live=set())
        self.store.reset_counters()
        self._evicted_seen = 0

    def end_search(self, key: Hashable, live: set) -> None:
        """Search `key` has ended and released its owners: forget the segments that no owner
        holds and that no prompt of it or of a `live` search ran through. So the cache holds the
        live searches' contexts plus the prompts (templates) of the search that ended last."""
        keep = set(live) | {key}
        hits = self._prompt_hits
        self.store.forget_unused(lambda seg: bool(hits.get(seg.id, set()) & keep))
        self._prompt_hits = {i: k & keep for i, k in hits.items() if i in self.store.segments and k & keep}

    def count_prompt(self, end: Handle, search: Hashable = None) -> None:
        """One more prompt context of `search` ran through the segments ending at `end`."""
        seg, used = end
        for s, _ in seg.context_chain(used):
            self._prompt_hits.setdefault(s.id, set()).add(search)

    def hold_prompt(self, end: Handle, owner: Hashable) -> None:
        """A protected owner's prompt context ending at `end` joins the protected tier."""
        if owner in self._protected:
            self.store.acquire(RootPrompt(owner), end)

    def tag_owners(self, handles: list[Handle | None], owners: list[Any] | None) -> None:
        for handle, owner in zip(handles, owners or []):
            if handle is not None and owner is not None:
                self.store.acquire(owner, handle)

    # -- pins of the running call ---------------------------------------------------------------------
    def pin(self, chain: Chain) -> None:
        self.store.pin(chain)
        self._call_pins.append(chain)

    def end_call(self, charge: Stats | None = None) -> None:
        """Unpin everything the call pinned; the blocks it evicted are counted in charge."""
        for chain in self._call_pins:
            self.store.unpin(chain)
        self._call_pins = []
        (charge or self.stats).evicted_blocks += self.store.evicted_blocks - self._evicted_seen
        self._evicted_seen = self.store.evicted_blocks

    @staticmethod
    def prefix(chain: Chain) -> Prefix:
        """The K/V tensors a row attends over (its chain must be resident)."""
        return [(seg.kv, used) for seg, used in chain]

    def reserve(self, nbytes: int) -> None:
        """Count a running batch's own K/V buffer against the budget (evicting to make room)."""
        self.store.reserve(nbytes)

    def unreserve(self, nbytes: int) -> None:
        self.store.unreserve(nbytes)

    def report_peak(self, charge: Sequence[Stats]) -> None:
        """Each search's peaks: all K/V at once (cache + batch buffers) and the cache alone."""
        for st in distinct(charge):
            st.peak_kv_bytes = max(st.peak_kv_bytes, self.store.peak_bytes)
            st.peak_store_bytes = max(st.peak_store_bytes, self.store.peak_held)

    # -- planning a call ------------------------------------------------------------------------------
    def lookup(self, rows: list[Row]) -> None:
        """Each row's longest cached prefix (its chain), leaving at least one token to compute:
        its logits start the row's decoding or scoring. A bare row takes none (`cut` = what it
        could have reused)."""
        for r in rows:
            chain, matched = self.store.lookup(r.ids, limit=len(r.ids) - 1)
            r.chain, r.matched, r.cut = ([], 0, matched) if r.bare else (chain, matched, 0)

    def need_bytes(self, rows: list[Row], extra: int, must: Sequence[Row] = ()) -> int:
        """All K/V a batch of these (looked-up) rows holds at once: what is pinned now, the
        chains of the rows and of `must` (rows whose prompts stay cached) made resident, the new
        blocks of every must-store row and the rows' own K/V (rows x (longest new part + extra))."""
        store = self.store
        keep = list({id(r): r for r in [*must, *(r for r in rows if r.must_store)]}.values())
        blocks = sum(_ceil(len(r.ids) - r.matched, store.block_size) for r in keep)
        longest = max((len(r.ids) - r.matched for r in rows), default=0)
        pinned = store.pinned_bytes([p for r in [*rows, *keep] for p in r.chain])
        return pinned + blocks * store.block_bytes + len(rows) * (longest + extra) * store.bytes_per_token

    def check_budget(self, rows: list[Row], extra: int, *, fail: bool = True) -> None:
        """Fail before any work when the budget cannot run every row: what must stay cached (the
        new prompt K/V of rows whose prompts are protected) plus the largest need of any one row
        alone (its context and its batch buffer). fail=False (the engine's, while
        other calls' rows run): only record the least budget, since those rows' pins count here and
        go as they end; the call waits, and the scheduler fails it if alone it cannot fit."""
        if not rows:
            return
        budget = self.store.budget
        must = [r for r in rows if r.must_store]
        need = max(min(self.need_bytes([r], extra, must), self._bare_need(r, extra, must)) for r in rows)
        for st in distinct([r.stats or self.stats for r in rows]):  # the least budget that runs it
            st.least_budget_bytes = max(st.least_budget_bytes, need)
        if fail and budget is not None and need > budget:
            bpt = self.store.bytes_per_token
            raise CacheBudgetError(
                f"cache_budget={budget} bytes cannot run this call: the root prompts and one row's "
                "context and "
                f"batch buffer need at least {need} bytes ({need // bpt} tokens of K/V at {bpt} bytes each); "
                f"raise --cache-budget to at least {need}, or run fewer searches at once"
            )

    def _bare_need(self, r: Row, extra: int, must: list[Row]) -> int:
        """`need_bytes` of r run bare: where its prompt must stay cached, its bare copy stores it
        in place of r (r's chain and r's new blocks are not held as well)."""
        bare = bare_copy(r)
        return self.need_bytes([bare], extra, [bare if m is r else m for m in must])

    # -- storing and residency --------------------------------------------------------------------------
    def store_kv(
        self, ids: list[int], start: int, kv: Any, *, free_only: bool = False, charge: Stats | None = None
    ) -> Handle:
        """Cache the K/V of ids[start:] (or its first whole blocks) where the budget has room,
        else record only the tokens (a non-resident segment, recomputed if it is ever needed).

        free_only: K/V computed in passing (a new prompt's, a generation's) is optional and takes
        only room that displaces nothing owned: free budget or segments no owner holds. Owned K/V
        is evicted, lowest omega first (RSBCM), only for what must be cached: the context a
        running call attends over and protected prompts. Otherwise every new prompt would push out
        the shared templates that all later prompts reuse (LRU breaks omega ties against them).
        Optional K/V whose context before `start` is not cached is kept as tokens only: caching
        it would first recompute that context."""
        store = self.store
        chain, m = store.lookup(ids)
        self.pin(chain)
        cached, keep = self._room_for(ids, start, chain, m, free_only)
        if not cached:  # the context is not resident or there is no room: tokens only
            return chain[-1] if m == len(ids) else store.insert(chain, ids[m:], None)
        return self.insert(ids, start, kv, found=(chain, m), keep=keep, charge=charge)

    def _room_for(
        self, ids: list[int], start: int, chain: Chain, m: int, free_only: bool
    ) -> tuple[bool, int | None]:
        """Whether `store_kv` caches K/V after the looked-up (chain, m), and how many of ids[m:]
        (None: all). False: tokens only (the tokens before start are not in the store, or their
        K/V is evicted before start, or no block fits)."""
        store = self.store
        if m < start:  # the tokens before start are not in the store (forgotten since)
            return False, 0
        if store.budget is None:
            return True, None
        missing = [(s, u) for s, u in chain if u > s.resident_len]
        room = store.room(free_only=free_only) - store.missing_bytes([chain])
        keep = min(len(ids) - m, max(0, int(room)) // store.block_bytes * store.block_size)
        if (
            room < 0
            or (keep == 0 and m < len(ids))
            or any(s.start + s.resident_len < start for s, _ in missing)
        ):
            return False, 0
        return True, keep

    def seal_kv(
        self,
        ids: list[int],
        start: int,
        segs: list[Segment],
        *,
        free_only: bool = True,
        charge: Stats | None = None,
    ) -> Handle | None:
        """Cache, where they are, a running row's open segments holding the K/V of ids[start:]
        (a row's prompt as it comes in, its generated K/V as it ends), pinned for the rest of the
        call. The tree is the one `store_kv(..., free_only=free_only)` makes (K/V computed in
        passing takes only room no owner holds): None, nothing changed, where `store_kv` would
        keep less than all of it, or the store holds some of it already; the caller then stores
        a copy, or keeps reading its own segments."""
        store = self.store
        chain, m = store.lookup(ids)
        if m != start or any(u > s.resident_len for s, u in chain):
            return None
        self.pin(chain)  # read by this step (as `store_kv` pins it)
        cached, keep = self._room_for(ids, start, chain, m, free_only)
        if not cached or (keep is not None and keep < len(ids) - m):
            return None
        end = store.seal(segs, chain[-1] if chain else (store.root, 0), ids[start:])
        if end is not None:
            self.pin(end[0].context_chain(end[1]))
        return end

    def insert(
        self,
        ids: list[int],
        start: int,
        kv: Any,
        *,
        found: tuple[Chain, int] | None = None,
        keep: int | None = None,
        charge: Stats | None = None,
    ) -> Handle:
        """Store the K/V of ids[start:] (given as kv) after the cached ids[:start]; returns the end
        handle, pinned for the rest of the call. Evicted segments the tokens run through are
        refilled from kv, which must cover them (so the handle is resident).
        found: the lookup of ids already made (and pinned); keep: cache only the first keep new
        tokens' K/V (the segment still records every token)."""
        if found is None:
            chain, m = self.store.lookup(ids)
            self.pin(chain)
        else:
            chain, m = found
        assert m >= start, f"insert: the store knows {m} tokens of the context, kv starts at {start}"
        self.ensure_resident(chain, (start, kv))
        if m == len(ids):
            return chain[-1]
        part = kv[:, :, :, m - start :] if keep is None else kv[:, :, :, m - start : m - start + keep]
        end = self.store.insert(chain, ids[m:], part)
        self.pin([end])
        return end

    def ensure_resident(self, chain: Chain, known: tuple[int, Any]) -> None:
        """Refill each chain segment up to the tokens the chain uses from known=(start, kv), the
        K/V of absolute positions start.. (`insert`'s callers make sure it covers every gap; the
        engine recomputes evicted K/V itself, `treesearch.engine.runner.make_resident`)."""
        import torch

        start, kv = known
        for seg, used in chain:
            have = seg.resident_len
            if have >= used:
                continue
            lo, hi = seg.start + have, seg.start + used  # absolute positions missing
            assert lo >= start and hi <= start + kv.shape[3], (
                f"segment {seg.id}: positions {lo}..{hi} are evicted and not in the K/V given ({start}..)"
            )
            new = kv[:, :, :, lo - start : hi - start]
            self.store.refill(seg, torch.cat([seg.kv, new], dim=3) if have else new)
