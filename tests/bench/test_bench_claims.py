"""`treesearch bench claims`: the verdict rules on given numbers, the run plan, and the table from a real
(tiny-model) bench document."""

from __future__ import annotations

import json

from treesearch.bench import claims
from treesearch.cli.claims import build_parser, clean_command, main, plan, run_bench, slim


def _entry(**kw) -> dict:
    base = {
        "status": "ok",
        "speedup_vs_nokv": None,
        "speedup_vs_exact": None,
        "verify_calls": 0,
        "verify_skipped": 0,
        "recomputed_tokens": 0,
        "asks_attached": 0,
        "reused_tokens": 0,
        "compute_vs_nokv": None,
        "wall_s": 1.0,
        "computed_tokens": 100,
    }
    return {**base, **kw}


def _doc(command: str = "treesearch bench x", **modes) -> dict:
    return {"command": command, "modes": modes, "agreement_vs_exact": {}}


def test_speed_verdicts():
    assert claims.speed_verdict(2.8, 3.0) == "reproduced"  # within 10%
    assert claims.speed_verdict(2.6, 3.0) == "not reached on this model"
    assert claims.speed_verdict(1.0, 3.0) == "refuted" and claims.speed_verdict(0.8, 1.66) == "refuted"
    assert claims.speed_verdict(None, 3.0) == "not measured"


def test_speedup_rows_use_the_mean_over_workloads_and_name_the_peak():
    docs = {
        "game24": _doc(
            "c1", rksc=_entry(speedup_vs_nokv=4.0, speedup_vs_exact=1.2), exact=_entry(speedup_vs_nokv=3.0)
        ),
        "tree": _doc(
            "c2",
            rksc=_entry(speedup_vs_nokv=2.0, speedup_vs_exact=1.0, recomputed_tokens=7),
            exact=_entry(speedup_vs_nokv=2.0),
        ),
    }
    r = claims.claim_speedup_nokv(docs)
    assert r["value"] == 3.0 and r["verdict"] == "reproduced" and "peak 4.00x (game24)" in r["ours"]
    assert r["command"] == "c1; c2" and r["reason"] == ""
    r = claims.claim_speedup_exact(docs)
    assert r["value"] == 1.1 and r["verdict"] == "not reached on this model"
    assert "exact alone 2.50x mean vs nokv" in r["reason"] and "recomputed 7 tokens" in r["reason"]


def test_asks_rows_with_a_shut_gate_are_not_reached_and_give_the_open_gate_figures():
    docs = {
        "paraphrase": {
            **_doc(
                "p",
                exact=_entry(reused_tokens=1000),
                asks=_entry(reused_tokens=1000, speedup_vs_exact=0.98),
                **{"asks-open": _entry(reused_tokens=1400, asks_attached=9, speedup_vs_exact=1.1)},
            ),
            "agreement_vs_exact": {"asks-open": 0.75},
        },
        "asks_gate": {"gate": "shut", "why": "3 of 40 changed"},
    }
    r = claims.claim_asks_reuse(docs)
    assert r["value"] == 0.0 and r["verdict"] == "not reached on this model"
    assert (
        "3 of 40 changed" in r["reason"] and "reuse +40.0% over exact" in r["reason"] and "75%" in r["reason"]
    )
    r = claims.claim_kv_sharing_alone(docs)
    assert (
        r["value"] == 0.98
        and r["verdict"] == "not reached on this model"
        and "attached nothing" in r["reason"]
    )
    docs["paraphrase"]["modes"]["asks"] = _entry(reused_tokens=1300, asks_attached=5, speedup_vs_exact=1.25)
    assert claims.claim_asks_reuse(docs)["verdict"] == "reproduced"  # +30% >= 0.9 * 28.6%
    assert claims.claim_kv_sharing_alone(docs)["verdict"] == "reproduced"  # 1.25 >= 0.9 * 1.343
    docs["paraphrase"]["modes"]["asks"] = _entry(reused_tokens=1000, asks_attached=5, speedup_vs_exact=0.9)
    assert claims.claim_asks_reuse(docs)["verdict"] == "refuted"
    assert claims.claim_kv_sharing_alone(docs)["verdict"] == "refuted"


def _held(skip: float, errors: int, calls: int, bound: float) -> dict:
    return {
        "skip_rate": skip,
        "layer_fraction": 1.0,
        "call_errors": errors,
        "calls": calls,
        "call_error_upper95": bound,
    }


