"""Determinism: the same seed, model and config build the same tree — greedy and sampled
(temperature 0.7, two samples per expansion), twice in one process and in two fresh processes.
A different seed changes the sampled tree (so the comparison can fail). That KV sharing leaves
the sampled tree unchanged is checked in tests/engine/test_lossless.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from reliability_problems import (
    Words,
    one_thread,  # noqa: F401  (an autouse fixture)
    tree_data,
)

from strategies import BFS
from treesearch import RKSCConfig, Searcher

CASES = {"greedy": dict(temperature=0.0, samples=1), "sampled": dict(temperature=0.7, samples=2)}


def run(lm, case: str, seed: int = 0, kv: str = "exact") -> dict:
    problem = Words(depth=3, **CASES[case])
    res = Searcher(lm, problem, BFS(breadth=2), RKSCConfig(kv_sharing=kv), seed=seed, progress=False).solve(
        "cats"
    )
    data = tree_data(res, problem)
    return {
        "tree": data,
        "best": res.best,
        "answer": res.answer,
        "stats": {
            k: res.stats[k] for k in ("prefill_tokens", "reused_tokens", "decode_tokens", "unique_tokens")
        },
    }


SCRIPT = textwrap.dedent("""
    import json, sys
    sys.path[:0] = [sys.argv[1], sys.argv[1] + "/..", sys.argv[1] + "/../.."]  # its folder, tests/, the repo
    import torch
    torch.set_num_threads(int(sys.argv[2]))
    from treesearch import tiny_model
    from test_determinism import run
    lm = tiny_model(seed=0)
    print(json.dumps({case: run(lm, case) for case in ("greedy", "sampled")}))
""")


@pytest.mark.parametrize("case", list(CASES))
def test_same_seed_same_tree_in_one_process(tiny_lm, case):
    a, b = run(tiny_lm, case), run(tiny_lm, case)
    assert a == b
    assert len(a["tree"]["nodes"]) > 10


def test_sampling_depends_on_the_seed(tiny_lm):
    a, b = run(tiny_lm, "sampled", seed=0), run(tiny_lm, "sampled", seed=1)
    assert [n["thought"] for n in a["tree"]["nodes"]] != [n["thought"] for n in b["tree"]["nodes"]]


def test_same_seed_same_tree_in_two_processes(tiny_lm, tmp_path):
    script = tmp_path / "determinism_run.py"
    script.write_text(SCRIPT)
    tests = str(Path(__file__).resolve().parent)
    procs = [
        subprocess.Popen([sys.executable, str(script), tests, "1"], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    first, second = (json.loads(o) for o in outs)
    assert first == second
    here = {case: run(tiny_lm, case) for case in CASES}
    assert json.loads(json.dumps(here)) == first  # the same tree in this process too
