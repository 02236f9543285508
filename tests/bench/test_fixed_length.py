"""Fixed-length generation (`Sampling(ignore_eos=True)`): neither EOS nor a stop string ends a row;
and the bench on a dummy model generates fixed lengths and says so."""

from __future__ import annotations

import json

import pytest

from treesearch import Engine, RKSCConfig, Sampling
from treesearch.cli.bench import main as bench_main
from treesearch.common.errors import UsageError


def _first_greedy_token(tiny_lm, prompt: str) -> int:
    return Engine(tiny_lm, RKSCConfig()).generate([prompt], Sampling(max_new_tokens=1))[0].token_ids[0]


def test_ignore_eos_generates_past_an_eos_token(tiny_lm):
    prompt = "Count: one two three"
    first = _first_greedy_token(tiny_lm, prompt)
    eng = Engine(tiny_lm, RKSCConfig())
    eng.eos_ids = {first}  # the token greedy decoding writes first is this engine's EOS
    stopped = eng.generate([prompt], Sampling(max_new_tokens=5))[0]
    fixed = eng.generate([prompt], Sampling(max_new_tokens=5, ignore_eos=True))[0]
    assert (stopped.token_ids, stopped.finish) == ([first], "eos")
    assert len(fixed.token_ids) == 5 and fixed.token_ids[0] == first and fixed.finish == "length"


def test_ignore_eos_generates_past_a_stop_string(tiny_lm):
    prompt = "Count: one two three"
    eng = Engine(tiny_lm, RKSCConfig())
    free = eng.generate([prompt], Sampling(max_new_tokens=5))[0]
    stop = tiny_lm.tokenizer.decode(free.token_ids[:2], skip_special_tokens=True)
    assert stop.strip(), "the tiny model's first two tokens decode to blank text; pick another prompt"
    stopped = eng.generate([prompt], Sampling(max_new_tokens=5, stop=(stop,)))[0]
    fixed = eng.generate([prompt], Sampling(max_new_tokens=5, stop=(stop,), ignore_eos=True))[0]
    assert stopped.finish == "stop" and len(stopped.token_ids) <= 2
    assert fixed.finish == "length" and fixed.token_ids == free.token_ids


@pytest.mark.slow
def test_bench_branch_on_dummy_llama_1b_runs_fixed_lengths_and_says_so(tmp_path, capsys):
    """The issue's command at tiny sizes: 1 question, 2 branches, 3 tokens each, on the CPU."""
    out = tmp_path / "b.json"
    rc = bench_main(
        [
            "branch",
            "--model",
            "dummy:llama-3.2-1b",
            "--range",
            "0:1",
            "--branches",
            "2",
            "--max-new-tokens",
            "3",
            "--modes",
            "nokv,exact",
            "--dtype",
            "bfloat16",
            "--no-progress",
            "--threads",
            "1",
            "--json",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert rc == 0
    assert "note: dummy:llama-3.2-1b has random weights: fixed lengths" in printed
    assert "every generation runs its full length" in printed
    doc = json.loads(out.read_text())
    assert doc["fixed_length"] is True and doc["model"] == "dummy:llama-3.2-1b" and doc["dtype"] == "bfloat16"
    for mode in ("nokv", "exact"):
        entry = doc["modes"][mode]
        assert entry["status"] == "ok"
        assert entry["generated_tokens"] == 2 * 3  # both branches ran all 3 tokens
        assert entry["verify_calls"] == 2
    assert doc["modes"]["exact"]["reused_tokens"] > 0 == doc["modes"]["nokv"]["reused_tokens"]


def test_game24_refuses_fixed_lengths_and_names_the_workloads_that_run():
    with pytest.raises(UsageError, match="use the branch or tree workload"):
        bench_main(["game24", "--model", "dummy:smollm2-135m", "--range", "900:901"])
