"""A score row's prompt K/V in one place (issue 43): the scoring forward writes each row's new
prompt K/V straight into an open segment in the store (`Forward.prefill_into`, `DirectKV`),
which the store hands out or refuses (`KVStore.open_rows`); a row that ran every layer has it
sealed into the token tree where it is, a row CGEE cut short has it closed, and the tails of
multi-token labels read it in place. Exact: what a batch holds while it runs is its rows'
segments and nothing more; a scoring pass through segments computes what the padded `BatchKV`
pass computed, bit for bit (label probabilities, per-row exits, K/V, label tails)."""

from __future__ import annotations

import pytest
import torch

from treesearch import Engine, RKSCConfig
from treesearch.common.stats import Stats
from treesearch.engine.labels import label_sequences, tail_logprobs
from treesearch.policies.cgee import RowExits

HEAD = "Numbers: 1 2"
PROMPTS = [f"Numbers: {i} {i + 1} {i + 3}\nJudgement:" for i in range(4)]
LABELS = [" sure thing", " no", " maybe not"]  # two multi-token labels, first tokens all differ


class StopAt:
    """A per-row exit rule that stops the rows of the batch given (original indices) at a layer."""

    def __init__(self, stops: dict[int, int], n: int) -> None:
        self.stops, self.n = stops, n

    def __call__(self, layer: int, probs: torch.Tensor) -> torch.Tensor:
        if layer == 1:
            self.alive = list(range(self.n))
        stop = [self.stops.get(r) == layer for r in self.alive]
        self.alive = [r for r, s in zip(self.alive, stop) if not s]
        return torch.tensor(stop)


def _sink(lm, n: int) -> torch.Tensor:
    return torch.zeros(lm.num_layers, 2, lm.num_kv_heads, n, lm.head_dim, dtype=lm.dtype)


@pytest.mark.parametrize("fast", [True, False], ids=["fast-prefill", "layer-prefill"])
@pytest.mark.parametrize("stops", [{}, {1: 2, 3: 3}], ids=["all-layers", "cgee-per-row"])
def test_scoring_into_segments_computes_the_padded_passs_probabilities_kv_and_tails_bit_for_bit(
    tiny_lm, fast, stops
):
    """Four prompts over a cached head: the scoring pass written into each row's own tensor and the
    padded pass over a `BatchKV` (the old way, its K/V copied out) give the same label
    probabilities, layers run and K/V of the rows that ran every layer, bit for bit, with and
    without per-row CGEE exits; the tails of multi-token labels read over those tensors in place
    equal the tails read over the copies, bit for bit."""
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing="off"))
    fwd = eng.forward
    fwd.fast_prefill = fast and fwd.decoder is not None
    seqs = label_sequences(tiny_lm.tokenizer, LABELS)
    assert [len(q) > 1 for q in seqs] == [True, False, True]
    ids = [eng.tokenize(p) for p in PROMPTS]
    n0 = 3  # "Numbers: ", the prompts' common head
    head = ids[0][:n0]
    assert all(i[:n0] == head for i in ids) and len({i[n0] for i in ids}) == 4
    news = [i[n0:] for i in ids]
    charge = [Stats() for _ in ids]
    firsts = [q[0] for q in seqs]
    with torch.no_grad():
        run = _sink(tiny_lm, n0)
        fwd.prefill_into([[]], [head], [0], [(run, 0)], [Stats()])
        prefix = [(run, n0)]
        sinks = [_sink(tiny_lm, len(t)) for t in news]
        new = fwd.prefill_into(
            [prefix] * 4,
            news,
            [n0] * 4,
            [(s, 0) for s in sinks],
            charge,
            exit_rule=StopAt(stops, 4),
            exits=RowExits(4),
            label_ids=firsts,
        )
        batch, old = fwd.prefill(
            [prefix] * 4,
            news,
            [n0] * 4,
            extra=0,
            want_logits=True,
            charge=charge,
            exit_rule=StopAt(stops, 4),
            exits=RowExits(4),
            label_ids=firsts,
        )
        assert isinstance(new, RowExits) and isinstance(old, RowExits)
        assert new.layers == old.layers == [stops.get(b, tiny_lm.num_layers) for b in range(4)]
        assert all(torch.equal(a, b) for a, b in zip(new.probs, old.probs))
        full = [b for b in range(4) if b not in stops]  # in order: row j of the shrunk batch buffer
        for j, b in enumerate(full):
            n = len(news[b])
            assert torch.equal(sinks[b], batch.row_kv(j, 0, n))
        who = [(b, k) for b in full for k in (0, 2)]
        tails = [seqs[k] for _, k in who]
        starts = [len(ids[b]) for b, _ in who]
        own = _sink(tiny_lm, sum(len(t) - 1 for t in tails))
        offs = [sum(len(t) - 1 for t in tails[:i]) for i in range(len(tails))]
        got = tail_logprobs(
            fwd,
            [prefix + [(sinks[b], len(news[b]))] for b, _ in who],
            tails,
            starts,
            [Stats() for _ in who],
            [(own, o) for o in offs],
        )
        copies = {b: batch.row_kv(j, 0, len(news[b])) for j, b in enumerate(full)}
        hidden: list[torch.Tensor] = []
        fwd.prefill(
            [prefix + [(copies[b], len(news[b]))] for b, _ in who],
            [t[:-1] for t in tails],
            starts,
            extra=0,
            want_logits=False,
            charge=[Stats() for _ in who],
            capture=hidden,
        )
        logp = torch.log_softmax(fwd.head(hidden[-1]), dim=-1)
        ref = [
            float(logp[i, torch.arange(len(t) - 1), torch.tensor(t[1:])].sum()) for i, t in enumerate(tails)
        ]
        assert got == ref


