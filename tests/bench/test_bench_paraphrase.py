"""The paraphrase workload and the ASKS gate calibration: wordings, counting, the fit on given records,
the modes on the tiny model, and one small real run with the default model."""

from __future__ import annotations

import json

import pytest

from treesearch.bench.paraphrase import load_items, orders, split_facts, wording
from treesearch.common.config import RKSCConfig, Sampling
from treesearch.common.errors import UsageError
from treesearch.common.intervals import wilson
from treesearch.engine.local import Engine
from treesearch.policies import asks_calibration as asks_gate
from treesearch.policies.asks_calibration import OPEN, SHUT, Record, decide, fit, outcome


# -- wordings ---------------------------------------------------------------------------------------
def test_split_facts_and_the_four_orders():
    facts, q = split_facts("Ann has 3 cats. Bo has 2 more. Each eats 1 can. How many cans?")
    assert facts == ["Ann has 3 cats.", "Bo has 2 more.", "Each eats 1 can."] and q == "How many cans?"
    assert orders(3, 4) == [(0, 1, 2), (2, 1, 0), (1, 2, 0), (2, 0, 1)]
    assert orders(2, 4) == [(0, 1), (1, 0)]  # rotations of two facts repeat the reversal
    w = wording(facts, q, (2, 1, 0))
    assert w.startswith(
        "Facts:\n- Each eats 1 can.\n- Bo has 2 more.\n- Ann has 3 cats.\nQuestion: How many cans?\n"
    )


def test_every_wording_of_a_question_has_the_same_tokens_in_another_order(tiny_lm):
    items, skipped = load_items(0, 40)
    assert len(items) + skipped == 40 and skipped == 7
    for it in items:
        ids = [tiny_lm.tokenizer(w)["input_ids"] for w in it.wordings]
        assert len({len(x) for x in ids}) == 1, it.row  # ASKS pairs only prompts of one length
        assert len({tuple(sorted(x)) for x in ids}) == 1, it.row
        assert len(set(it.wordings)) == len(it.wordings) >= 2


def test_load_items_refuses_one_wording():
    with pytest.raises(UsageError, match="at least 2 wordings"):
        load_items(0, 3, 1)


# -- counting: ASKS's pre-pass is computed, not reused ---------------------------------------------------
def test_reused_counts_attached_tokens_only_and_prefill_plus_reused_is_the_prompt(tiny_lm):
    items, _ = load_items(0, 4)
    prompts = list(items[0].wordings)
    total = sum(len(tiny_lm.tokenizer(p)["input_ids"]) for p in prompts)
    runs = {}
    for name, cfg in (
        ("off", RKSCConfig(kv_sharing="off")),
        ("exact", RKSCConfig()),
        ("open", RKSCConfig(kv_sharing="asks", asks_tau=OPEN)),
        ("shut", RKSCConfig(kv_sharing="asks", asks_tau=SHUT)),
    ):
        e = Engine(tiny_lm, cfg)
        e.generate(prompts, Sampling(max_new_tokens=1))
        runs[name] = e.stats
        assert e.stats.prefill_tokens + e.stats.reused_tokens == total, name
    ex, op, shut = runs["exact"], runs["open"], runs["shut"]
    assert op.asks_attached == len(prompts) - 1 and op.asks_extra_reused > 0
    assert op.reused_tokens == ex.reused_tokens + op.asks_extra_reused
    assert shut.reused_tokens == ex.reused_tokens and shut.asks_attached == 0
    assert runs["off"].reused_tokens == 0


# -- the gate's fit on given records --------------------------------------------------------------------
def _records(n_same: int, n_changed: int, layers: int = 4) -> list[Record]:
    """n_same pairs with cosines 0.99 that kept their answer, n_changed with cosines 0.5 that changed."""
    return [Record((0.99,) * layers, 10, False)] * n_same + [Record((0.5,) * layers, 10, True)] * n_changed


