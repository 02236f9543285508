"""Chunked prefill (`treesearch.engine.scheduler`): a row's uncached prompt is prefilled in parts of at
most `step_tokens` per step, beside the running rows' decode. Results do not depend on the parts:
tokens, log-probabilities (within 1e-4), scores (within 1e-4) and the counters of the work are the
same at every chunk size as without chunking, on the tiny Llama and the tiny Qwen2, greedy and
sampled, one call or three at once, unbounded or under a budget that preempts; a partly
prefilled row that is preempted is recomputed and changes no token; K/V stays within the budget."""

from __future__ import annotations

import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reliability_problems import Words
from same_results import assert_same as assert_same_searches
from test_lossless import LABELS

from strategies import BFS
from treesearch import Engine, RKSCConfig, Sampling, Searcher
from treesearch.common.stats import Stats
from treesearch.models.load import tiny_model

LONG = "Long ago, " + " ".join(f"w{i}" for i in range(30))  # 83 tokens
PROMPTS = ["Once upon a time there was", "The quick brown fox jumps over", LONG]
CHUNKS = [1, 7, 64, 1_000_000]  # 1_000_000: every prompt in one part, as without chunking
GREEDY = Sampling(max_new_tokens=24, ignore_eos=True)
SAMPLED = Sampling(max_new_tokens=24, temperature=0.9, top_p=0.9, ignore_eos=True)


def work(s: Stats) -> dict:
    """A row's work that no schedule changes: its decode and generated tokens."""
    return {"decode": s.decode_tokens, "generated": s.generated_tokens}


def exact_work(s: Stats) -> dict:
    """`work`, and with nothing evicted or preempted and no prompt reusing another's, its prefill
    and reuse too."""
    return {**work(s), "prefill": s.prefill_tokens, "reused": s.reused_tokens}


def assert_context_counted(s: Stats, n: int, budget: int | None) -> None:
    """A row's n context tokens, each prefilled or reused: exactly once when unbounded; under a
    budget at least once, and prefilled beyond what is counted as recomputed at most once."""
    if budget is None:
        assert s.prefill_tokens + s.reused_tokens == n and s.recomputed_tokens == 0
    else:
        assert s.prefill_tokens - s.recomputed_tokens <= n <= s.prefill_tokens + s.reused_tokens


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def arch_lm(request, tiny_lm):
    return tiny_lm if request.param == "llama" else tiny_model(seed=0, arch="qwen2")


def _budget(lm) -> int:
    """Room for every prompt and about half the rows' generations: the rows preempt."""
    n = max(len(Engine(lm).tokenize(p)) for p in PROMPTS)
    return int(1.5 * (n + GREEDY.max_new_tokens) * lm.kv_bytes_per_token)


def _run(lm, chunk: int, sampling: Sampling, threads: int, budget: int | None):
    """The three prompts' generations (own seeds) and scores, with each row's Stats: in one call
    (threads=1) or one call per thread, all three at once."""
    eng = Engine(lm, RKSCConfig(step_tokens=chunk, cache_budget=budget))
    eng.scheduler.on_step = eng.store.check_invariants
    stats = [Stats() for _ in PROMPTS]
    if threads == 1:
        gens = eng.generate(PROMPTS, sampling, seeds=[0, 1, 2], stats=stats)
    else:
        gens = [None] * len(PROMPTS)
        start = threading.Barrier(len(PROMPTS))

        def one(i: int) -> None:
            start.wait()
            gens[i] = eng.generate([PROMPTS[i]], sampling, seeds=[i], stats=stats[i])[0]

        pool = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    scores = eng.score(PROMPTS, LABELS)
    assert not eng.scheduler.rows_held() and eng.store.reserved == 0
    if budget is not None:
        assert eng.store.peak_bytes <= budget
    eng.store.check_invariants()
    return gens, scores, stats


