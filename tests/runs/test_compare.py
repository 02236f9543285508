"""`treesearch compare` and the statistics under it: the paired table, McNemar's exact p-value and
Newcombe's paired interval on hand-computed cases; Wilson's interval against published values;
`--match-tokens`' choice of self-consistency's samples."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from treesearch.common.errors import SaveFileError, UsageError
from treesearch.common.intervals import mcnemar_exact, paired_difference, wilson
from treesearch.runs.compare import compare_rows, report


def rows(solved: list[bool], tokens: list[int] | None = None, status: list[str] | None = None) -> list[dict]:
    n = len(solved)
    return [
        {
            "index": i,
            "input": f"in{i}",
            "status": (status or ["complete"] * n)[i],
            "solved": solved[i],
            "tokens": (tokens or [0] * n)[i],
            "wall_s": 0.5 * i,
        }
        for i in range(n)
    ]


# A solves rows 0-5, B solves rows 0-1 and 6: both 2, only A 4, only B 1, neither 3 (10 rows)
A = [True] * 6 + [False] * 4
B = [True, True, False, False, False, False, True, False, False, False]


def test_the_paired_table_and_mcnemars_exact_p_value_by_hand():
    c = compare_rows(rows(A, tokens=[100] * 10), rows(B, tokens=[40] * 10))
    assert (c.rows, c.both, c.only_a, c.only_b, c.neither) == (10, 2, 4, 1, 3)
    assert (c.accuracy_a, c.accuracy_b, c.difference) == (0.6, 0.3, 0.3)
    # 5 discordant rows, 1 the rarer way: p = 2 * (C(5,0) + C(5,1)) / 2^5 = 12/32
    assert c.p_value == 0.375
    assert (c.tokens_a, c.tokens_b, c.seconds_a) == (100.0, 40.0, 2.25)


@pytest.mark.parametrize(
    "only_a, only_b, p",
    [
        (0, 0, 1.0),  # no discordant row: nothing to test
        (0, 3, 0.25),  # 2 * (1/8)
        (1, 5, 0.21875),  # 2 * (1 + 6) / 64
        (7, 7, 1.0),  # 2 * P(X <= 7) > 1, capped
        (0, 10, 2 / 1024),
        (2, 10, 2 * (1 + 12 + 66) / 4096),
    ],
)
def test_mcnemar_exact_p_values(only_a, only_b, p):
    assert mcnemar_exact(only_a, only_b) == pytest.approx(p, rel=1e-12)
    assert mcnemar_exact(only_b, only_a) == mcnemar_exact(only_a, only_b)


def test_wilson_against_published_values():
    """Newcombe (1998), Statistics in Medicine 17:857, score method: 81/263, 15/148, 0/20, 1/29."""
    for (k, n), want in [
        ((81, 263), (0.2553, 0.3662)),
        ((15, 148), (0.0624, 0.1605)),
        ((0, 20), (0.0, 0.1611)),
        ((1, 29), (0.0061, 0.1718)),
        ((5, 10), (0.2366, 0.7634)),
    ]:
        assert tuple(round(x, 4) for x in wilson(k, n)) == want


def test_newcombes_paired_interval_by_hand_and_published():
    # by hand, both 2 / only A 4 / only B 1 / neither 3: p_A 0.6, p_B 0.3,
    # Wilson 6/10 = (0.3127, 0.8318), 3/10 = (0.1078, 0.6032),
    # phi = (2*3 - 4*1) / sqrt(6*4*3*7) = 2 / sqrt(504) = 0.0890871
    low, high = paired_difference(2, 4, 1, 3)
    la, ua = wilson(6, 10)
    lb, ub = wilson(3, 10)
    assert (round(la, 4), round(ua, 4), round(lb, 4), round(ub, 4)) == (0.3127, 0.8318, 0.1078, 0.6032)
    phi = 2 / 504**0.5
    assert low == pytest.approx(
        0.3 - ((0.6 - la) ** 2 - 2 * phi * (0.6 - la) * (ub - 0.3) + (ub - 0.3) ** 2) ** 0.5
    )
    assert high == pytest.approx(
        0.3 + ((ua - 0.6) ** 2 - 2 * phi * (ua - 0.6) * (0.3 - lb) + (0.3 - lb) ** 2) ** 0.5
    )
    # low = 0.3 - sqrt(0.28733^2 - 2 phi 0.28733 * 0.30323 + 0.30323^2) = 0.3 - 0.39873
    # high = 0.3 + sqrt(0.23182^2 - 2 phi 0.23182 * 0.19221 + 0.19221^2) = 0.3 + 0.28766
    assert (round(low, 4), round(high, 4)) == (-0.0987, 0.5877)
    # Newcombe (1998), Statistics in Medicine 17:2635, example (a): 36 / 12 / 2 / 0 -> 0.0569 to 0.3404
    assert tuple(round(x, 4) for x in paired_difference(36, 12, 2, 0)) == (0.0569, 0.3404)
    assert paired_difference(0, 0, 0, 0) == (0.0, 0.0)
    assert paired_difference(5, 0, 0, 5) == pytest.approx(
        (-wilson(5, 10)[1] + 0.5, wilson(5, 10)[1] - 0.5), abs=0.5
    )


def test_rows_pair_by_index_leaving_out_rows_either_run_did_not_search():
    a = rows([True, True, False], status=["complete", "invalid", "failed"])
    b = rows([False, True, False, True])
    c = compare_rows(a, b)
    assert (c.rows, c.both, c.only_a, c.only_b, c.neither) == (2, 0, 1, 0, 1)  # rows 0 and 2
    b[0]["input"] = "something else"
    with pytest.raises(SaveFileError, match="row 0 has different inputs"):
        compare_rows(a, b)


def test_report_lines():
    c = compare_rows(rows(A, tokens=[100] * 10), rows(B, tokens=[40] * 10))
    lines = report(c, "bfs.jsonl", "cot.jsonl")
    assert lines[0] == "A = bfs.jsonl, B = cot.jsonl: 10 common rows searched by both"
    assert lines[1] == "both solved 2, only A 4, only B 1, neither 3"
    assert lines[3] == "difference A - B: +0.300 (95% CI -0.099 to +0.588, Newcombe's paired score interval)"
    assert lines[4] == "McNemar's exact test (two-sided, on the 5 rows only one solved): p = 0.375"
    assert lines[5] == "cost per problem: A 100 tokens, 2.25 s; B 40 tokens, 2.25 s (A/B 2.50x tokens)"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "treesearch.cli.main", "compare", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_compare_command_prints_the_table_and_writes_json(tmp_path):
    pa, pb = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    pa.write_text("".join(json.dumps(r) + "\n" for r in rows(A, tokens=[100] * 10)))
    pb.write_text("".join(json.dumps(r) + "\n" for r in rows(B, tokens=[40] * 10)))
    done = cli(str(pa), str(pb), "--json", str(tmp_path / "c.json"))
    assert done.returncode == 0, done.stderr
    assert "both solved 2, only A 4, only B 1, neither 3" in done.stdout and "p = 0.375" in done.stdout
    doc = json.loads((tmp_path / "c.json").read_text())
    assert doc["p_value"] == 0.375 and (doc["a"], doc["b"]) == (str(pa), str(pb))
    assert doc["command"] == f"treesearch compare {pa} {pb} --json {tmp_path / 'c.json'}"
    assert "torch" not in done.stderr


def test_compare_command_errors_are_one_line(tmp_path):
    pa = tmp_path / "a.jsonl"
    pa.write_text(json.dumps(rows([True])[0]) + "\n")
    (tmp_path / "bad.jsonl").write_text("not json\n")
    (tmp_path / "other.jsonl").write_text(json.dumps({**rows([True])[0], "index": 5}) + "\n")
    for args, message in [
        ((str(pa), str(tmp_path / "missing.jsonl")), "no such results file"),
        ((str(pa), str(tmp_path / "bad.jsonl")), "line 1 is not a result line"),
        ((str(pa), str(tmp_path / "other.jsonl")), "no row searched by both"),
    ]:
        done = cli(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("treesearch: error: ") and message in done.stderr


# -- --match-tokens -------------------------------------------------------------------------------
def test_samples_for_tokens_formula():
    from treesearch.cli.match_tokens import Pilot, samples_for_tokens

    assert samples_for_tokens(1000, Pilot(prompt=100, chain=150, rows=4)) == 6  # round(900/150)
    assert samples_for_tokens(1000, Pilot(prompt=100, chain=200, rows=4)) == 4  # round(4.5): to even
    assert samples_for_tokens(1000, Pilot(prompt=100, chain=180, rows=4)) == 5  # round(5.0)
    assert samples_for_tokens(90, Pilot(prompt=100, chain=50, rows=4)) == 1  # never below one chain
    with pytest.raises(UsageError, match="no tokens"):
        samples_for_tokens(1000, Pilot(prompt=100, chain=0, rows=4))


def run_args(*extra: str) -> argparse.Namespace:
    from treesearch.cli.main import build_parser

    return build_parser().parse_args(["run", "game24", "--model", "tiny", *extra])


def test_match_tokens_checks_before_the_model_loads(tmp_path):
    from treesearch.cli.match_tokens import check_match_tokens

    other = tmp_path / "bfs.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in rows([True, False], tokens=[300, 500])))
    assert check_match_tokens(run_args("--strategy", "sc", "--match-tokens", str(other))) == 400.0
    assert check_match_tokens(run_args("--strategy", "sc")) is None
    for extra, message in [
        (("--match-tokens", str(other)), "use it with --strategy sc"),
        (("--strategy", "sc", "--samples", "3", "--match-tokens", str(other)), "not both"),
        (("--strategy", "sc", "--match-tokens", str(tmp_path / "none.jsonl")), "no such results file"),
    ]:
        with pytest.raises(UsageError, match=message):
            check_match_tokens(run_args(*extra))


def test_match_tokens_chooses_k_from_a_pilot_or_from_the_rows_of_a_resumed_file(tiny_lm, capsys):
    from treesearch.cli.checks import check_run
    from treesearch.cli.match_tokens import choose, measure, samples_for_tokens

    args = run_args("--strategy", "sc", "--match-tokens", "x.jsonl", "--concurrency", "2")
    plan = check_run(args)
    items = [(900, "4 5 6 10"), (901, "bad"), (902, "1 2 3 4"), (903, "2 3 4 5")]
    pilot = measure(tiny_lm, plan, args, ["4 5 6 10", "1 2 3 4", "2 3 4 5"])
    assert pilot.rows == 3 and pilot.chain > 0 and pilot.prompt > 0
    target = pilot.prompt + 3.2 * pilot.chain
    chosen = choose(tiny_lm, plan, args, items, {}, target)
    assert chosen.strategy.samples == samples_for_tokens(target, pilot) == 3
    assert chosen.problem.samples_per_expand == 3
    assert "k = max(1, round((T - P) / D)) = 3" in capsys.readouterr().err
    done = {900: {"index": 900, "strategy": {"name": "SelfConsistency", "samples": 7}}}
    assert choose(tiny_lm, plan, args, items, done, target).strategy.samples == 7
