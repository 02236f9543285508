"""Invariant 1: with kv_sharing="exact" every generation and score equals kv_sharing="off"."""

from __future__ import annotations

import pytest

from treesearch import Engine, RKSCConfig, Sampling

LABELS = [" sure", " likely", " impossible"]


def _run_both(lm, prompts, sampling, score_prompts=None):
    out = {}
    for mode in ("off", "exact"):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode))
        gens = eng.generate(prompts, sampling)
        scores = eng.score(score_prompts or prompts, LABELS)
        eng.store.check_invariants()
        out[mode] = (gens, scores, eng.stats)
    return out


def _assert_same(out):
    (g_off, s_off, _), (g_ex, s_ex, _) = out["off"], out["exact"]
    assert [g.token_ids for g in g_ex] == [g.token_ids for g in g_off]
    for a, b in zip(s_off, s_ex):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)
            assert b.raw[lab] == pytest.approx(a.raw[lab], abs=1e-4)


@pytest.mark.parametrize("prefix_words", [0, 1, 7, 16, 40])
def test_exact_generation_and_scores_equal_off_for_shared_prefixes_of_several_lengths(tiny_lm, prefix_words):
    prefix = " ".join(f"w{i}" for i in range(prefix_words))
    prompts = [prefix + f" branch {k}: the number is {k * 7}" for k in range(4)]
    _assert_same(_run_both(tiny_lm, prompts, Sampling(max_new_tokens=12)))


def test_divergence_inside_a_block_reuses_the_tokens_before_it(tiny_lm):
    base = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho"
    prompts = [base + " sigma tau", base[:40] + " upsilon phi chi psi omega"]
    out = _run_both(tiny_lm, prompts, Sampling(max_new_tokens=10))
    _assert_same(out)
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing="exact"))
    eng.generate([prompts[0]], Sampling(max_new_tokens=2))
    second = eng.generate([prompts[1]], Sampling(max_new_tokens=2))[0]
    common = 0
    a, b = eng.tokenize(prompts[0]), eng.tokenize(prompts[1])
    while a[common] == b[common]:
        common += 1
    assert common % eng.config.block_size != 0  # the divergence is inside a block
    assert second.reused_tokens == common


def test_batches_whose_members_have_different_lengths_match_off(tiny_lm):
    prompts = [
        "short",
        "a somewhat longer prompt with more words in it",
        "mid length prompt here",
        "short",
        "x " * 50,
    ]
    _assert_same(_run_both(tiny_lm, prompts, Sampling(max_new_tokens=9)))


def test_sampled_generation_is_identical_in_both_modes(tiny_lm):
    prompts = ["the same prompt for every sample"] * 4 + ["another one"]
    out = _run_both(tiny_lm, prompts, Sampling(max_new_tokens=8, temperature=0.9, top_p=0.9, seed=3))
    _assert_same(out)
    assert len({tuple(g.token_ids) for g in out["exact"][0][:4]}) > 1  # samples differ from each other


def test_chain_style_child_reuses_parent_generation(tiny_lm):
    eng = Engine(tiny_lm, RKSCConfig(kv_sharing="exact"))
    parent = "Question: what is two plus two?\nStep:"
    g = eng.generate([parent], Sampling(max_new_tokens=6))[0]
    child = parent + tiny_lm.tokenizer.decode(g.token_ids) + "\nStep:"
    g2 = eng.generate([child], Sampling(max_new_tokens=3))[0]
    # everything but the last generated token (never fed back) comes from the cache
    assert g2.reused_tokens == len(eng.tokenize(parent)) + len(g.token_ids) - 1


def test_off_mode_reuses_nothing_and_exact_counts_are_consistent(tiny_lm):
    prompts = ["common prefix of some length, then A", "common prefix of some length, then B"]
    out = _run_both(tiny_lm, prompts, Sampling(max_new_tokens=5))
    off, ex = out["off"][2], out["exact"][2]
    assert off.reused_tokens == 0
    assert ex.prefill_tokens + ex.reused_tokens == off.prefill_tokens
    assert ex.decode_tokens == off.decode_tokens
    assert ex.unique_tokens == off.unique_tokens


@pytest.mark.real_model
def test_real_model_exact_equals_off_on_a_few_shot_template(real_lm):
    from treesearch.tasks import Game24

    g = Game24()
    states = [g.initial_state(p) for p in ("4 5 6 10", "1 1 4 6", "2 3 5 12")]
    prompts = [g.expand_prompt(s) for s in states]
    values = [g.value_prompt(s) for s in states]
    out = _run_both(real_lm, prompts, Sampling(max_new_tokens=24, stop=("\n\n",)), values)
    _assert_same(out)
    assert out["exact"][2].prefill_tokens < out["off"][2].prefill_tokens / 2