def test_outcome_counts_and_wilson_interval():
    recs = _records(8, 2)
    o = outcome(recs, 0.0, 0.9)
    assert (o["pairs"], o["attached"], o["changed"], o["tokens_reused"]) == (10, 8, 0, 80)
    assert o["changed_wilson95"] == list(wilson(0, 8))
    o = outcome(recs, 0.0, OPEN)
    assert (o["attached"], o["changed"]) == (10, 2) and o["changed_rate"] == 0.2


def test_fit_attaches_the_most_pairs_under_the_bound_and_needs_enough_of_them():
    found = fit(_records(80, 20), target=0.05)
    assert found is not None and found["attached"] == 80 and found["changed"] == 0
    assert 0.5 < found["tau"] <= 0.99 + 1e-9
    assert fit(_records(60, 20), target=0.05) is None  # zero changes in 60 bound the rate at 5.7% only
    assert wilson(0, 73)[1] <= 0.05 < wilson(0, 72)[1]


def test_decide_ships_a_fit_that_holds_out_and_shuts_one_that_does_not():
    ok = decide(_records(80, 20), _records(90, 10))
    assert ok["gate"] == "open" and ok["heldout"]["attached"] == 90 and "rejected" not in ok
    bad_held = _records(60, 0) + [Record((0.99,) * 4, 10, True)] * 10  # high sigma, changed answers
    bad = decide(_records(80, 20), bad_held)
    assert bad["gate"] == "shut" and bad["tau"] == SHUT and bad["heldout"]["attached"] == 0
    assert bad["rejected"]["heldout"]["changed"] == 10 and "Wilson upper" in bad["why"]
    none = decide(_records(10, 5), _records(10, 5))
    assert none["gate"] == "shut" and "no (alpha, tau)" in none["why"]
    assert none["gate_open"]["heldout"]["attached"] == 15


def test_separation_is_the_chance_that_a_kept_pair_has_the_higher_sigma():
    assert asks_gate.separation(_records(8, 2), (0.0,)) == {"0": 1.0}
    same = [Record((0.9,) * 4, 1, False), Record((0.9,) * 4, 1, True)]
    assert asks_gate.separation(same, (0.0, 8.0)) == {"0": 0.5, "8": 0.5}
    assert asks_gate.separation(_records(3, 0), (0.0,)) == {"0": None}


def test_gate_file_is_read_and_named_in_the_mode_note(tmp_path, monkeypatch):
    assert asks_gate.load_gate("no-such-model") is None
    alpha, tau, note = asks_gate.gate_note("no-such-model")
    assert (alpha, tau) == (RKSCConfig().asks_alpha, RKSCConfig().asks_tau) and "UNCALIBRATED" in note
    path = tmp_path / "m.asks.json"
    path.write_text(json.dumps({"alpha": 2.0, "tau": SHUT, "gate": "shut", "why": "too many changes"}))
    monkeypatch.setattr(asks_gate, "gate_path", lambda name, folder=None: path)
    alpha, tau, note = asks_gate.gate_note("m")
    assert (alpha, tau) == (2.0, SHUT) and "gate SHUT: too many changes" in note
    from treesearch.bench.modes import make_mode, rksc_config

    assert make_mode("asks", model_name="m").config.asks_tau == SHUT
    assert rksc_config(None, "m").kv_sharing == "exact"  # a shut gate: rksc is exact + CGEE + budget
    path.write_text(json.dumps({"alpha": 2.0, "tau": 0.9, "gate": "open"}))
    assert rksc_config(None, "m").kv_sharing == "asks" and rksc_config(None, "m").asks_tau == 0.9
    path.write_text(json.dumps({"gate": "open"}))
    with pytest.raises(ValueError, match="rerun treesearch bench calibrate-asks"):
        asks_gate.load_gate("m")


