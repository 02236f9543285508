"""`treesearch bench threads` measures each (wait policy, machine) in its own process, the policy
really in force there, and prints the six rows and their ratios (figures never asserted)."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_threads_runs_each_policy_quiet_and_busy_and_prints_the_ratios(tmp_path):
    argv = ["bench", "threads", "--tokens", "2", "--rows", "1", "--rounds", "1", "--threads", "1"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "treesearch.cli.main",
            *argv,
            "--busy",
            "spin",
            "--json",
            str(tmp_path / "t.json"),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    *rows, last = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert [(r["policy"], r["machine"], r["busy"]) for r in rows] == [
        ("default", "quiet", None),
        ("passive", "quiet", None),
        ("bounded", "quiet", None),
        ("default", "busy", "spin"),
        ("passive", "busy", "spin"),
        ("bounded", "busy", "spin"),
    ]
    assert [(r["omp_wait_policy"], r["gomp_spincount"]) for r in rows] == 2 * [
        (None, None),
        ("PASSIVE", None),
        (None, "10000"),
    ]
    assert all(r["s_per_call"] > 0 and r["calls"] == 1 and r["torch_threads"] == 1 for r in rows)
    assert set(last["ratios"]) == {
        "passive/default quiet",
        "passive/default busy",
        "bounded/default quiet",
        "bounded/default busy",
        "busy/quiet default",
        "busy/quiet passive",
        "busy/quiet bounded",
    }
    assert json.loads((tmp_path / "t.json").read_text()) == {"rows": rows, "ratios": last["ratios"]}
