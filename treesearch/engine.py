"""The engine: the only place that runs the model. Batched generation and label scoring, every
forward starting from the longest cached prefix (`kv_sharing="exact"`) or from scratch ("off").

One call works in three phases:
1. prepare: tokenize (reusing the ids of known texts, so a chain-style prompt built from an earlier
   prompt and its generation gets exactly those ids), look up each row's longest cached prefix,
   and compute once, before the batch, any run of new tokens that several rows share;
2. prefill: each row's remaining prompt tokens in one padded batch, attending over its cached
   chain in place (`treesearch.attention`);
3. decode (generate only): one token per row per step until EOS, a stop string or max tokens.
The K/V of each row's new prompt tokens and of its fed-back generated tokens is kept in the
store (exact mode), so a child's context never recomputes its parent's.

Memory (see `treesearch.kvstore` and `treesearch.rsbcm`): with `cache_budget` set, a call first
checks that what must stay cached fits (the pinned root prompt; else `CacheBudgetError` naming the
minimum). Each row's cached chain is trimmed to what the budget can hold at once, down to whole
blocks of a segment (the rest is computed again, counted in `stats.recomputed_tokens`), and
pinned until the call returns; evicted segments it needs are recomputed from their nearest
resident ancestor, evicting by RSBCM priority. The K/V a call computes in passing (new prompt
tokens, generated tokens) is optional: it is kept, whole or its first blocks, only in room that
displaces nothing owned; what does not fit is kept as tokens, recomputed if ever needed. So the
cache never holds more than the budget, a budget holding only the root prompt still runs any
search, and the result is the unbounded one. `stats.peak_kv_bytes` counts the store's blocks
plus the running batch's own buffer (the transient K/V of its new tokens), the most K/V held at once.
With `kv_sharing="asks"`, `_asks_attach` runs before the prefill (see `treesearch.asks`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import asks
from .attention import BatchKV
from .backend import FEATURES, Generation, Score
from .config import RKSCConfig, Sampling
from .errors import CacheBudgetError, ContextTooLongError, ProblemDefinitionError
from .kvstore import Chain, KVStore, Segment
from .rsbcm import Priority, RSBCMPolicy
from .runtime import LanguageModel
from .seeds import stable_seed
from .stats import Stats
from .tokentrie import TokenTrie

log = logging.getLogger(__name__)

Handle = tuple[Segment, int]  # a context end in the KV store: (segment, used tokens)


@dataclass
class _Row:
    ids: list[int]
    chain: Chain = field(default_factory=list)
    matched: int = 0
    asks_ref: int | None = None  # row (in this batch) whose K/V this row attached to
    asks_sigma: float | None = None
    cut: int = 0  # cached tokens this row computes again because the budget cannot hold them now
    must_store: bool = False  # its prompt's K/V must be cached (a pinned owner's, e.g. the root's)


class Engine:
    """Runs a `LanguageModel` over many branches, sharing K/V as `config.kv_sharing` says."""

    def __init__(self, lm: LanguageModel, config: RKSCConfig | None = None, *, max_batch: int = 32,
                 share_min_tokens: int = 8) -> None:
        self.lm = lm
        self.config = config or RKSCConfig()
        self.max_batch = max_batch
        self.share_min_tokens = share_min_tokens
        self.policy = RSBCMPolicy()
        self.store = KVStore(lm.kv_bytes_per_token, self.config.block_size, budget=self.config.cache_budget,
                             policy=self.policy)
        self._call_pins: list[Chain] = []  # chains pinned for the running engine call
        self._prompt_pins: set = set()  # owners whose prompts are pinned (pin_owner)
        self._rows: list[_Row] = []  # rows of the batch being run (for ASKS records)
        self.asks_log: list[dict] = []  # every ASKS gate decision: sigma, attached, tokens reused
        self.stats = Stats()
        self.unique = TokenTrie()
        self._known: dict[str, tuple[int, ...]] = {}
        self._known_order: list[str] = []
        self._calls = 0
        self.eos_ids = _eos_ids(lm)
        self.name = lm.name
        self.num_layers = lm.num_layers
        self.features = frozenset(FEATURES)

    # -- tokenization ------------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of text; a text that extends a known text (an earlier prompt, or a prompt plus
        its generation) keeps the known ids and only the rest is tokenized."""
        if not isinstance(text, str):
            raise ProblemDefinitionError(f"a prompt must be a str, got {type(text).__name__}: {text!r:.80}")
        hit = self._known.get(text)
        if hit is not None:
            return list(hit)
        best = ""
        for known in reversed(self._known_order):
            if len(known) > len(best) and text.startswith(known):
                best = known
        rest = text[len(best):]
        ids = list(self._known[best]) if best else []
        if rest:
            ids += self.lm.tokenizer.encode(rest, add_special_tokens=False)
        self._remember(text, ids)
        return ids

    def _remember(self, text: str, ids: Sequence[int]) -> None:
        if text in self._known:
            return
        self._known[text] = tuple(ids)
        self._known_order.append(text)
        if len(self._known_order) > 20000:
            for old in self._known_order[:10000]:
                self._known.pop(old, None)
            self._known_order = self._known_order[10000:]

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """Record that prompt + the decoded generation has the ids prompt_ids + token_ids (with and
        without the last, e.g. EOS, token), so a chain-style child prompt keeps the generated ids.
        Called after every generation; `Searcher.resume` calls it to give a fresh engine the same
        tokenization memory as the interrupted one (the tree keeps each generation's ids)."""
        gen = list(token_ids)
        for k in (len(gen), len(gen) - 1):
            tail = self.lm.tokenizer.decode(gen[:k], skip_special_tokens=False)
            self._remember(prompt + tail, list(prompt_ids) + gen[:k])

    def token_offsets(self, generation: Generation) -> list[tuple[int, int]]:
        """Character range in generation.text of each generated token."""
        from .cgee import token_offsets

        return token_offsets(self.lm.tokenizer, generation.token_ids)

    def label_token_ids(self, labels: Sequence[str]) -> list[int]:
        """First token id of each label; labels must start with distinct tokens."""
        ids = []
        for lab in labels:
            toks = self.lm.tokenizer.encode(lab, add_special_tokens=False)
            if not toks:
                raise ProblemDefinitionError(f"label {lab!r} tokenizes to nothing; use a non-empty word")
            ids.append(toks[0])
        if len(set(ids)) != len(ids):
            raise ProblemDefinitionError(
                f"labels {list(labels)} do not start with distinct tokens ({ids}); pick words whose first "
                "token differs, e.g. with a leading space: ' sure', ' likely', ' impossible'")
        return ids

    def new_search(self) -> None:
        """Start the counters and ownership of a new search, keeping from the cache only the K/V
        of the last search's prompts (few-shot templates and prompt heads that the next search's
        prompts start with); generations and older entries are forgotten, so memory stays bounded
        by one search. Results never depend on what is cached; only prefill and reuse counts do."""
        for owner in self.store.owners():
            self.store.release(owner)
        self._prompt_pins.clear()
        self.store.keep_only(lambda seg: seg.hits > 0)
        for seg in self.store.segments.values():
            seg.hits = 0
        self.stats = Stats()
        self.unique = TokenTrie()
        self.asks_log = []
        self._calls = 0

    # -- ownership and eviction priority (RSBCM) --------------------------------------------------
    def set_priority(self, fn: Priority | None) -> None:
        """Install owner -> omega (see `treesearch.rsbcm`); the Searcher passes score/(depth+1)."""
        self.policy.priority = fn

    def acquire(self, owner: Any, handle: Handle | None) -> None:
        """`owner` holds the K/V of the context ending at `handle` (no-op for None)."""
        if handle is not None and self.config.shares:
            self.store.acquire(owner, handle)

    def release(self, owner: Any) -> None:
        """`owner` lets go of every context it holds; blocks no one holds become free (evicted first)."""
        self.store.release(owner)
        if owner in self._prompt_pins:
            self._prompt_pins.discard(owner)
            self.store.release(("prompt", owner))

    def pin_owner(self, owner: Any) -> None:
        """Never evict the prompts of this owner's calls (e.g. the root node's prompt template; not
        its generations) until `release(owner)`."""
        self._prompt_pins.add(owner)
        self.store.pin_owner(("prompt", owner))

    # -- public operations -----------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompts: Sequence[str], sampling: Sampling | None = None, *,
                 seeds: Sequence[int] | None = None, owners: Sequence[Any] | None = None) -> list[Generation]:
        """Generate one continuation per prompt (repeat a prompt for several samples)."""
        sampling = sampling or Sampling()
        if not prompts:
            return []
        self._calls += 1
        self.stats.generate_calls += 1
        if seeds is None:
            seeds = [stable_seed(sampling.seed, self._calls, i) for i in range(len(prompts))]
        out: list[Generation] = []
        for lo in range(0, len(prompts), self.max_batch):
            hi = lo + self.max_batch
            try:
                out += self._generate_batch(list(prompts[lo:hi]), sampling, list(seeds[lo:hi]),
                                            None if owners is None else list(owners[lo:hi]))
            finally:
                self._unpin_call()
            self._record_asks(out, lo)
        return out

    @torch.no_grad()
    def score(self, prompts: Sequence[str], labels: Sequence[str], *, owners: Sequence[Any] | None = None,
              exit_rule: Callable[[int, torch.Tensor], bool] | None = None) -> list[Score]:
        """Probabilities of each label's first token right after each prompt, in one forward pass.

        exit_rule(layer, label_probs [B, n_labels]) -> True stops the pass after that layer (CGEE);
        a pass cut short stores no K/V. A rule that returns a bool tensor [B] decides per row: the
        rows marked True stop there (their Score has that layers_run and stores no K/V), and the
        rule is called next with the survivors only, in the same order (see `treesearch.cgee.LayerExit`).
        """
        if not prompts:
            return []
        label_ids = self.label_token_ids(labels)
        self._calls += 1
        self.stats.score_calls += 1
        out: list[Score] = []
        for lo in range(0, len(prompts), self.max_batch):
            hi = lo + self.max_batch
            try:
                out += self._score_batch(list(prompts[lo:hi]), list(labels), label_ids,
                                         None if owners is None else list(owners[lo:hi]), exit_rule)
            finally:
                self._unpin_call()
            self._record_asks(out, lo)
        return out

    # -- phases ----------------------------------------------------------------------------------
    def _prepare(self, prompts: list[str], extra_tokens: int, owners: list[Any] | None = None) -> list[_Row]:
        rows = [_Row(ids=self.tokenize(p)) for p in prompts]
        for r, owner in zip(rows, owners or []):
            r.must_store = owner is not None and owner in self._prompt_pins
        self._rows = rows
        for r, p in zip(rows, prompts):
            if not r.ids:
                raise ProblemDefinitionError("an empty prompt was given; prompts need at least one token")
            if len(r.ids) + extra_tokens > self.lm.max_context:
                raise ContextTooLongError(
                    f"prompt of {len(r.ids)} tokens + {extra_tokens} new tokens exceeds the model's context of "
                    f"{self.lm.max_context}; shorten the prompt or lower max_new_tokens (prompt starts {p[:60]!r})")
        if self.config.shares:
            self._check_budget(rows)
            self._lookup(rows)
            self._share_common_runs(rows)
            if self.config.kv_sharing == "asks":
                self._asks_attach(rows)
            for r in rows:  # the running batch's chains stay pinned until the call ends
                self._pin(r.chain)
            for r in rows:
                self._ensure_resident(r.chain)
            self.stats.recomputed_tokens += sum(r.cut for r in rows)
        return rows

    def _record_asks(self, out: list, lo: int) -> None:
        for k, r in enumerate(self._rows):
            if r.asks_sigma is not None:
                out[lo + k].asks_sigma = r.asks_sigma
                out[lo + k].asks_ref = None if r.asks_ref is None else lo + r.asks_ref

    def _asks_attach(self, rows: list[_Row]) -> None:
        """ASKS (see `treesearch.asks`): one pre-pass computes each reference row up to its last
        token and each candidate row up to its common suffix, capturing hidden states; candidates
        whose gate opens take the reference's K/V for the suffix (all but the last token)."""
        pairs = asks.pair_rows([r.ids for r in rows], [r.matched for r in rows])
        if not pairs:
            return
        cand = {p.row: p for p in pairs}
        order = sorted({p.ref for p in pairs}) + sorted(cand)
        ends = {i: len(rows[i].ids) - (cand[i].suffix if i in cand else 1) for i in order}
        for i in order:
            self._pin(rows[i].chain)
        for i in order:
            self._ensure_resident(rows[i].chain)
        need = sum(_ceil(ends[i] - rows[i].matched, self.store.block_size) for i in order) * self.store.block_bytes
        if not self.store.can_hold(need, free_only=True):  # no free room for the pre-pass: no gate this call (exact only)
            return
        hidden: list[torch.Tensor] = []
        batch, _ = self._prefill([rows[i].chain for i in order], [rows[i].ids[rows[i].matched:ends[i]] for i in order],
                                 [rows[i].matched for i in order], extra=0, want_logits=False, capture=hidden)
        self.store.note_peak(batch.nbytes)
        at = {i: b for b, i in enumerate(order)}
        handles = {i: self._insert(rows[i].ids[:ends[i]], rows[i].matched,
                                   batch.row_kv(at[i], 0, ends[i] - rows[i].matched)) for i in order}
        cfg = self.config
        for p in pairs:
            r, f = rows[p.row], rows[p.ref]
            lo, hi = p.span(len(r.ids))
            hb = asks.pooled(hidden, at[p.row], max(lo, r.matched) - r.matched, hi - r.matched)
            hr = asks.pooled(hidden, at[p.ref], max(lo, f.matched) - f.matched, hi - f.matched)
            cos = asks.layer_cosines(hb, hr)
            r.asks_sigma = asks.sigma_from_cosines(cos, cfg.asks_alpha)
            n = len(r.ids)
            attach = r.asks_sigma >= cfg.asks_tau
            self.asks_log.append({"sigma": r.asks_sigma, "attached": attach, "tokens": n - 1 - hi, "cos": cos,
                                  "row": p.row, "ref": p.ref})
            if not attach:
                continue
            end = self._insert(r.ids[:n - 1], hi, batch.row_kv(at[p.ref], hi - f.matched, n - 1 - f.matched))
            end[0].asks_ref = handles[p.ref][0].id
            r.asks_ref = p.ref
            self.stats.asks_attached += 1
            self.stats.asks_extra_reused += n - 1 - hi
        self._lookup(rows)

    def _pin(self, chain: Chain) -> None:
        self.store.pin(chain)
        self._call_pins.append(chain)

    def _unpin_call(self) -> None:
        for chain in self._call_pins:
            self.store.unpin(chain)
        self._call_pins = []
        self.stats.evicted_blocks = self.store.evicted_blocks

    def _check_budget(self, rows: list[_Row]) -> None:
        """Fail before any work when the budget cannot hold what must stay cached: the pinned
        segments plus the context and prompt K/V of rows whose prompts are pinned (the root's).
        Everything else is optional: `_lookup` trims chains to what fits, and K/V that does not
        fit is not cached (its tokens are, so it is recomputed on demand)."""
        budget = self.store.budget
        if budget is None:
            return
        chains: Chain = []
        blocks = 0
        for r in rows:
            if r.must_store:
                chain, matched = self.store.lookup(r.ids)
                chains += chain
                blocks += _ceil(len(r.ids) - matched, self.store.block_size)
        need = self.store.pinned_bytes(chains) + blocks * self.store.block_bytes
        if need > budget:
            raise CacheBudgetError(
                f"cache_budget={budget} bytes cannot hold the K/V that must stay cached (the root prompt and "
                f"other pinned segments): at least {need} bytes ({need // self.store.bytes_per_token} tokens of "
                f"K/V in blocks of {self.store.block_size}); raise --cache-budget to at least {need}")

    def _lookup(self, rows: list[_Row]) -> None:
        """Each row's longest cached prefix, trimmed under a budget to what can be held at once
        (pinned segments + the rows' chains + the must-store rows' new blocks); a row whose chain
        is trimmed computes the rest again (`cut`, counted as recomputed)."""
        for r in rows:
            # keep at least one token per row to compute: its logits start the row's decoding
            r.chain, r.matched = self.store.lookup(r.ids, limit=len(r.ids) - 1)
            r.cut = 0
        store = self.store
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

    def _share_common_runs(self, rows: list[_Row]) -> None:
        """Compute once the new-token runs that several rows share, then look the rows up again."""
        while True:
            groups: dict[tuple, list[_Row]] = {}
            for r in rows:
                if r.matched < len(r.ids) - 1:
                    end = (r.chain[-1][0].id, r.chain[-1][1]) if r.chain else (0, 0)
                    groups.setdefault((end, r.ids[r.matched]), []).append(r)
            runs: list[tuple[Chain, list[int], int, list[int]]] = []
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
                                 first.ids[:first.matched + lcp]))
            if not runs:
                return
            for run in runs:
                self._pin(run[0])
            need = sum(_ceil(len(run[1]), self.store.block_size) for run in runs) * self.store.block_bytes
            if not self.store.can_hold(need):  # no room for the shared runs: each row computes its own
                return
            for run in runs:
                self._ensure_resident(run[0])
            self._prefill_runs(runs)
            self._lookup(rows)

    def _prefill_runs(self, runs: list[tuple[Chain, list[int], int, list[int]]]) -> None:
        """Forward runs of tokens (each continuing a cached chain) and store their K/V."""
        lens = [len(t) for _, t, _, _ in runs]
        batch, _ = self._prefill([r[0] for r in runs], [r[1] for r in runs], [r[2] for r in runs],
                                 extra=0, want_logits=False)
        self.store.note_peak(batch.nbytes)
        for b, (_, _, start, ids) in enumerate(runs):
            self._insert(ids, start, batch.row_kv(b, 0, lens[b]))

    def _store_kv(self, ids: list[int], start: int, kv: Any, *, free_only: bool = False) -> Handle:
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
        self._pin(chain)
        keep = None  # cache every new token
        if store.budget is not None:
            missing = [(s, u) for s, u in chain if u > s.resident_len]
            room = store.room(free_only=free_only) - sum(store.tokens_bytes(u) - store.resident_bytes(s)
                                                         for s, u in missing)
            keep = min(len(ids) - m, max(0, int(room)) // store.block_bytes * store.block_size)
            if (room < 0 or (keep == 0 and m < len(ids))
                    or any(s.start + s.resident_len < start for s, _ in missing)):
                return chain[-1] if m == len(ids) else store.insert(chain, ids[m:], None)  # tokens only
        return self._insert(ids, start, kv, found=(chain, m), keep=keep)

    def _insert(self, ids: list[int], start: int, kv: Any, *, found: tuple[Chain, int] | None = None,
                keep: int | None = None) -> Handle:
        """Store the K/V of ids[start:] (given as kv) after the cached ids[:start]; returns the end
        handle, pinned for the rest of the call. Evicted segments the tokens run through are
        refilled from kv when it covers them, else recomputed (so the handle is resident).
        found: the lookup of ids already made (and pinned); keep: cache only the first keep new
        tokens' K/V (the segment still records every token)."""
        if found is None:
            chain, m = self.store.lookup(ids)
            self._pin(chain)
        else:
            chain, m = found
        self._ensure_resident(chain, known=(start, kv))
        if m == len(ids):
            return chain[-1]
        part = kv[:, :, :, m - start:] if keep is None else kv[:, :, :, m - start:m - start + keep]
        end = self.store.insert(chain, ids[m:], part)
        self._pin([end])
        return end

    def _ensure_resident(self, chain: Chain, known: tuple[int, Any] | None = None) -> None:
        """Make each chain segment resident up to the tokens the chain uses, recomputing what is
        missing from its nearest cached ancestor (counted as recomputed).

        known=(start, kv): the K/V of absolute positions start.. (a segment part inside it is
        refilled from it instead of recomputed)."""
        for i, (seg, used) in enumerate(chain):
            have = seg.resident_len
            if have >= used:
                continue
            lo, hi = seg.start + have, seg.start + used  # absolute positions missing
            if known is not None and lo >= known[0] and hi <= known[0] + known[1].shape[3]:
                new = known[1][:, :, :, lo - known[0]:hi - known[0]]
            else:
                prefix = list(chain[:i]) + ([(seg, have)] if have else [])
                batch, _ = self._prefill([prefix], [list(seg.tokens[have:used])], [lo], extra=0, want_logits=False)
                new = batch.row_kv(0, 0, used - have)
                self.stats.recomputed_tokens += used - have
            self.store.refill(seg, torch.cat([seg.kv, new], dim=3) if have else new)

    def _prefill(self, chains: list[Chain], news: list[list[int]], starts: list[int], *, extra: int,
                 want_logits: bool, exit_rule=None, label_ids=None, capture: list | None = None):
        """One padded forward of each row's new tokens over its chain; returns (batch, logits|probs).

        capture: a list that receives each decoder layer's output [B, n, hidden] (for ASKS)."""
        lm = self.lm
        bsz = len(news)
        lens = [len(t) for t in news]
        nmax = max(lens)
        batch = BatchKV(lm.num_layers, bsz, lm.num_kv_heads, lm.head_dim, nmax + extra, lm.dtype, lm.device)
        batch.set_chains(chains)
        for c in chains:
            self.store.pin(c)
        try:
            pad = lm.tokenizer.pad_token_id or 0
            ids = torch.full((bsz, nmax), pad, dtype=torch.long)
            for b, t in enumerate(news):
                ids[b, :len(t)] = torch.tensor(t, dtype=torch.long)
            ar = torch.arange(nmax)
            valid = ar[None, :] < torch.tensor(lens)[:, None]
            pos = torch.tensor(starts)[:, None] + ar[None, :]
            batch.begin(0, valid.to(lm.device))
            last = torch.tensor([n - 1 for n in lens])
            result = self._forward(ids.to(lm.device), pos.to(lm.device), batch, last, want_logits,
                                   exit_rule=exit_rule, label_ids=label_ids, capture=capture)
        finally:
            for c in chains:
                self.store.unpin(c)
        self.stats.model_calls += 1
        self.stats.prefill_tokens += sum(lens)
        self.store.note_peak(batch.nbytes)
        return batch, result

    def _forward(self, ids, pos, batch: BatchKV, last, want_logits: bool, *, exit_rule=None, label_ids=None,
                 capture: list | None = None):
        """Embed, run the decoder layers with shared-prefix attention, return last-position logits.

        With exit_rule, label probabilities are read through the final norm and LM head after every
        layer (a logit lens) and the pass stops where the rule says; returns (probs, layers_run).
        """
        model = self.lm.model
        base = model.model
        h = base.embed_tokens(ids)
        pe = base.rotary_emb(h, position_ids=pos)
        rows = torch.arange(ids.shape[0], device=ids.device)
        last = last.to(ids.device)
        layers = base.layers
        per_row = None  # per-row exit (the rule returned a bool tensor): _RowExits
        for i, layer in enumerate(layers):
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe, ts_batch=batch)
            if capture is not None:
                capture.append(h)
            if exit_rule is not None and i < len(layers) - 1:
                probs = self._label_probs(base.norm(h[rows, last]), label_ids)
                verdict = exit_rule(i + 1, probs)
                if isinstance(verdict, torch.Tensor):
                    per_row = per_row or _RowExits(ids.shape[0])
                    keep = per_row.drop(verdict, probs, i + 1)
                    if not per_row.alive:
                        return per_row
                    if keep is not None:  # rows that settled stop here; the others run on
                        idx = torch.tensor(keep, dtype=torch.long, device=h.device)
                        h, pos, last = h[idx], pos[idx], last[idx]
                        pe = tuple(t[idx] for t in pe)
                        rows = torch.arange(len(keep), device=h.device)
                        batch.select(keep)
                elif verdict:
                    return probs, i + 1
        if not want_logits:
            return None
        logits = model.lm_head(base.norm(h[rows, last])).float()
        if per_row is not None:
            per_row.finish(torch.softmax(logits, dim=-1), len(layers))
            return per_row
        if label_ids is not None:
            return torch.softmax(logits, dim=-1), len(layers)
        return logits

    def _label_probs(self, hidden, label_ids):
        """Softmax over the labels' logits only: the LM head's rows of the labels, not the whole
        vocabulary (a full head per layer would cost more than the layer itself)."""
        head = self.lm.model.lm_head
        idx = torch.as_tensor(label_ids, device=hidden.device)
        logits = hidden @ head.weight.index_select(0, idx).T
        if getattr(head, "bias", None) is not None:
            logits = logits + head.bias.index_select(0, idx)
        return torch.softmax(logits.float(), dim=-1)

    def _generate_batch(self, prompts: list[str], sampling: Sampling, seeds: list[int],
                        owners: list[Any] | None) -> list[Generation]:
        rows = self._prepare(prompts, sampling.max_new_tokens, owners)
        news = [r.ids[r.matched:] for r in rows]
        lens = [len(t) for t in news]
        nmax = max(lens)
        batch, logits = self._prefill([r.chain for r in rows], news, [r.matched for r in rows],
                                      extra=sampling.max_new_tokens, want_logits=True)
        self.stats.reused_tokens += sum(r.matched for r in rows)
        ends: list[Handle | None] = [None] * len(rows)
        if self.config.shares:
            for b, r in enumerate(rows):
                ends[b] = self._store_kv(r.ids, r.matched, batch.row_kv(b, 0, lens[b]), free_only=not r.must_store)
                _count_prompt(ends[b])
            self._pin_prompts(ends, owners)
            self.store.note_peak(batch.nbytes)
        gens: list[list[int]] = [[] for _ in rows]
        logps: list[list[float]] = [[] for _ in rows]
        finish = ["length"] * len(rows)
        texts = [""] * len(rows)
        gens_rng = [torch.Generator().manual_seed(s & 0x7FFFFFFFFFFFFFFF) for s in seeds]
        active = list(range(len(rows)))  # batch row -> original row
        for step in range(sampling.max_new_tokens):
            toks = []
            done = []
            for j, b in enumerate(active):
                tok, lp = _sample(logits[j], sampling, gens_rng[b])
                gens[b].append(tok)
                logps[b].append(lp)
                toks.append(tok)
                reason = self._finished(gens[b], sampling)
                if reason is None and step == sampling.max_new_tokens - 1:
                    reason = "length"
                if reason is not None:
                    finish[b] = reason
                    done.append(j)
            for j in done:
                b = active[j]
                ends[b] = self._keep_generated(batch, j, b, rows[b], ends[b], gens[b], nmax)
            if done:
                keep = [j for j in range(len(active)) if j not in set(done)]
                if not keep:
                    break
                batch.select(keep)
                toks = [toks[j] for j in keep]
                active = [active[j] for j in keep]
            ids = torch.tensor(toks, dtype=torch.long, device=self.lm.device)[:, None]
            pos = torch.tensor([rows[b].matched + lens[b] + step for b in active], device=self.lm.device)[:, None]
            batch.begin(nmax + step, torch.ones(len(active), 1, dtype=torch.bool, device=self.lm.device))
            logits = self._forward(ids, pos, batch, torch.zeros(len(active), dtype=torch.long), True)
            self.stats.model_calls += 1
            self.stats.decode_tokens += len(active)
        self.store.note_peak(batch.nbytes)
        results = []
        for b, r in enumerate(rows):
            text = self.lm.tokenizer.decode(gens[b], skip_special_tokens=True)
            self.remember_generation(prompts[b], r.ids, gens[b])
            texts[b] = _cut_at_stop(text, sampling.stop)
            self.unique.add(r.ids + gens[b][:-1])
            self.stats.generated_tokens += len(gens[b])
            results.append(Generation(text=texts[b], token_ids=gens[b], logprobs=logps[b], finish=finish[b],
                                      prompt_tokens=len(r.ids), reused_tokens=r.matched, handle=ends[b]))
        self._tag_owners(results, owners)
        self.stats.unique_tokens = self.unique.size
        self.stats.peak_kv_bytes = max(self.stats.peak_kv_bytes, self.store.peak_bytes)
        return results

    def _keep_generated(self, batch: BatchKV, j: int, b: int, row: _Row, end, gen: list[int], nmax: int):
        """Store the K/V of a finished row's fed-back tokens (all generated but the last), under a
        budget only into room that displaces nothing owned (see `_store_kv`)."""
        fed = len(gen) - 1
        if not self.config.shares or fed <= 0 or end is None:
            return end
        end = self._store_kv(row.ids + gen[:fed], len(row.ids), batch.row_kv(j, nmax, nmax + fed), free_only=True)
        self.store.note_peak(batch.nbytes)
        return end

    def _finished(self, gen: list[int], sampling: Sampling) -> str | None:
        if sampling.ignore_eos:  # fixed lengths: only max_new_tokens ends a row
            return None
        if gen[-1] in self.eos_ids:
            return "eos"
        if sampling.stop:
            tail = self.lm.tokenizer.decode(gen[-16:], skip_special_tokens=True)
            if any(s in tail for s in sampling.stop):
                return "stop"
        return None

    def _score_batch(self, prompts, labels, label_ids, owners, exit_rule) -> list[Score]:
        rows = self._prepare(prompts, 0, owners)
        news = [r.ids[r.matched:] for r in rows]
        batch, out = self._prefill([r.chain for r in rows], news, [r.matched for r in rows],
                                   extra=0, want_logits=True, exit_rule=exit_rule, label_ids=label_ids)
        self.stats.reused_tokens += sum(r.matched for r in rows)
        if isinstance(out, _RowExits):  # per-row exit: each row has its own depth and batch row
            per = [(out.probs[b], out.layers[b], out.batch_row[b]) for b in range(len(rows))]
        else:
            per = [(out[0][b], out[1], b) for b in range(len(rows))]
        results = []
        for b, r in enumerate(rows):
            probs_b, layers_run, brow = per[b]
            probs = probs_b[None]
            full = layers_run == self.lm.num_layers
            end = None
            if self.config.shares and full:  # a row cut short stores no K/V
                end = self._store_kv(r.ids, r.matched, batch.row_kv(brow, 0, len(news[b])), free_only=not r.must_store)
                _count_prompt(end)
            if full:
                raw = {lab: float(probs[0, i]) for lab, i in zip(labels, label_ids)}
            else:
                raw = {lab: float(probs[0, k]) for k, lab in enumerate(labels)}
            tot = sum(raw.values()) or 1.0
            self.unique.add(r.ids)
            results.append(Score(probs={k: v / tot for k, v in raw.items()}, raw=raw, layers_run=layers_run,
                                 reused_tokens=r.matched, handle=end))
        self._tag_owners(results, owners)
        self.stats.unique_tokens = self.unique.size
        self.stats.peak_kv_bytes = max(self.stats.peak_kv_bytes, self.store.peak_bytes)
        return results

    def _pin_prompts(self, prompt_ends: list[Handle | None], owners: list[Any] | None) -> None:
        for end, owner in zip(prompt_ends, owners or []):
            if end is not None and owner in self._prompt_pins:
                self.store.acquire(("prompt", owner), end)

    def _tag_owners(self, results, owners) -> None:
        if owners is None:
            return
        for res, owner in zip(results, owners):
            if res.handle is not None and owner is not None:
                self.store.acquire(owner, res.handle)


