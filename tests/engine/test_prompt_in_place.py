"""A generate row's prompt K/V in one place (issue 43): the prefill forwards write it straight into
the row's fill, an open segment in the store (`Forward.prefill_into`, `DirectKV`), which is sealed
into the token tree where it is when the prompt is in. Exact: the sealed prompt is the fill's
own storage; while a row prefills, `bytes_held` is its open segments' bytes and nothing else
holds its prompt; a direct prefill computes what the padded `BatchKV` prefill computes, bit for
bit, in one part or two, and within float32 rounding of the transformers layers; a row preempted
while it prefills gives its fill's blocks back."""

from __future__ import annotations

import pytest
import torch

from treesearch import Engine, RKSCConfig, Sampling
from treesearch.cache.manager import Row
from treesearch.common.stats import Stats
from treesearch.engine.plan import StepPlan
from treesearch.engine.running import Call, GenRow
from treesearch.engine.scheduler import seeded

PROMPT = "Long ago, " + " ".join(f"w{i}" for i in range(7))  # 17 tokens
SAMPLING = Sampling(max_new_tokens=8, ignore_eos=True)
KV_TOL = 1e-5  # relative to the largest |K/V|, as tests/engine/test_fast_prefill.py
TOL = 1e-4


def _sink(lm, n: int) -> torch.Tensor:
    return torch.zeros(lm.num_layers, 2, lm.num_kv_heads, n, lm.head_dim, dtype=lm.dtype)


