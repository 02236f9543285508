"""`treesearch bench` shows verification (scoring) time with CGEE off and on in one run: the
`cgee` mode (exact + CGEE only) beside `exact`, `verify_s` per mode and its ratio to exact's.
Ratios are checked as arithmetic on the recorded times; no timed assertions."""

from __future__ import annotations

import json

from treesearch.bench import report
from treesearch.bench.modes import Mode, make_mode, parse_modes
from treesearch.bench.results import RunResult
from treesearch.bench.runner import BenchRuns, ModeRuns
from treesearch.cli.bench import main
from treesearch.common.config import RKSCConfig


def _run(wall: float, verify: float, skipped: int) -> RunResult:
    r = RunResult(wall_s=wall, decisions=["a"], correct=[True])
    r.add_stats(
        {
            "prefill_tokens": 10,
            "decode_tokens": 5,
            "verify_calls": 8,
            "verify_skipped": skipped,
            "verify_layers_run": 30 * (8 - skipped),
            "verify_layers_full": 30 * (8 - skipped),
            "verify_s": verify / 2,
        }
    )
    r.add_stats({"verify_s": verify / 2})  # a second item: verify_s sums over items
    return r


def test_cgee_mode_is_exact_plus_cgee_only():
    assert parse_modes("exact,cgee") == ["exact", "cgee"]
    mode = make_mode("cgee")
    assert mode.config == RKSCConfig(kv_sharing="exact", cgee=True)
    assert mode.config.cache_budget is None


def test_verify_time_ratio_and_the_side_by_side_line():
    runs = BenchRuns()
    runs.modes["exact"] = ModeRuns(Mode("exact", RKSCConfig()), [_run(10.0, 6.0, 0), _run(12.0, 8.0, 0)])
    runs.modes["cgee"] = ModeRuns(Mode("cgee", RKSCConfig(cgee=True)), [_run(9.0, 3.0, 2), _run(9.5, 3.5, 2)])
    doc = report.build(runs, {"workload": "game24"})
    m = doc["modes"]
    assert m["exact"]["verify_s_runs"] == [6.0, 8.0] and m["exact"]["verify_s"] == 7.0
    assert m["cgee"]["verify_s"] == 3.25
    assert m["cgee"]["verify_speedup_vs_exact"] == 7.0 / 3.25
    assert m["exact"]["verify_speedup_vs_exact"] == 1.0
    assert all(
        r.stats == runs.modes["cgee"].runs[-1].stats for r in runs.modes["cgee"].runs
    )  # no time in counters
    text = report.markdown(doc)
    assert "| 7.00 | 1.00x |" in text and "| 3.25 | 2.15x |" in text
    assert (
        "Verification (scoring) time, CGEE off (exact) vs on (cgee), same run: 7.00 s vs 3.25 s, off / on = "
        "2.15x (> 1: CGEE verified faster) (verify calls skipped 2 of 8, layers run 180 of 180)"
    ) in text
    json.dumps(doc)


def test_exact_and_cgee_in_one_run_tiny(tmp_path, capsys):
    """End to end on the branch workload (the tiny model writes no legal Game of 24 move, so its
    game24 searches verify nothing); game24 runs the same report code."""
    out = tmp_path / "g.json"
    assert (
        main(
            [
                "branch",
                "--task",
                "arc_challenge",
                "--range",
                "0:1",
                "--model",
                "tiny",
                "--modes",
                "exact,cgee",
                "--branches",
                "2",
                "--max-new-tokens",
                "6",
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
    ex, cg = doc["modes"]["exact"], doc["modes"]["cgee"]
    assert ex["status"] == cg["status"] == "ok"
    # the tiny model has no calibration: CGEE stays inactive, so cgee does exactly exact's work
    assert any("UNCALIBRATED" in n for n in cg["notes"])
    for k in (
        "verify_calls",
        "verify_skipped",
        "verify_layers_run",
        "verify_layers_full",
        "prefill_tokens",
        "decode_tokens",
    ):
        assert cg[k] == ex[k], k
    assert cg["verify_calls"] == 2 and cg["verify_skipped"] == 0 and cg["verify_layers_run"] == 2 * 4
    assert cg["decisions"] == ex["decisions"]
    assert ex["verify_s"] > 0 and cg["verify_s"] > 0
    assert cg["verify_speedup_vs_exact"] == ex["verify_s"] / cg["verify_s"]
    assert "Verification (scoring) time, CGEE off (exact) vs on (cgee)" in capsys.readouterr().out


def test_search_stats_time_the_verifier(tiny_lm):
    from reliability_problems import Words

    from strategies import BFS
    from treesearch import Searcher

    lm_valued = Searcher(tiny_lm, Words(width=2, depth=1), BFS(breadth=2), progress=False).solve("cats").stats
    assert lm_valued["verify_calls"] == 2 and lm_valued["verify_s"] > 0
    programmatic = (
        Searcher(tiny_lm, Words(width=2, depth=1, lm_value=False), BFS(breadth=2), progress=False)
        .solve("cats")
        .stats
    )
    assert programmatic["verify_calls"] == 0 and programmatic["verify_s"] == 0.0