def _assert_same(ref, got, counted=work):
    (g0, s0, st0), (g1, s1, st1) = ref, got
    assert [g.token_ids for g in g1] == [g.token_ids for g in g0]
    for a, b in zip(g0, g1):
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
        assert b.finish == a.finish
    for a, b in zip(s0, s1):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)
    assert [counted(s) for s in st1] == [counted(s) for s in st0]


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_every_chunk_size_gives_the_results_and_counts_of_one_part(arch_lm, sampling):
    ref = _run(arch_lm, CHUNKS[-1], sampling, 1, None)
    preempted = 0
    for chunk in CHUNKS:
        for threads in (1, 3):
            _assert_same(ref, _run(arch_lm, chunk, sampling, threads, None), exact_work)
            tight = _run(arch_lm, chunk, sampling, threads, _budget(arch_lm))
            _assert_same(ref, tight)
            for s, p in zip(tight[2], PROMPTS):
                assert_context_counted(s, len(Engine(arch_lm).tokenize(p)), _budget(arch_lm))
            preempted += sum(s.preemptions for s in tight[2])
    assert preempted > 0  # the budget did preempt


def _spy_prefill(eng):
    """Record the token count of every prefill forward of prompt parts (`Forward.prefill_into`, into
    the rows' fills; not the recomputation of evicted K/V, which goes through it too since it
    writes into open segments, asking for no logits); the real forward runs."""
    sizes: list[int] = []
    real = eng.forward.prefill_into

    def prefill_into(prefixes, news, *args, **kw):
        if kw.get("want_logits", True):
            sizes.append(sum(len(t) for t in news))
        return real(prefixes, news, *args, **kw)

    eng.forward.prefill_into = prefill_into
    return sizes


def test_a_long_prompt_is_prefilled_in_parts_while_the_short_rows_decode(tiny_lm):
    """step_tokens=8: the first step prefills the first short row (6 tokens) and 2 of the second's;
    the second step its other 4 and 4 of the long row's 83; the long row's other 79 come 8 a step
    (the last 7), and every one of those steps also decodes the rows whose prompts are in."""
    eng = Engine(tiny_lm, RKSCConfig(step_tokens=8))
    sizes = _spy_prefill(eng)
    sched = eng.scheduler
    trace: list[tuple[int, int]] = []  # per step: rows filling after it, decode steps so far
    sched.on_step = lambda: trace.append((len(sched.filling), sched.decode_steps))
    stats = [Stats() for _ in PROMPTS]
    out = eng.generate(PROMPTS, GREEDY, stats=stats)
    assert sizes == [6 + 2, 4 + 4] + [8] * 9 + [7]
    assert [n for n, _ in trace[:12]] == [1] * 11 + [0]  # a row fills for 11 steps
    assert [d for _, d in trace[:12]] == list(range(1, 13))  # and every one of them decoded
    assert [s.prefill_tokens for s in stats] == [6, 6, 83]
    assert [s.model_calls for s in stats] == [1 + 23, 2 + 23, 11 + 23]  # parts + decode steps
    alone = [Engine(tiny_lm).generate([p], GREEDY)[0].token_ids for p in PROMPTS]
    assert [g.token_ids for g in out] == alone


# 5 tokens a step put the prompt in before the preemption (since prompts are prefilled into the
# rows' fills: the long row's 67 tokens in at its preemption before, all 83 now), 7 did before
@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("eviction", ["omega", "lru"])
def test_a_partly_prefilled_row_that_is_preempted_is_recomputed_and_changes_no_token(
    tiny_lm, chunk, eviction
):
    """Under a budget with room for the prompts but not for every generation, the short rows' growth
    preempts the long row (omega 0.1, and the latest admitted) while its prompt is partly in: its parts
    are freed and counted as recomputed, and its tokens equal its tokens alone."""
    sampling = Sampling(max_new_tokens=40, ignore_eos=True)
    budget = int(1.5 * (83 + 40) * tiny_lm.kv_bytes_per_token)
    eng = Engine(tiny_lm, RKSCConfig(step_tokens=chunk, cache_budget=budget, eviction=eviction))
    eng.set_priority({"a": 0.9, "b": 0.5, "c": 0.1}.get)
    eng.scheduler.on_step = eng.store.check_invariants
    stats = [Stats() for _ in PROMPTS]
    out = eng.generate(PROMPTS, sampling, owners=["a", "b", "c"], stats=stats)
    assert [s.preemptions for s in stats] == [0, 0, 1]
    # what it had prefilled, computed again: less than its prompt (preempted after its prompt was
    # in, it would recompute the prompt and its fed tokens)
    assert 0 < stats[2].recomputed_tokens < 83
    assert stats[2].prefill_tokens == 83 + stats[2].recomputed_tokens
    assert [s.decode_tokens for s in stats] == [39, 39, 39]
    alone = [Engine(tiny_lm).generate([p], sampling)[0].token_ids for p in PROMPTS]
    assert [g.token_ids for g in out] == alone
    assert eng.store.peak_bytes <= budget and eng.store.reserved == 0