def test_cgee_row_from_the_calibration_figures():
    off = {
        "tasks": {"game24": {"heldout": _held(0.0, 0, 1015, 0.0036), "rejected": {"why": "1 of 600 steps"}}}
    }
    r = claims.claim_cgee({"cgee_calibration": off})
    assert r["verdict"] == "not reached on this model" and "game24: 1 of 600 steps" in r["reason"]
    assert "0.0% skipped" in r["ours"] and "0 errors in 1015" in r["ours"]
    good = {"tasks": {"arc": {"heldout": _held(0.5, 0, 1000, 0.0036)}}}
    assert claims.claim_cgee({"cgee_calibration": good})["verdict"] == "reproduced"
    bad = {"tasks": {"arc": {"heldout": _held(0.5, 9, 1000, 0.015)}}}
    assert claims.claim_cgee({"cgee_calibration": bad})["verdict"] == "refuted"
    assert claims.claim_cgee({})["verdict"] == "not measured"


def test_across_models_row_compares_the_exact_speedups():
    def model(speed: float, wall: float) -> dict:
        return _doc(
            "m",
            exact=_entry(speedup_vs_nokv=speed, compute_vs_nokv=3.0),
            nokv=_entry(wall_s=wall, computed_tokens=1000),
        )

    same = {"models": {"a": model(2.0, 10.0), "b": model(2.2, 1.0)}}
    assert claims.claim_across_models(same)["verdict"] == "reproduced"
    apart = {"models": {"a": model(2.4, 10.0), "b": model(1.1, 1.0)}}
    r = claims.claim_across_models(apart)
    assert (
        r["verdict"] == "refuted"
        and "a 3.00x, b 3.00x" in r["reason"]
        and "a 10.00 ms, b 1.00 ms" in r["reason"]
    )
    assert claims.claim_across_models({"models": {"a": model(2.0, 1.0)}})["verdict"] == "not measured"


def test_markdown_has_one_row_per_claim_and_the_reasons():
    table = claims.rows({})
    text = claims.markdown(table, {"model": "M", "size": "small", "wall_min": 1.5})
    assert len(table) == len(claims.CLAIMS) == 6
    assert text.count("\n| ") == 6 + 1 and "(M, small slices, 1.5 min)" in text


def test_plan_runs_every_workload_on_the_model_and_compares_three_models():
    args = build_parser().parse_args(["--threads", "1", "--model", "/m"])
    keys = [k for k, _ in plan(args)]
    assert keys == [
        "game24",
        "branch-gsm8k",
        "branch-arc",
        "tree",
        "paraphrase",
        "models:tiny",
        "models:default",
        "models:/m",
    ]
    argv = dict(plan(args))
    assert argv["paraphrase"][-6:] == ["--range", "0:8", "--threads", "1", "--model", "/m"]
    assert all(argv[k][-2:] == ["--model", "/m"] for k in ("game24", "branch-gsm8k", "branch-arc", "tree"))
    assert "--model" not in argv["models:default"]
    assert "--model" not in dict(plan(build_parser().parse_args(["--only", "tree"])))["tree"]
    assert argv["models:/m"][-2:] == ["--model", "/m"] and "--fixed-length" in argv["models:tiny"]
    full = dict(plan(build_parser().parse_args(["--full", "--only", "tree"])))
    assert list(full) == ["tree"] and "0:2" in full["tree"]


def test_a_tiny_bench_document_makes_the_asks_rows(tmp_path):
    doc = slim(
        run_bench(
            ["paraphrase", "--model", "tiny", "--range", "0:2", "--threads", "1", "--max-new-tokens", "2"]
        )
    )
    assert "decisions" not in doc["modes"]["exact"] and doc["command"].startswith(
        "treesearch bench paraphrase"
    )
    rows = {r["claim"]: r for r in claims.rows({"paraphrase": doc, "asks_gate": None})}
    reuse = rows["ASKS reuse over exact matching, diverse phrasing"]
    assert reuse["value"] is not None and reuse["command"] == doc["command"]
    assert "asks-open" in reuse["reason"] or reuse["verdict"] == "reproduced"


def test_commands_are_cleaned_and_a_saved_table_is_rebuilt(tmp_path):
    assert (
        clean_command("treesearch bench tree --range 0:1 --json /tmp/x.json --no-progress --threads 1")
        == "treesearch bench tree --range 0:1 --threads 1"
    )
    doc = _doc(
        "treesearch bench tree --json /tmp/a.json --no-progress",
        rksc=_entry(speedup_vs_nokv=2.0),
        exact=_entry(speedup_vs_nokv=2.0),
    )
    saved = tmp_path / "saved.json"
    saved.write_text(
        json.dumps(
            {
                "model": "M",
                "size": "small",
                "wall_min": 3.0,
                "claims": [],
                "runs": {"tree": doc, "models": {}},
            }
        )
    )
    out, md = tmp_path / "again.json", tmp_path / "again.md"
    assert main(["--from", str(saved), "--json", str(out), "--markdown", str(md)]) == 0
    again = json.loads(out.read_text())
    assert again["wall_min"] == 3.0 and again["runs"]["tree"]["command"] == "treesearch bench tree"
    assert again["claims"][0]["value"] == 2.0 and "(M, small slices, 3.0 min)" in md.read_text()
