"""Invariant 1: with kv_sharing="exact" every generation and score equals kv_sharing="off", and a
search builds the same tree (also sampled, and under a budget that forces eviction and recompute).

Each case takes a `device`: the CPU always, and a CUDA GPU marked `cuda` (skipped without one;
`TREESEARCH_TEST_DEVICE=cpu` runs the `cuda` cases on the CPU, which is how
`scripts/device-check --cpu` tests them on a machine without a GPU)."""

from __future__ import annotations

import os

import pytest
import torch

from treesearch import Engine, RKSCConfig, Sampling, Searcher, load_model

# every case on both prefill paths: the decoder's packed layers (the default) and the transformers layers
pytestmark = pytest.mark.usefixtures("prefill_path")
LABELS = [" sure", " likely", " impossible"]
ACCELERATOR = os.environ.get("TREESEARCH_TEST_DEVICE", "cuda")
DEVICES = [
    "cpu",
    pytest.param(
        ACCELERATOR,
        id="cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(
                ACCELERATOR.startswith("cuda") and not torch.cuda.is_available(),
                reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
                "TREESEARCH_TEST_DEVICE=cpu runs the cuda cases on the CPU",
            ),
        ],
    ),
]
_ON_DEVICE: dict = {}


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture
def lm(device, tiny_lm):
    """The tiny model (the same weights as `tiny_lm`) on `device`, loaded once per device."""
    if device == "cpu":
        return tiny_lm
    if device not in _ON_DEVICE:
        _ON_DEVICE[device] = load_model("tiny", device=device)
    return _ON_DEVICE[device]


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
    (g_off, s_off, _), (g_ex, s_ex, st_ex) = out["off"], out["exact"]
    assert [g.token_ids for g in g_ex] == [g.token_ids for g in g_off]
    for a, b in zip(s_off, s_ex):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)
            assert b.raw[lab] == pytest.approx(a.raw[lab], abs=1e-4)
    assert st_ex.reused_tokens > 0  # the comparison exercised the shared path


@pytest.mark.parametrize("prefix_words", [0, 1, 7, 16, 40])
def test_exact_generation_and_scores_equal_off_for_shared_prefixes_of_several_lengths(lm, prefix_words):
    prefix = " ".join(f"w{i}" for i in range(prefix_words))
    prompts = [prefix + f" branch {k}: the number is {k * 7}" for k in range(4)]
    _assert_same(_run_both(lm, prompts, Sampling(max_new_tokens=12)))


def test_divergence_inside_a_block_reuses_the_tokens_before_it(lm):
    base = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho"
    prompts = [base + " sigma tau", base[:40] + " upsilon phi chi psi omega"]
    out = _run_both(lm, prompts, Sampling(max_new_tokens=10))
    _assert_same(out)
    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    eng.generate([prompts[0]], Sampling(max_new_tokens=2))
    second = eng.generate([prompts[1]], Sampling(max_new_tokens=2))[0]
    common = 0
    a, b = eng.tokenize(prompts[0]), eng.tokenize(prompts[1])
    while a[common] == b[common]:
        common += 1
    assert common % eng.config.block_size != 0  # the divergence is inside a block
    assert second.reused_tokens == common


def test_batches_whose_members_have_different_lengths_match_off(lm):
    prompts = [
        "short",
        "a somewhat longer prompt with more words in it",
        "mid length prompt here",
        "short",
        "x " * 50,
    ]
    _assert_same(_run_both(lm, prompts, Sampling(max_new_tokens=9)))


def test_sampled_generation_is_identical_in_both_modes(lm):
    prompts = ["the same prompt for every sample"] * 4 + ["another one"]
    out = _run_both(lm, prompts, Sampling(max_new_tokens=8, temperature=0.9, top_p=0.9, seed=3))
    _assert_same(out)
    assert len({tuple(g.token_ids) for g in out["exact"][0][:4]}) > 1  # samples differ from each other


def test_chain_style_child_reuses_parent_generation(lm):
    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    parent = "Question: what is two plus two?\nStep:"
    g = eng.generate([parent], Sampling(max_new_tokens=6))[0]
    child = parent + lm.tokenizer.decode(g.token_ids) + "\nStep:"
    g2 = eng.generate([child], Sampling(max_new_tokens=3))[0]
    # everything but the last generated token (never fed back) comes from the cache
    assert g2.reused_tokens == len(eng.tokenize(parent)) + len(g.token_ids) - 1


def test_off_mode_reuses_nothing_and_exact_counts_are_consistent(lm):
    prompts = ["common prefix of some length, then A", "common prefix of some length, then B"]
    out = _run_both(lm, prompts, Sampling(max_new_tokens=5))
    off, ex = out["off"][2], out["exact"][2]
    assert off.reused_tokens == 0
    assert ex.prefill_tokens + ex.reused_tokens == off.prefill_tokens
    assert ex.decode_tokens == off.decode_tokens
    assert ex.unique_tokens == off.unique_tokens


def _same_tree(a, b):
    na, nb = a.tree.graph.nodes, b.tree.graph.nodes
    assert sorted(a.tree.graph.edges) == sorted(b.tree.graph.edges)
    for n in na:
        assert (nb[n]["thought"], nb[n]["state"], nb[n]["status"]) == (
            na[n]["thought"],
            na[n]["state"],
            na[n]["status"],
        )
        if na[n]["score"] is None:
            assert nb[n]["score"] is None
        else:
            assert nb[n]["score"] == pytest.approx(na[n]["score"], abs=1e-4)
    assert a.answer == b.answer


def test_a_sampled_search_builds_the_same_tree_with_sharing_and_under_a_tight_budget(lm):
    """Sampling is unchanged by sharing: chain-style GSM8K (two samples per expansion, temperature
    0.7) with kv_sharing off, exact, and exact under a budget that forces eviction and recompute;
    and the sampled Words problem (temperature 0.7) off and exact: the same trees."""
    from reliability_problems import Words

    from strategies import BFS
    from treesearch.tasks import GSM8K

    def solve(problem, x, config, seed):
        return Searcher(lm, problem, BFS(breadth=2), config, progress=False, seed=seed).solve(x)

    q = {"question": "Ann has 3 bags of 4 pears. How many pears?", "answer": "#### 12"}
    gsm = {
        name: solve(GSM8K(max_steps=3, samples_per_expand=2, max_new_tokens=8), q, config, 7)
        for name, config in (
            ("off", RKSCConfig(kv_sharing="off")),
            ("exact", RKSCConfig(kv_sharing="exact")),
            ("budget", RKSCConfig(kv_sharing="exact", cache_budget=500_000)),
        )
    }
    _same_tree(gsm["off"], gsm["exact"])
    _same_tree(gsm["off"], gsm["budget"])
    assert gsm["exact"].stats["prefill_tokens"] < gsm["off"].stats["prefill_tokens"] / 3
    assert gsm["budget"].stats["evicted_blocks"] > 0 and gsm["budget"].stats["recomputed_tokens"] > 0
    words = {
        kv: solve(Words(depth=3, temperature=0.7, samples=2), "cats", RKSCConfig(kv_sharing=kv), 0)
        for kv in ("off", "exact")
    }
    assert len(words["off"].tree) > 10
    _same_tree(words["off"], words["exact"])


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