@pytest.mark.parametrize("chunk", [1, 7])
def test_searches_with_chunked_prefill_build_the_trees_of_solve_alone(tiny_lm, chunk):
    """Sampled BFS over prompts that grow with depth (pad): one search at a time and three at once,
    unbounded and under a quarter of the unchunked peak: each search's tree, answer and counters
    equal `solve(x)` alone with prompts in one part."""
    problem = Words(width=2, depth=2, max_new_tokens=6, samples=2, temperature=0.9, pad=8)
    inputs = ["cats", "dogs", "birds"]

    def searcher(**config) -> Searcher:
        return Searcher(tiny_lm, problem, BFS(breadth=2), RKSCConfig(**config), progress=False, seed=3)

    ref = [searcher().solve(x) for x in inputs]
    peak = max(r.stats["peak_kv_bytes"] for r in searcher().solve_many(inputs, concurrency=3))
    for concurrency, budget in ((1, None), (3, None), (3, peak // 4)):
        s = searcher(step_tokens=chunk, cache_budget=budget)
        engine = s.shared_engine()  # kept for solve_many (keep_cache)
        engine.scheduler.on_step = engine.store.check_invariants
        assert_same_searches(ref, list(s.solve_many(inputs, concurrency=concurrency)))
        assert engine.store.reserved == 0
        if budget is not None:
            assert engine.store.peak_bytes <= budget


@given(
    words=st.lists(st.integers(0, 40), min_size=1, max_size=4),
    chunk=st.integers(1, 40),
    tokens=st.integers(1, 20),
    budget=st.sampled_from([None, 1.2, 2.0]),
)
@settings(max_examples=15, deadline=None)
def test_any_chunk_size_and_prompt_lengths_give_the_tokens_of_one_part(tiny_lm, words, chunk, tokens, budget):
    """Rows of random prompt lengths, sampled with own seeds, at a random chunk size and budget:
    the tokens and the work equal one part's, every step's parts fit in it, and each row's context
    is counted once (prefilled or reused, recomputation apart)."""
    prompts = [f"row {i}: " + " ".join(f"v{j}" for j in range(n)) for i, n in enumerate(words)]
    sampling = Sampling(max_new_tokens=tokens, temperature=0.9, ignore_eos=True)
    seeds = list(range(len(prompts)))
    ref_stats = [Stats() for _ in prompts]
    ref = Engine(tiny_lm).generate(prompts, sampling, seeds=seeds, stats=ref_stats)
    n = max(len(Engine(tiny_lm).tokenize(p)) for p in prompts)
    nbytes = None if budget is None else int(budget * (n + tokens) * tiny_lm.kv_bytes_per_token)
    eng = Engine(tiny_lm, RKSCConfig(step_tokens=chunk, cache_budget=nbytes))
    eng.scheduler.on_step = eng.store.check_invariants
    sizes = _spy_prefill(eng)
    stats = [Stats() for _ in prompts]
    got = eng.generate(prompts, sampling, seeds=seeds, stats=stats)
    assert [g.token_ids for g in got] == [g.token_ids for g in ref]
    assert all(size <= chunk for size in sizes)
    assert [work(s) for s in stats] == [work(s) for s in ref_stats]
    for s, p in zip(stats, prompts):
        assert_context_counted(s, len(eng.tokenize(p)), nbytes)
    assert eng.store.reserved == 0 and not eng.scheduler.rows_held()
    if nbytes is not None:
        assert eng.store.peak_bytes <= nbytes