def _direct(eng, ids: list[int], cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """ids prefilled into one sink in parts (cut at the offsets), each over the earlier parts as a
    prefix run in the same tensor: (the sink's K/V, the last part's last-position logits)."""
    kv = _sink(eng.lm, len(ids))
    start, logits = 0, None
    for end in [*cuts, len(ids)]:
        prefix = [(kv, start)] if start else []
        logits = eng.forward.prefill_into([prefix], [ids[start:end]], [start], [(kv, start)], [Stats()])
        start = end
    assert logits is not None
    return kv, logits


def _buffered(eng, ids: list[int], cuts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The same through `Forward.prefill` (a padded `BatchKV` per part, each read as a prefix run by
    the next, as the scheduler's cohorts were), its K/V copied out."""
    prefixes: list = []
    kvs, start, logits = [], 0, None
    for end in [*cuts, len(ids)]:
        batch, logits = eng.forward.prefill(
            [list(prefixes)], [ids[start:end]], [start], extra=0, want_logits=True, charge=[Stats()]
        )
        kvs.append(batch.row_kv(0, 0, end - start))
        prefixes.append((batch.row_run(0), end - start))
        start = end
    return torch.cat(kvs, dim=3), logits


@pytest.mark.parametrize("fast", [True, False], ids=["fast-prefill", "layer-prefill"])
def test_a_direct_prefill_in_one_part_or_two_computes_the_padded_prefills_kv_bit_for_bit(tiny_lm, fast):
    """Direct (into the row's own tensor) and padded (a batch buffer, copied out) prefills of a prompt
    in one part and in two: the same K/V and logits, bit for bit, at each split; two parts against
    one part and the fast path against the transformers layers (the reference) agree within float32
    rounding (the second part's attention merges the first as a prefix run: the same sums in another
    order)."""
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing="off"))
    eng.forward.fast_prefill = fast and eng.forward.decoder is not None
    ids = eng.tokenize(PROMPT)
    assert len(ids) > 8
    with torch.no_grad():
        one_kv, one_logits = _direct(eng, ids, [])
        two_kv, two_logits = _direct(eng, ids, [5])
        for cuts, (kv, logits) in (([], (one_kv, one_logits)), ([5], (two_kv, two_logits))):
            ref_kv, ref_logits = _buffered(eng, ids, cuts)
            assert torch.equal(kv, ref_kv) and torch.equal(logits, ref_logits)
        assert torch.equal(two_kv[:, :, :, :5], _direct(eng, ids[:5], [])[0])  # the first part alone
        scale = float(one_kv.abs().max())
        assert float((two_kv - one_kv).abs().max()) <= KV_TOL * scale
        assert torch.allclose(two_logits, one_logits, atol=TOL)
        eng.forward.fast_prefill = False
        layer_kv, layer_logits = _direct(eng, ids, [])
        assert float((layer_kv - one_kv).abs().max()) <= KV_TOL * scale
        assert torch.allclose(layer_logits, one_logits, atol=TOL)


def _one_row(eng, prompt: str = PROMPT) -> tuple[GenRow, Row]:
    row = Row(ids=eng.tokenize(prompt), stats=Stats())
    eng.cache.lookup([row])
    g = GenRow(Call("generate", 1), 0, prompt, row, SAMPLING, seeded(0))
    g.plan = row
    return g, row


def _prefill(sched) -> None:
    """One step's planning and prefill (no decode): the parts planned, run, their prompts in."""
    sched.plan = StepPlan()
    plan = sched.schedule()
    sched._prompts_in(plan.parts, sched.runner.prefill(plan.parts))


def test_while_a_row_prefills_its_prompt_is_held_once_in_its_fill_and_sealed_there(tiny_lm):
    """step_tokens=4 on a 17-token prompt: over the five steps of its prefill, the store holds the
    row's fill (17 tokens) and first decode block (7: what it has left to feed) and reserves its
    token of the decode step, nothing more; the fill's tensor is the one the tree holds once the
    prompt is in (the same storage, no copy), pinned for the row, and lookups match it."""
    eng = Engine(tiny_lm, RKSCConfig(step_tokens=4, cache_budget=10**9))
    store, sched = eng.store, eng.scheduler
    bpt = store.bytes_per_token
    n = len(eng.tokenize(PROMPT))
    assert n == 17
    held: list[tuple[int, int, int]] = []
    ptrs: list[int] = []

    def look() -> None:
        for g in sched.filling:
            held.append((store.bytes_held, store.reserved, g.fill.used))
            ptrs.append(g.fill.kv.data_ptr())

    sealed: list = []
    real = sched.memory.seal_prompt

    def seal_prompt(g):
        ptr = g.fill.kv.data_ptr()
        end = real(g)
        sealed.append((ptr, end, [s for s, _ in g.pinned]))
        return end

    sched.memory.seal_prompt = seal_prompt
    sched.on_step = look
    out = eng.generate([PROMPT], SAMPLING)
    assert held == [((n + 7) * bpt, bpt, k) for k in (4, 8, 12, 16)]  # its open segments, exactly
    assert len(set(ptrs)) == 1
    ((ptr, end, pinned),) = sealed
    seg, used = end
    assert used == n and seg.kv.data_ptr() == ptr == ptrs[0] and seg.tokens == tuple(eng.tokenize(PROMPT))
    assert pinned[-1] is seg  # the row read it from its chain from then on
    assert store.lookup(eng.tokenize(PROMPT))[1] == n
    assert out[0].token_ids == Engine(tiny_lm).generate([PROMPT], SAMPLING)[0].token_ids
    assert store.reserved == 0 and not store.open_segments and seg.pins == 0
    store.check_invariants()


def test_a_row_preempted_while_it_prefills_gives_its_fills_blocks_back(tiny_lm):
    """A row admitted and prefilled for one step (5 of its 17 tokens) and then preempted: its fill and
    first decode block are closed (the store holds nothing, reserves nothing), what it prefilled is
    counted as recomputed, and it waits first in line."""
    eng = Engine(tiny_lm, RKSCConfig(step_tokens=5, cache_budget=10**9))
    sched, store = eng.scheduler, eng.store
    g, row = _one_row(eng)
    assert sched.memory.hold(g, row, [])
    fill = g.fill
    assert fill is not None and store.bytes_held == (17 + 7) * store.bytes_per_token
    sched.filling.append(g)
    _prefill(sched)
    assert g in sched.filling and fill.used == 5 and g.filled == 5
    sched._preempt(g)
    assert fill.kv is None and g.fill is None and not store.open_segments
    assert store.bytes_held == 0 and store.reserved == 0 and not store.segments
    assert g.stats.recomputed_tokens == 5 and sched.gen_wait[0] is g
    store.check_invariants()


def test_a_preempted_rows_sealed_prompt_stays_in_the_tree_and_its_readmission_matches_it(tiny_lm):
    """A row preempted after its prompt was sealed: its fill's K/V stays in the tree, unpinned (so
    evictable), and the row readmitted matches it: it computes again only its fed tokens."""
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**9))
    sched, store = eng.scheduler, eng.store
    g, row = _one_row(eng)
    assert sched.memory.hold(g, row, [])
    sched.filling.append(g)
    _prefill(sched)  # its prompt comes in: it joins the running rows with its first token
    assert sched.running == [g] and len(g.gens) == 1 and g.fill is None
    sched._preempt(g)
    eng.cache.end_call()  # the step's own pins (the seal's) go as the step ends
    (seg,) = store.segments.values()
    assert seg.resident and seg.pins == 0 and len(seg.tokens) == 17 and not store.open_segments
    plan = Row(ids=g.row.ids + g.gens[:-1], stats=g.stats)
    eng.cache.lookup([plan])
    assert plan.matched == 16  # a lookup leaves one token to compute: the prompt's last
    store.check_invariants()
