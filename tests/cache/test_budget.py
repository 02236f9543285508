"""The KV cache budget end to end. Load: a search of more than 2,000 nodes under a tight KV budget
(about a tenth of what the unbounded run holds) completes with the budget respected, every node's
text and token context kept, and counters that add up. Also: a budget too small for the root
prompt (the one thing that must stay cached) fails at the start with the minimum named, in one
line from the command line, and that minimum runs the search.

Runs torch single-threaded (restored afterwards): on a shared 2-core machine torch's spinning
worker threads multiply wall time several-fold without changing a result.
"""

from __future__ import annotations

import re
import time

import pytest
from reliability_problems import (
    Words,
    one_thread,  # noqa: F401  (an autouse fixture)
)

from strategies import BFS
from treesearch import CacheBudgetError, RKSCConfig, Searcher

BUDGET = 4_000_000  # bytes; the same search unbounded peaks at 40.4 MB of K/V


def proc_status() -> dict[str, int]:
    """VmRSS / VmHWM of this process in kB, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0])
    return out


def context_ids(handle) -> list[int]:
    seg, used = handle
    return [t for s, u in seg.context_chain(used) for t in s.tokens[:u]]


def test_two_thousand_nodes_under_a_tight_budget(tiny_lm, one_thread, capsys):  # noqa: F811
    problem = Words(width=16, depth=5, max_new_tokens=4)
    s = Searcher(
        tiny_lm, problem, BFS(breadth=40), RKSCConfig(kv_sharing="exact", cache_budget=BUDGET), progress=False
    )
    before = proc_status()
    t0 = time.perf_counter()
    res = s.solve("cats")
    wall = time.perf_counter() - t0
    after = proc_status()
    tree, st, store = res.tree, res.stats, s.engine.store
    with capsys.disabled():
        print(
            f"\nload: {len(tree)} nodes, budget {BUDGET} B, peak held {store.peak_held} B, evicted blocks "
            f"{st['evicted_blocks']}, recomputed {st['recomputed_tokens']} tokens, RSS {before['VmRSS']} -> "
            f"{after['VmRSS']} kB (peak {after['VmHWM']} kB), {wall:.1f} s"
        )
    assert len(tree) == 2193
    # the budget held and really was tight
    assert store.peak_held <= BUDGET and store.bytes_held <= BUDGET
    assert store.peak_held > 0.95 * BUDGET and st["evicted_blocks"] > 100 and st["recomputed_tokens"] > 0
    store.check_invariants()
    # no node text lost: every thought came from its parent's kept generation
    for n in tree.graph:
        if n == tree.root:
            continue
        d, parent = tree.node(n), tree.node(tree.parent(n))
        (gen,) = parent["generations"]
        assert d["thought"] in [w[:24] for w in gen.split()] or re.fullmatch(r"#\d+", d["thought"])
        # the token context survives eviction: prompt ids, then at most max_new_tokens - 1 fed back
        prompt_ids = s.engine.tokenize(problem.expand_prompt(parent["state"]))
        ids = context_ids(d["kv"])
        assert ids[: len(prompt_ids)] == prompt_ids and len(ids) - len(prompt_ids) <= 3
    # counters: prefill + reused covers every prompt the model was given
    expanded = [n for n in tree.graph if "generations" in tree.node(n)]
    gen_prompt_tokens = sum(
        len(s.engine.tokenize(problem.expand_prompt(tree.node(n)["state"]))) for n in expanded
    )
    value_prompts = {
        problem.value_prompt(tree.node(n)["state"]) for n in tree.graph if "label_probs" in tree.node(n)
    }
    score_prompt_tokens = sum(len(s.engine.tokenize(q)) for q in value_prompts)
    assert len(value_prompts) == len(tree) - 1
    assert st["prefill_tokens"] + st["reused_tokens"] >= gen_prompt_tokens + score_prompt_tokens
    assert st["decode_tokens"] == st["generated_tokens"] - len(expanded)
    assert st["unique_tokens"] <= st["prefill_tokens"] + st["decode_tokens"]
    assert after["VmRSS"] - before["VmRSS"] < 1_000_000  # < 1 GB growth: nothing unbounded held


def test_counters_are_exact_without_sharing(tiny_lm, one_thread):  # noqa: F811
    """kv_sharing="off": prefill is exactly the prompts' tokens, nothing reused."""
    problem = Words(width=4, depth=3, max_new_tokens=4)
    s = Searcher(tiny_lm, problem, BFS(breadth=4), RKSCConfig(kv_sharing="off"), progress=False)
    tree, st = (r := s.solve("cats")).tree, r.stats
    expanded = [n for n in tree.graph if "generations" in tree.node(n)]
    gen = sum(len(s.engine.tokenize(problem.expand_prompt(tree.node(n)["state"]))) for n in expanded)
    val = sum(
        len(s.engine.tokenize(q))
        for q in {
            problem.value_prompt(tree.node(n)["state"]) for n in tree.graph if "label_probs" in tree.node(n)
        }
    )
    assert st["reused_tokens"] == 0 and st["prefill_tokens"] == gen + val
    assert st["decode_tokens"] == st["generated_tokens"] - len(expanded)


def test_a_budget_below_the_root_prompt_fails_at_start_and_raising_it_to_the_named_minimum_runs_the_search(
    tiny_lm, tmp_path, monkeypatch, capsys
):
    """Too small a budget is refused before the first forward, naming the minimum (the root
    prompt's blocks and the batch buffer that computes it); `treesearch solve` says so in one line
    (exit status 2). A search's later prompts may be longer: a budget that fits the start may stop
    the search later, again naming what that call needs, with the nodes found so far kept. Raising
    it to each named minimum ends in the unbounded tree, with what did not fit recomputed."""
    problem = Words(width=4, depth=2, max_new_tokens=4)

    def run(budget):
        return Searcher(
            tiny_lm, problem, BFS(breadth=4), RKSCConfig(cache_budget=budget), progress=False
        ).solve("cats")

    with pytest.raises(CacheBudgetError, match=r"cache_budget=5000 bytes cannot run this call") as info:
        run(5_000)
    assert info.value.partial_result.stats["model_calls"] == 0  # refused before any forward
    need = int(re.search(r"at least (\d+) bytes", str(info.value)).group(1))
    assert need > 5_000
    with pytest.raises(CacheBudgetError, match=f"at least {need} bytes"):
        run(need - 1)
    full = run(None)
    for _ in range(10):
        try:
            tight = run(need)
            break
        except CacheBudgetError as exc:
            later = int(re.search(r"at least (\d+) bytes", str(exc)).group(1))
            assert later > need and exc.partial_result.stats["model_calls"] > 0
            need = later
    assert [(n, d["thought"], d["status"]) for n, d in tight.tree.graph.nodes(data=True)] == [
        (n, d["thought"], d["status"]) for n, d in full.tree.graph.nodes(data=True)
    ]
    assert tight.stats["recomputed_tokens"] > 0 and full.stats["recomputed_tokens"] == 0
    assert tight.stats["peak_kv_bytes"] <= need < full.stats["peak_kv_bytes"]

    from treesearch.cli.main import main

    monkeypatch.chdir(tmp_path)  # where a partial search would be saved
    argv = ["solve", "game24", "4 5 6 10", "--model", "tiny", "--no-progress", "--cache-budget", "1000"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1  # one line
    assert err.startswith("treesearch: error: cache_budget=1000 bytes cannot run this call")
    assert "raise --cache-budget to at least" in err
    assert list(tmp_path.iterdir()) == []  # nothing searched, so no partial file
