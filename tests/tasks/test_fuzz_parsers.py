"""Hostile model output: every parser that reads model text is fuzzed with hypothesis over random
and hostile strings. Properties: the only exception that escapes is the documented ParseError
(or none, for parsers that return None), results are well-formed, nothing is evaluated
(builtins.eval and exec raise while each parser runs, and a shell canary never appears), and
each example runs under a generous deadline (the parsers bound their input; a blow-up would miss it
by orders of magnitude, so this is not a speed test).

Not fuzzed because no such parser reads model output: label words. Values come from next-token
probabilities of the labels (Engine.score), never from parsing text; the label strings are the
problem's own definition (checked by Engine.label_token_ids, fuzzed below for robustness).
"""

from __future__ import annotations

import builtins
import contextlib
import math
from datetime import timedelta
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from treesearch.common.errors import ParseError, ProblemDefinitionError
from treesearch.tasks import arith, game24

CANARY = Path("/tmp/treesearch-fuzz-canary")
HOSTILE = [
    "__import__('os').system('touch /tmp/treesearch-fuzz-canary')",
    "eval('1+1')",
    "exec('x=1')",
    "().__class__.__bases__[0].__subclasses__()",
    "lambda: 0",
    "9**9**9",
    "9" * 5000,
    "1" + "0" * 4400 + " + 1 = 2",
    "-" * 300 + "1",
    "(" * 500 + "4" + ")" * 500,
    "(" * 40 + "4" + ")" * 40,
    "1/0",
    "4 / (1 - 1) = 24",
    "1e308 * 1e308",
    "nan",
    "inf",
    "-inf",
    "0x18",
    "٢٤",
    "²⁴",
    "２４",
    "𝟐𝟒",
    "24\x00",
    "\x00",
    "\u202e42",
    "\ufeff24",
    "4\u00a0+\u00a020",
    "Answer: (6 - 4) * (4 + 8) = 24",
    "answer is (B)",
    "The answer is 1,000,000.00.",
    "#### 42",
    "4 + 5 = 9 (left: 6 9 10)",
    "10 - 4 = 6 (left: 5 6 6)",
    "4 × 6 = 24",
    "24 ÷ 1 = 24",
    "4 x 6 = 24",
    "1.5.5 + 2 = 3",
    "4/ + 5 =",
    "",
    " ",
    "\n\n\n",
    "🙂" * 50,
    "a" * 20000,
]
# pieces that keep the fuzzer near the grammar (numbers, operators, moves) as well as off it
PIECES = st.sampled_from(
    list("0123456789+-*/()=.×÷−x ")
    + ["\n", "left:", "Answer:", "answer is", "24", "(left: ", "####", "(A)", " B.", "\x00", "٣"]
)
TEXT = st.one_of(
    st.text(max_size=300),
    st.lists(PIECES, max_size=80).map("".join),
    st.sampled_from(HOSTILE),
    st.tuples(st.sampled_from(HOSTILE), st.text(max_size=40)).map("".join),
)
FUZZ = settings(
    max_examples=400,
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
COUNTS: dict[str, int] = {}


@pytest.fixture(autouse=True)
def no_shell_canary():
    """The canary file a hostile string would create must never appear."""
    CANARY.unlink(missing_ok=True)
    yield
    assert not CANARY.exists()


def refuse(*a, **k):
    raise AssertionError("model text reached eval/exec")


@contextlib.contextmanager
def no_eval():
    """builtins.eval and exec raise while a parser runs (hypothesis itself uses exec between calls)."""
    saved = builtins.eval, builtins.exec
    builtins.eval = builtins.exec = refuse
    try:
        yield
    finally:
        builtins.eval, builtins.exec = saved


def test_no_eval_really_blocks():
    with no_eval(), pytest.raises(AssertionError, match="reached eval"):
        eval("1")


def count(name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1


@FUZZ
@given(TEXT)
def test_arith_evaluate(text):
    count("arith.evaluate")
    try:
        with no_eval():
            ev = arith.evaluate(text)
    except ParseError:
        return
    assert isinstance(ev.value, Fraction) and all(isinstance(x, Fraction) for x in ev.numbers)
    assert len(text) <= arith.MAX_LEN


@FUZZ
@given(TEXT)
@example("9" * 5000)
def test_arith_parse_number(text):
    count("arith.parse_number")
    try:
        with no_eval():
            x = arith.parse_number(text)
    except ParseError:
        return
    assert isinstance(x, Fraction)


NUMBERS = st.lists(st.integers(0, 13).map(Fraction), min_size=1, max_size=4).map(lambda v: tuple(sorted(v)))


@FUZZ
@given(NUMBERS, TEXT)
@example((Fraction(4), Fraction(5)), "9" * 5000 + " + 4 = 1")
def test_game24_apply_move(numbers, line):
    count("game24.apply_move")
    with no_eval():
        out = game24.apply_move(numbers, line)
    if out is None:
        return
    thought, left = out
    assert isinstance(thought, str) and len(left) == len(numbers) - 1
    assert all(isinstance(x, Fraction) for x in left)


@FUZZ
@given(TEXT, st.one_of(st.tuples(*[st.integers(1, 13)] * 4), TEXT))
@example("(6 - 4) * (4 + 8) = 24", "4 4 6 8")
@example("1", "² 3 4 5")
def test_game24_check_answer_and_puzzle(expr, puzzle):
    count("game24.check_answer")
    try:
        with no_eval():
            ok = game24.check_answer(expr, puzzle)
    except ParseError:
        assert isinstance(puzzle, str)  # only a bad puzzle (user input) may raise, and only ParseError
        return
    assert ok in (True, False)
    if ok:
        ev = arith.evaluate(expr.split("=")[0])
        assert ev.value == 24


@FUZZ
@given(st.lists(st.integers(1, 13), min_size=4, max_size=4), st.integers(0, 3), TEXT)
def test_game24_parse_children_and_value(puzzle, steps, text):
    count("Game24.parse_children")
    p = game24.Game24()
    state = p.initial_state(tuple(puzzle))
    for _ in range(steps):  # walk down by fixed moves to reach 3-, 2- and 1-number states
        a, b = state.numbers[0], state.numbers[1]
        thought, left = game24.apply_move(state.numbers, f"{game24.fmt(a)} + {game24.fmt(b)} =")
        state = game24.Game24State(puzzle=state.puzzle, numbers=left, steps=state.steps + (thought,))
    with no_eval():
        kids = p.parse_children(state, text)
        checked = [(c, p.value(c.state), p.is_solved(c.state)) for c in kids]
    assert isinstance(kids, list)
    for c, v, solved in checked:
        assert isinstance(c.thought, str)
        assert v is None or 0.0 <= v <= 20.0
        assert solved in (True, False)


gsm8k = pytest.importorskip("treesearch.tasks.gsm8k")


@FUZZ
@given(TEXT)
@example("The answer is " + "9" * 20000)
def test_gsm8k_extract_number(text):
    count("gsm8k.extract_number")
    with no_eval():
        out = gsm8k.extract_number(text)
    assert out is None or (isinstance(out, str) and out and any(ch.isdigit() for ch in out))


@FUZZ
@given(TEXT)
def test_gsm8k_parse_children(text):
    count("GSM8K.parse_children")
    p = gsm8k.GSM8K()
    state = p.initial_state({"question": "How many?", "answer": "#### 42"})
    with no_eval():
        checked = [(c, p.is_solved(c.state)) for c in p.parse_children(state, text)]
    for c, solved in checked:
        assert isinstance(c.thought, str) and "\n" not in c.thought
        assert solved in (True, False)


choice = pytest.importorskip("treesearch.tasks.choice")


@FUZZ
@given(TEXT, st.sampled_from(["ABCD", "ABC", "ABCDE", "AB"]))
def test_choice_extract_choice(text, letters):
    count("choice.extract_choice")
    with no_eval():
        out = choice.extract_choice(text, letters)
    assert out is None or out in letters


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_label_words_are_checked_not_trusted(tiny_lm, labels):
    """Hostile label strings: token ids or a ProblemDefinitionError naming the fix, nothing else."""
    count("Engine.label_token_ids")
    from treesearch import Engine

    eng = Engine(tiny_lm)
    try:
        with no_eval():
            ids = eng.label_token_ids(labels)
    except ProblemDefinitionError as exc:
        assert "label" in str(exc)
        return
    assert len(ids) == len(set(ids)) == len(labels)


def test_zz_report_example_counts(capsys):
    """Print how many examples each fuzzer ran (for the closing note); every fuzzer ran."""
    with capsys.disabled():
        print("\nfuzz examples:", dict(sorted(COUNTS.items())))
    if COUNTS:  # skipped when this test is selected alone
        assert all(v >= 50 for v in COUNTS.values()), COUNTS
        assert not math.isnan(sum(COUNTS.values()))


def test_atheris_coverage_guided_run():
    """Optional: a short coverage-guided libFuzzer run (skipped when atheris is not installed)."""
    pytest.importorskip("atheris")
    import subprocess
    import sys

    target = Path(__file__).resolve().parents[1] / "atheris_parsers.py"
    proc = subprocess.run(
        [sys.executable, str(target), "-runs=3000", "-max_len=512", "-seed=1"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done 3000 runs" in proc.stderr