# -- the workload and the command on the tiny model ------------------------------------------------------
def test_paraphrase_bench_all_asks_modes_tiny(tmp_path, capsys):
    from treesearch.cli.bench import main

    out = tmp_path / "p.json"
    assert (
        main(
            [
                "paraphrase",
                "--model",
                "tiny",
                "--range",
                "0:3",
                "--threads",
                "1",
                "--no-progress",
                "--max-new-tokens",
                "4",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    m = doc["modes"]
    assert list(m) == ["nokv", "exact", "asks", "asks-open"] and doc["items"] == 2
    assert m["asks-open"]["asks_attached"] > 0 and m["asks"]["asks_attached"] == 0
    assert m["asks-open"]["reused_tokens"] > m["exact"]["reused_tokens"] > m["nokv"]["reused_tokens"] == 0
    assert doc["agreement_vs_exact"]["exact"] == 1.0 and doc["agreement_vs_exact"]["asks"] == 1.0
    assert len(m["exact"]["decisions"]) == 4 + 2 + 2 + 1 + 1  # 4 + 2 wordings, a vote per question
    assert "ASKS: asks: 0 rows attached" in capsys.readouterr().out


def test_calibrate_asks_writes_the_file_with_its_records_tiny(tmp_path):
    from treesearch.cli.calibrate_asks import main

    out = tmp_path / "tiny.asks.json"
    assert (
        main(
            [
                "--model",
                "tiny",
                "--range",
                "1000:1002",
                "--eval-range",
                "1002:1004",
                "--threads",
                "1",
                "--max-new-tokens",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["gate"] in ("open", "shut") and doc["workload"] == "paraphrase"
    n = len(doc["records"]["calibration"])
    assert n == doc["calibration"]["pairs"] > 0 and doc["gate_open"]["calibration"]["attached"] == n
    assert doc["calibration"]["range"] == "1000:1002" and doc["heldout"]["range"] == "1002:1004"
    if doc["gate"] == "shut":
        assert doc["tau"] == SHUT and doc["why"]
    again = tmp_path / "again.json"  # a refit from the saved records runs no model and decides the same
    assert main(["--records", str(out), "--out", str(again)]) == 0
    redo = json.loads(again.read_text())
    assert {k: redo[k] for k in ("gate", "tau", "alpha", "calibration", "heldout", "records")} == {
        k: doc[k] for k in ("gate", "tau", "alpha", "calibration", "heldout", "records")
    }
    assert redo["command"] == doc["command"] and redo["refit"].endswith(str(out) + " --out " + str(again))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["calibrate-asks", "--range", "0:10"], "overlaps the GSM8K rows 0:200"),
        (
            ["calibrate-asks", "--range", "1000:1010", "--eval-range", "1005:1020"],
            "held-out rows must be other rows",
        ),
        (["calibrate-asks", "--wordings", "5"], "use 2, 3 or 4"),
        (["claims", "--only", "nope"], "choose from game24"),
        (["paraphrase", "--task", "arc_challenge"], "runs on gsm8k only"),
    ],
)
def test_bench_subcommand_errors_are_one_line_exit_2(argv, message, capsys):
    from treesearch.cli import main as cli

    assert cli.main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("treesearch: error:") and message in err and err.count("\n") == 1


# -- one small real run ------------------------------------------------------------------------------
@pytest.mark.real_model
def test_paraphrase_real_model_asks_open_reuses_more_than_exact(real_lm):
    from treesearch.bench import report
    from treesearch.bench.runner import run_all
    from treesearch.bench.workloads import make_workload

    w = make_workload("paraphrase", None, 0, 2, max_new_tokens=8)
    doc = report.build(run_all(real_lm, w, ["exact", "asks", "asks-open"]), {"workload": "paraphrase"})
    m = doc["modes"]
    # the generate call attaches every wording but the first; verification prompts of equal length (the
    # reasoning hit max_new_tokens) pair too, on the tokens after the reasoning
    assert m["asks-open"]["asks_attached"] >= sum(len(it.wordings) - 1 for it in w.items) == 3
    assert (
        m["asks-open"]["asks_extra_reused"] > 0
        and m["asks-open"]["reused_tokens"] > m["exact"]["reused_tokens"]
    )
    assert m["asks-open"]["prefill_tokens"] < m["exact"]["prefill_tokens"]
    assert 0.0 <= doc["agreement_vs_exact"]["asks-open"] <= 1.0