class _RowExits:
    """Per-row CGEE exits of one scoring forward: each row's probabilities (label-renormalised
    where it stopped early, over the vocabulary where it ran every layer), layers run, and its row
    in the (shrunk) batch buffer when it ran in full (None when cut short: it stores no K/V)."""

    def __init__(self, bsz: int) -> None:
        self.alive = list(range(bsz))  # original index of each row still running, in batch order
        self.probs: list = [None] * bsz
        self.layers = [0] * bsz
        self.batch_row: list[int | None] = [None] * bsz

    def drop(self, stop: torch.Tensor, probs: torch.Tensor, layer: int) -> list[int] | None:
        """Record the rows marked in stop; returns the batch rows to keep, None when none stop."""
        flags = stop.tolist()
        if not any(flags):
            return None
        for j, s in enumerate(flags):
            if s:
                self.probs[self.alive[j]] = probs[j]
                self.layers[self.alive[j]] = layer
        keep = [j for j, s in enumerate(flags) if not s]
        self.alive = [self.alive[j] for j in keep]
        return keep

    def finish(self, probs: torch.Tensor, layer: int) -> None:
        for j, b in enumerate(self.alive):
            self.probs[b], self.layers[b], self.batch_row[b] = probs[j], layer, j


def _eos_ids(lm: LanguageModel) -> set[int]:
    ids = set()
    eos = getattr(lm.model.generation_config, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif eos:
        ids.update(eos)
    if lm.tokenizer.eos_token_id is not None:
        ids.add(lm.tokenizer.eos_token_id)
    return ids


def _count_prompt(end: Handle) -> None:
    """One more prompt context ran through these segments (`Engine.new_search` keeps them)."""
    seg, used = end
    for s, _ in seg.context_chain(used):
        s.hits += 1


def _ceil(n: int, d: int) -> int:
    return -(-n // d)


def _sample(logits: torch.Tensor, sampling: Sampling, gen: torch.Generator) -> tuple[int, float]:
    """Pick the next token: argmax when greedy, else temperature + top-p. Returns (id, log p)."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    if sampling.temperature == 0:
        tok = int(torch.argmax(logits))
        return tok, float(logp[tok])
    probs = torch.softmax(logits.float() / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sp, si = torch.sort(probs, descending=True)
        keep = torch.cumsum(sp, 0) - sp < sampling.top_p
        probs = torch.zeros_like(probs).scatter_(0, si[keep], sp[keep])
    tok = int(torch.multinomial(probs.cpu(), 1, generator=gen))
    return tok, float(logp[tok])


def _cut_at_stop(text: str, stops: Sequence[str]) -> str:
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]
