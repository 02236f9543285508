"""`treesearch bench` on tiny inputs with the tiny model: every mode runs, the JSON has every field,
ratios and agreement are computed from the counters as documented. No timed assertions."""

from __future__ import annotations

import json

import pytest

from treesearch.bench import report
from treesearch.bench.branch import weighted_vote
from treesearch.bench.fixed_tree import majority
from treesearch.bench.modes import Mode, parse_modes
from treesearch.bench.results import RunResult
from treesearch.bench.runner import BenchRuns, ModeRuns
from treesearch.cli.bench import main, parse_range
from treesearch.common.config import RKSCConfig
from treesearch.common.errors import UsageError

REQUIRED = (
    "wall_s",
    "prefill_tokens",
    "decode_tokens",
    "reused_tokens",
    "unique_tokens",
    "verify_calls",
    "verify_skipped",
    "peak_kv_bytes",
    "accuracy",
)


# -- pure parts -------------------------------------------------------------------------------------
def _run(wall: float, prefill: int, decode: int, decisions: list[str], correct: list[bool]) -> RunResult:
    r = RunResult(wall_s=wall, decisions=decisions, correct=correct)
    r.add_stats(
        {"prefill_tokens": prefill, "decode_tokens": decode, "reused_tokens": 7, "peak_kv_bytes": 4096}
    )
    return r


def test_report_ratios_medians_and_agreement_from_counters():
    runs = BenchRuns()
    runs.modes["nokv"] = ModeRuns(
        Mode("nokv", RKSCConfig(kv_sharing="off")),
        [
            _run(9.0, 1000, 100, ["a", "b", "c", "d"], [True, False]),
            _run(7.0, 1000, 100, ["a", "b", "c", "d"], [True, False]),
            _run(8.0, 1000, 100, ["a", "b", "c", "d"], [True, False]),
        ],
    )
    runs.modes["exact"] = ModeRuns(
        Mode("exact", RKSCConfig()), [_run(4.0, 300, 100, ["a", "b", "c", "d"], [True, False])]
    )
    runs.modes["rksc"] = ModeRuns(
        Mode("rksc", RKSCConfig(cgee=True)), [_run(2.0, 150, 50, ["a", "x", "c"], [True, True])]
    )
    runs.modes["hf-cb"] = ModeRuns(Mode("hf-cb", None))
    runs.modes["hf-cb"].error = "RuntimeError: no memory"
    doc = report.build(runs, {"workload": "branch"})
    m = doc["modes"]
    assert (
        m["nokv"]["wall_s"] == 8.0
        and m["nokv"]["wall_s_spread"] == 2.0
        and m["nokv"]["wall_s_runs"] == [9.0, 7.0, 8.0]
    )
    assert m["exact"]["speedup_vs_nokv"] == 8.0 / 4.0
    assert m["rksc"]["speedup_vs_nokv"] == 8.0 / 2.0 and m["rksc"]["speedup_vs_exact"] == 4.0 / 2.0
    assert m["exact"]["computed_tokens"] == 400 and m["exact"]["compute_vs_nokv"] == 1100 / 400
    assert m["rksc"]["compute_vs_nokv"] == 1100 / 200
    assert m["nokv"]["accuracy"] == 0.5 and m["rksc"]["accuracy"] == 1.0
    assert doc["agreement"] == {"nokv": 1.0, "exact": 1.0, "rksc": 0.5, "hf-cb": None}  # rksc: a,c of 4
    assert m["hf-cb"]["status"] == "failed" and m["hf-cb"]["reason"] == "RuntimeError: no memory"
    for entry in m.values():
        assert all(k in entry for k in REQUIRED)
    text = report.markdown(doc)
    assert "| hf-cb | failed: RuntimeError: no memory |" in text
    assert m["rksc"]["inputs_per_hour"] == 2 * 3600 / 2.0 and doc["agreement_reference"] == "nokv"
    assert "| rksc | 2.00 ± 0.00 | 3600 | 4.00x | 2.00x | 150 | 50 | 7 |" in text
    json.dumps(doc)


def test_time_outside_forwards_is_wall_minus_busy_per_forward_in_its_own_column():
    timed = _run(5.0, 300, 100, ["a"], [True])
    timed.add_forwards(
        [type("F", (), {"busy_s": 3.5, "forwards": 12})(), type("F", (), {"busy_s": 0.5, "forwards": 3})()]
    )
    runs = BenchRuns()
    runs.modes["exact"] = ModeRuns(Mode("exact", RKSCConfig()), [timed])
    runs.modes["server"] = ModeRuns(Mode("server", RKSCConfig()), [_run(6.0, 300, 100, ["a"], [True])])
    doc = report.build(runs, {"workload": "game24"})
    ex, sv = doc["modes"]["exact"], doc["modes"]["server"]
    assert (ex["forward_s"], ex["forwards"], ex["outside_s"]) == (4.0, 15, 5.0 - 4.0)
    assert ex["outside_per_forward_ms"] == 1000.0 * (5.0 - 4.0) / 15
    assert sv["forward_s"] is None and sv["outside_per_forward_ms"] is None  # not counted: no column value
    text = report.markdown(doc).splitlines()
    header = next(line for line in text if line.startswith("| mode |"))
    assert header.rstrip(" |").endswith("outside forwards ms/call")
    assert next(line for line in text if line.startswith("| exact |")).endswith(f"| {1000.0 / 15:.2f} |")
    assert next(line for line in text if line.startswith("| server |")).endswith("| — |")


