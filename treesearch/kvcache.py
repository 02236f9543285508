"""The cache manager: what K/V is resident in the store, and why.

It alone reads the store's budget and segments. For each engine call it plans the rows: each
row's longest cached prefix (`lookup`), trimmed under a budget to what can be held at once; runs
of new tokens that several rows share, computed once before the batch (`share_runs`); and the
residency of every chain the batch attends over (`hold`), recomputing evicted segments from their
nearest resident ancestor. After the call's forwards it stores the K/V they computed (`store_kv`).
It keeps owners and pins (thought-tree nodes holding contexts; the root prompt pinned) and counts
the prompt contexts that ran through each segment, so `new_search` keeps the last search's prompts.

Budget rules (see `treesearch.kvstore` and `treesearch.rsbcm`): a call first checks that what must
stay cached fits (the pinned root prompt; else `CacheBudgetError` naming the minimum). Each row's
cached chain is trimmed to what the budget can hold at once, down to whole blocks of a segment (the
rest is computed again, counted in `stats.recomputed_tokens`), and pinned until the call returns.
The K/V a call computes in passing (new prompt tokens, generated tokens) is optional: it is kept,
whole or its first blocks, only in room that displaces nothing owned; what does not fit is kept as
tokens, recomputed if ever needed. So the cache never holds more than the budget, a budget holding
only the root prompt still runs any search, and the result is the unbounded one.

Model work goes through the `compute` function the engine gives (chains, new tokens, starts ->
the batch holding their K/V); this module runs no model itself.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .attention import BatchKV, Prefix
from .config import RKSCConfig
from .errors import CacheBudgetError
from .kvstore import Chain, KVStore, Segment
from .rsbcm import Priority, RSBCMPolicy
from .stats import Stats, distinct

Handle = tuple[Segment, int]  # a context end in the KV store: (segment, used tokens)
Compute = Callable[[list[Chain], list[list[int]], list[int], list[Stats]], BatchKV]


@dataclass
class Row:
    """One prompt of an engine call, as the cache plans it."""

    ids: list[int]
    chain: Chain = field(default_factory=list)  # cached (segment, used) pairs it attends over
    matched: int = 0  # tokens served from the cache (the chain's length)
    asks_ref: int | None = None  # row (in this batch) whose K/V this row attached to
    asks_sigma: float | None = None
    cut: int = 0  # cached tokens this row computes again because the budget cannot hold them now
    must_store: bool = False  # its prompt's K/V must be cached (a pinned owner's, e.g. the root's)
    stats: Stats | None = None  # where the work done for this row is counted (its search's)


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


class CacheManager:
    """Owns the KV store of one engine: planning, residency, owners, pins and the budget."""

    def __init__(self, bytes_per_token: int, config: RKSCConfig, stats: Stats, compute: Compute,
                 *, share_min_tokens: int = 8) -> None:
        self.config = config
        self.stats = stats
        self.compute = compute
        self.share_min_tokens = share_min_tokens
        self.policy = RSBCMPolicy()
        self.store = KVStore(bytes_per_token, config.block_size, budget=config.cache_budget, policy=self.policy)
        self._call_pins: list[Chain] = []  # chains pinned for the running engine call
        self._prompt_pins: set = set()  # owners whose prompts are pinned (pin_owner)
        self._prompt_hits: dict[int, int] = {}  # segment id -> prompt contexts of this search through it
        self._evicted_seen = 0  # store.evicted_blocks already counted in some Stats

    # -- owners and priority (RSBCM) ----------------------------------------------------------------
    def set_priority(self, fn: Priority | None) -> None:
        """Install owner -> omega (see `treesearch.rsbcm`)."""
        self.policy.priority = fn

    def acquire(self, owner: Hashable, handle: Handle | None) -> None:
        """`owner` holds the K/V of the context ending at `handle` (no-op for None)."""
        if handle is not None:
            self.store.acquire(owner, handle)

    def release(self, owner: Hashable) -> None:
        """`owner` lets go of every context it holds; blocks no one holds become free (evicted first)."""
        self.store.release(owner)
        if owner in self._prompt_pins:
            self._prompt_pins.discard(owner)
            self.store.release(("prompt", owner))

    def pin_owner(self, owner: Hashable) -> None:
        """Never evict the prompts of this owner's calls until `release(owner)`."""
        self._prompt_pins.add(owner)
        self.store.pin_owner(("prompt", owner))

    def prompt_pinned(self, owner: Hashable | None) -> bool:
        return owner is not None and owner in self._prompt_pins

    def new_search(self) -> None:
        """Release every owner and keep only the K/V that prompt contexts ran through."""
        for owner in self.store.owners():
            self.store.release(owner)
        self._prompt_pins.clear()
        hits = self._prompt_hits
        self.store.keep_only(lambda seg: hits.get(seg.id, 0) > 0)
        self._prompt_hits = {}
        self._evicted_seen = 0

    def count_prompt(self, end: Handle) -> None:
        """One more prompt context ran through the segments ending at `end`."""
        seg, used = end
        for s, _ in seg.context_chain(used):
            self._prompt_hits[s.id] = self._prompt_hits.get(s.id, 0) + 1

    def pin_prompts(self, ends: list[Handle | None], owners: list[Any] | None) -> None:
        """The prompt-pinned owners among `owners` hold their prompts' contexts."""
        for end, owner in zip(ends, owners or []):
            if end is not None and owner in self._prompt_pins:
                self.store.acquire(("prompt", owner), end)

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

    def note_peak(self, batch_bytes: int = 0) -> None:
        """Record the store's bytes plus a running batch's own buffer."""
        self.store.note_peak(batch_bytes)

    def report_peak(self, charge: Sequence[Stats]) -> None:
        for st in distinct(charge):
            st.peak_kv_bytes = max(st.peak_kv_bytes, self.store.peak_bytes)

    def fits_free(self, token_runs: list[int]) -> bool:
        """Whether new runs of these token counts fit in room that displaces nothing owned."""
        need = sum(_ceil(n, self.store.block_size) for n in token_runs) * self.store.block_bytes
        return self.store.can_hold(need, free_only=True)

    # -- planning a call ------------------------------------------------------------------------------
    def prepare(self, rows: list[Row]) -> None:
        """Check the budget, look every row up and compute shared runs once."""
        self.check_budget(rows)
        self.lookup(rows)
        self.share_runs(rows)

    def hold(self, rows: list[Row]) -> None:
        """Pin the rows' chains for the call and make them resident."""
        for r in rows:
            self.pin(r.chain)
        for r in rows:
            self.ensure_resident(r.chain, charge=r.stats)
        for r in rows:
            (r.stats or self.stats).recomputed_tokens += r.cut

    def check_budget(self, rows: list[Row]) -> None:
        """Fail before any work when the budget cannot hold what must stay cached: the pinned
        segments plus the context and prompt K/V of rows whose prompts are pinned (the root's).
        Everything else is optional: `lookup` trims chains to what fits, and K/V that does not
        fit is not cached (its tokens are, so it is recomputed on demand)."""
        store = self.store
        budget = store.budget
        if budget is None:
            return
        chains: Chain = []
        blocks = 0
        for r in rows:
            if r.must_store:
                chain, matched = store.lookup(r.ids)
                chains += chain
                blocks += _ceil(len(r.ids) - matched, store.block_size)
        need = store.pinned_bytes(chains) + blocks * store.block_bytes
        if need > budget:
            raise CacheBudgetError(
                f"cache_budget={budget} bytes cannot hold the K/V that must stay cached (the root prompt and "
                f"other pinned segments): at least {need} bytes ({need // store.bytes_per_token} tokens of "
                f"K/V in blocks of {store.block_size}); raise --cache-budget to at least {need}")

    def lookup(self, rows: list[Row]) -> None:
        """Each row's longest cached prefix, trimmed under a budget to what can be held at once
        (pinned segments + the rows' chains + the must-store rows' new blocks); a row whose chain
        is trimmed computes the rest again (`cut`, counted as recomputed)."""
        store = self.store
        for r in rows:
            # keep at least one token per row to compute: its logits start the row's decoding
            r.chain, r.matched = store.lookup(r.ids, limit=len(r.ids) - 1)
            r.cut = 0
        if store.budget is None:
            return
        bs = store.block_size
        upto = {s: s.resident_len for s in store.segments.values() if s.pins > 0}  # tokens held per segment
        used = sum(store.tokens_bytes(n) for n in upto.values())
        used += sum(store.tokens_bytes(len(r.ids) - r.matched) for r in rows if r.must_store)
        for r in sorted(rows, key=lambda r: not r.must_store):
            keep: Chain = []
            for seg, u in r.chain:
                have = upto.get(seg, 0)
                base = max(have, seg.resident_len)  # pinning a segment holds all of its resident blocks
                room = (store.budget - used) // store.block_bytes * store.block_bytes + store.tokens_bytes(have)
                fit = min(u, max(base, room // store.block_bytes * bs)) if store.tokens_bytes(base) <= room else 0
                if fit > 0:
                    used += store.tokens_bytes(max(fit, base)) - store.tokens_bytes(have)
                    upto[seg] = max(fit, base)
                    keep.append((seg, fit))
                if fit < u:
                    break
            if keep != r.chain:
                matched = keep[-1][0].start + keep[-1][1] if keep else 0
                r.cut = r.matched - matched
                r.chain, r.matched = keep, matched

    def share_runs(self, rows: list[Row]) -> None:
        """Compute once the new-token runs that several rows share, then look the rows up again."""
        while True:
            groups: dict[tuple, list[Row]] = {}
            for r in rows:
                if r.matched < len(r.ids) - 1:
                    end = (r.chain[-1][0].id, r.chain[-1][1]) if r.chain else (0, 0)
                    groups.setdefault((end, r.ids[r.matched]), []).append(r)
            runs: list[tuple[Chain, list[int], int, list[int], Stats]] = []  # counted in the first row's stats
            for members in groups.values():
                if len(members) < 2:
                    continue
                first = members[0]
                n = min(len(m.ids) - 1 - m.matched for m in members)
                lcp = 0
                while lcp < n and all(m.ids[m.matched + lcp] == first.ids[first.matched + lcp] for m in members):
                    lcp += 1
                if lcp >= self.share_min_tokens:
                    runs.append((first.chain, first.ids[first.matched:first.matched + lcp], first.matched,
                                 first.ids[:first.matched + lcp], first.stats or self.stats))
            if not runs:
                return
            for run in runs:
                self.pin(run[0])
            need = sum(_ceil(len(run[1]), self.store.block_size) for run in runs) * self.store.block_bytes
            if not self.store.can_hold(need):  # no room for the shared runs: each row computes its own
                return
            for run in runs:
                self.ensure_resident(run[0], charge=run[4])
            batch = self.compute([r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs],
                                 [r[4] for r in runs])
            for b, (_, toks, start, ids, charge) in enumerate(runs):
                self.insert(ids, start, batch.row_kv(b, 0, len(toks)), charge=charge)
            self.lookup(rows)

    # -- storing and residency --------------------------------------------------------------------------
    def store_kv(self, ids: list[int], start: int, kv: Any, *, free_only: bool = False,
                 charge: Stats | None = None) -> Handle:
        """Cache the K/V of ids[start:] (or its first whole blocks) where the budget has room,
        else record only the tokens (a non-resident segment, recomputed if it is ever needed).

        free_only: K/V computed in passing (a new prompt's, a generation's) is optional and takes
        only room that displaces nothing owned: free budget or segments no owner holds. Owned K/V
        is evicted, lowest omega first (RSBCM), only for what must be cached: the context a
        running call attends over and pinned prompts. Otherwise every new prompt would push out
        the shared templates that all later prompts reuse (LRU breaks omega ties against them).
        Optional K/V whose context before `start` is not cached is kept as tokens only: caching
        it would first recompute that context."""
        store = self.store
        chain, m = store.lookup(ids)
        self.pin(chain)
        keep = None  # cache every new token
        if store.budget is not None:
            missing = [(s, u) for s, u in chain if u > s.resident_len]
            room = store.room(free_only=free_only) - sum(store.tokens_bytes(u) - store.resident_bytes(s)
                                                         for s, u in missing)
            keep = min(len(ids) - m, max(0, int(room)) // store.block_bytes * store.block_size)
            if (room < 0 or (keep == 0 and m < len(ids))
                    or any(s.start + s.resident_len < start for s, _ in missing)):
                return chain[-1] if m == len(ids) else store.insert(chain, ids[m:], None)  # tokens only
        return self.insert(ids, start, kv, found=(chain, m), keep=keep, charge=charge)

    def insert(self, ids: list[int], start: int, kv: Any, *, found: tuple[Chain, int] | None = None,
               keep: int | None = None, charge: Stats | None = None) -> Handle:
        """Store the K/V of ids[start:] (given as kv) after the cached ids[:start]; returns the end
        handle, pinned for the rest of the call. Evicted segments the tokens run through are
        refilled from kv when it covers them, else recomputed (so the handle is resident).
        found: the lookup of ids already made (and pinned); keep: cache only the first keep new
        tokens' K/V (the segment still records every token)."""
        if found is None:
            chain, m = self.store.lookup(ids)
            self.pin(chain)
        else:
            chain, m = found
        self.ensure_resident(chain, known=(start, kv), charge=charge)
        if m == len(ids):
            return chain[-1]
        part = kv[:, :, :, m - start:] if keep is None else kv[:, :, :, m - start:m - start + keep]
        end = self.store.insert(chain, ids[m:], part)
        self.pin([end])
        return end

    def ensure_resident(self, chain: Chain, known: tuple[int, Any] | None = None, *,
                        charge: Stats | None = None) -> None:
        """Make each chain segment resident up to the tokens the chain uses, recomputing what is
        missing from its nearest cached ancestor (counted as recomputed).

        known=(start, kv): the K/V of absolute positions start.. (a segment part inside it is
        refilled from it instead of recomputed). charge: where recomputation is counted."""
        import torch

        charge = charge or self.stats
        for i, (seg, used) in enumerate(chain):
            have = seg.resident_len
            if have >= used:
                continue
            lo, hi = seg.start + have, seg.start + used  # absolute positions missing
            if known is not None and lo >= known[0] and hi <= known[0] + known[1].shape[3]:
                new = known[1][:, :, :, lo - known[0]:hi - known[0]]
            else:
                prefix = list(chain[:i]) + ([(seg, have)] if have else [])
                batch = self.compute([prefix], [list(seg.tokens[have:used])], [lo], [charge])
                new = batch.row_kv(0, 0, used - have)
                charge.recomputed_tokens += used - have
            self.store.refill(seg, torch.cat([seg.kv, new], dim=3) if have else new)