def _spy(eng) -> list[tuple[int, int, list[int], list[int]]]:
    """Each scoring forward's view of the store: (bytes held, bytes reserved, capacities of the
    open segments, data pointers of the tensors it writes)."""
    store, real = eng.store, eng.forward.prefill_into
    seen: list[tuple[int, int, list[int], list[int]]] = []

    def spy(prefixes, news, starts, sinks, charge, **kw):
        caps = sorted(int(s.kv.shape[3]) for s in store.open_segments.values())
        seen.append((store.bytes_held, store.reserved, caps, [kv.data_ptr() for kv, _ in sinks]))
        return real(prefixes, news, starts, sinks, charge, **kw)

    eng.forward.prefill_into = spy
    return seen


def _new_tokens(eng) -> list[int]:
    """Each prompt's tokens the store does not hold yet (it holds HEAD's)."""
    return [len(ids) - eng.store.lookup(ids)[1] for ids in map(eng.tokenize, PROMPTS)]


def test_a_score_batch_holds_its_prompts_once_in_open_segments_and_seals_them_where_they_are(tiny_lm):
    """While the batch runs the store holds what it held before plus each row's segment of its new
    tokens and one segment of the tails' tokens, exactly (the batch's one allocation, made while
    the step is planned; the tails' segment is closed after), and reserves nothing; each row's
    prompt ends up in the tree in the very tensor its forward wrote (no copy), and no segment is
    left open."""
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**9))
    store, bpt = eng.store, tiny_lm.kv_bytes_per_token
    eng.score([HEAD], LABELS)
    before = store.bytes_held
    lens = _new_tokens(eng)
    seen = _spy(eng)
    out = eng.score(PROMPTS, LABELS)
    (held, reserved, caps, ptrs), (t_held, t_reserved, t_caps, _) = seen
    tails = 4 * (1 + 1)  # two labels of two tokens: one tail token each, per row
    assert (held, reserved, caps) == (before + (sum(lens) + tails) * bpt, 0, sorted([*lens, tails]))
    assert (t_held, t_reserved, t_caps) == (held, 0, sorted([*lens, tails]))
    for s, ptr, n in zip(out, ptrs, lens):
        assert s.handle is not None
        seg, used = s.handle
        assert used == n and seg.kv.data_ptr() == ptr  # sealed where the forward wrote it
    assert not store.open_segments and store.reserved == 0
    assert store.bytes_held == before + sum(store.tokens_bytes(n) for n in lens)
    store.check_invariants()


def test_a_row_cgee_cuts_short_closes_its_segment_and_leaves_nothing_in_the_tree(tiny_lm):
    """Rows 1 and 3 stop after layers 2 and 3: their segments are closed (lookups find no more of
    their prompts than before), rows 0 and 2 are sealed, and the store holds exactly those."""
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**9))
    store = eng.store
    eng.score([HEAD], LABELS)
    before = store.bytes_held
    lens = _new_tokens(eng)
    out = eng.score(PROMPTS, LABELS, exit_rule=StopAt({1: 2, 3: 3}, 4))
    assert [s.layers_run for s in out] == [tiny_lm.num_layers, 2, tiny_lm.num_layers, 3]
    assert [s.handle is None for s in out] == [False, True, False, True]
    assert [_new_tokens(eng)[b] for b in (1, 3)] == [lens[1], lens[3]]  # nothing of theirs was kept
    assert not store.open_segments
    assert store.bytes_held == before + store.tokens_bytes(lens[0]) + store.tokens_bytes(lens[2])
    store.check_invariants()


def test_a_score_batch_that_fails_inside_its_forward_gives_its_segments_back(tiny_lm):
    """An exit rule (user code) that raises inside the pass: the call raises, the rows' segments are
    closed, the store holds what it held before and reserves nothing; the engine goes on."""
    eng = Engine(tiny_lm, RKSCConfig(cache_budget=10**9))
    store = eng.store
    eng.score([HEAD], LABELS)
    before = store.bytes_held

    def broken(layer, probs):
        if layer == 2:
            raise ValueError("a broken exit rule")
        return torch.zeros(probs.shape[0], dtype=torch.bool)

    with pytest.raises(ValueError, match="broken exit rule"):
        eng.score(PROMPTS, LABELS, exit_rule=broken)
    assert not store.open_segments and store.bytes_held == before and store.reserved == 0
    store.check_invariants()
    assert all(s.handle is not None for s in eng.score(PROMPTS, LABELS))