def test_ratio_and_agreement_edge_cases():
    assert report.ratio(None, 2.0) is None and report.ratio(3.0, 0) is None and report.ratio(3.0, 2.0) == 1.5
    assert report.agreement([], []) is None
    assert report.agreement(["a", "b"], ["a", "b", "c"]) == 2 / 3


def test_votes():
    assert weighted_vote(["3", "4", "3", None], [0.2, 0.9, 0.3, 5.0]) == "4"
    assert weighted_vote(["3", "4"], [0.5, 0.5]) == "3"  # tie: first reached
    assert weighted_vote([None, None], [1.0, 1.0]) is None
    assert majority(["7", "8", "8", "7", None]) == "7"  # tie 2-2: first reached
    assert majority(["1", "2", "2"]) == "2"


def test_cli_parsing():
    assert parse_modes("exact, nokv,exact") == ["exact", "nokv"]
    with pytest.raises(UsageError, match="unknown mode"):
        parse_modes("nokv,vllm")
    assert parse_range(None, "game24") == (900, 903)
    assert parse_range("3:7", "branch") == (3, 7)
    with pytest.raises(UsageError, match="START:END"):
        parse_range("3-7", "branch")


# -- end to end on the tiny model -------------------------------------------------------------------
def test_branch_all_modes_tiny(tmp_path, capsys):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    rc = main(
        [
            "branch",
            "--task",
            "arc_challenge",
            "--range",
            "0:1",
            "--model",
            "tiny",
            "--branches",
            "2",
            "--max-new-tokens",
            "6",
            "--json",
            str(out),
            "--plot",
            str(png),
            "--no-progress",
            "--threads",
            "1",
        ]
    )
    assert rc == 0
    doc = json.loads(out.read_text())
    m = doc["modes"]
    assert list(m) == ["nokv", "exact", "rksc", "hf-cb"]
    for name in ("nokv", "exact", "rksc"):
        assert m[name]["status"] == "ok", m[name]["reason"]
        assert all(m[name][k] is not None for k in REQUIRED), name
        assert m[name]["speedup_vs_nokv"] == m["nokv"]["wall_s"] / m[name]["wall_s"]
        assert m[name]["speedup_vs_exact"] == m["exact"]["wall_s"] / m[name]["wall_s"]
        assert m[name]["compute_vs_nokv"] == (m["nokv"]["prefill_tokens"] + m["nokv"]["decode_tokens"]) / (
            m[name]["prefill_tokens"] + m[name]["decode_tokens"]
        )
    assert m["hf-cb"]["status"] == "ok" and m["hf-cb"]["wall_s"] > 0
    # same generations in every engine mode; sharing only changes what is recomputed
    assert m["nokv"]["decode_tokens"] == m["exact"]["decode_tokens"] == m["rksc"]["decode_tokens"]
    assert m["nokv"]["reused_tokens"] == 0 < m["exact"]["reused_tokens"]
    assert m["exact"]["prefill_tokens"] < m["nokv"]["prefill_tokens"]
    assert m["nokv"]["verify_calls"] == m["exact"]["verify_calls"] == 2
    assert doc["agreement"]["nokv"] == 1.0 and doc["agreement"]["exact"] == 1.0
    assert m["exact"]["decisions_total"] == 3  # 2 branch answers + the vote
    rp = doc["replay"]
    assert rp["exact"]["requests"] == rp["hf-cb"]["requests"] == 2
    assert rp["token_agreement"] == 1.0  # greedy, same ids: transformers and our engine agree
    assert rp["throughput_exact_over_hf"] == rp["exact"]["tokens_per_s"] / rp["hf-cb"]["tokens_per_s"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| exact |" in capsys.readouterr().out


def test_tree_and_game24_shapes_tiny(tmp_path):
    out = tmp_path / "t.json"
    assert (
        main(
            [
                "tree",
                "--range",
                "0:1",
                "--model",
                "tiny",
                "--modes",
                "nokv,exact",
                "--max-new-tokens",
                "2",
                "--json",
                str(out),
                "--no-progress",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["modes"]["exact"]["decisions_total"] == 28  # 27 leaves + the majority
    assert doc["agreement"] == {"nokv": 1.0, "exact": 1.0}
    assert doc["modes"]["nokv"]["decode_tokens"] == doc["modes"]["exact"]["decode_tokens"]
    assert doc["modes"]["exact"]["reused_tokens"] > 0 == doc["modes"]["nokv"]["reused_tokens"]
    assert doc["replay"] is None
    assert (
        main(
            [
                "game24",
                "--range",
                "900:901",
                "--model",
                "tiny",
                "--modes",
                "exact",
                "--max-new-tokens",
                "4",
                "--json",
                str(out),
                "--no-progress",
                "--threads",
                "1",
            ]
        )
        == 0
    )
    doc = json.loads(out.read_text())
    assert doc["modes"]["exact"]["status"] == "ok" and doc["agreement"] == {"exact": None}
    ex = doc["modes"]["exact"]  # the local engine counted its forwards: the rest of the wall time is its own
    assert ex["forwards"] > 0 and 0 < ex["forward_s"] < ex["wall_s_runs"][-1]
    assert ex["outside_s"] == pytest.approx(ex["wall_s_runs"][-1] - ex["forward_s"])
    assert ex["outside_per_forward_ms"] == pytest.approx(1000 * ex["outside_s"] / ex["forwards"])
