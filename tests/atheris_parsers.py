"""Coverage-guided fuzz target (atheris / libFuzzer) over the parsers that read model output.

Run: python tests/atheris_parsers.py -runs=20000 -max_len=512   (exits 0 when no input fails).
Each input is decoded as text and fed to every parser; anything but ParseError escaping, or a
call to eval/exec, is a crash that libFuzzer reports with the input that caused it.
"""

from __future__ import annotations

import builtins
import sys
from fractions import Fraction

import atheris

with atheris.instrument_imports():
    from treesearch.common.errors import ParseError
    from treesearch.tasks import arith, choice, game24, gsm8k


def _refuse(*a, **k):
    raise AssertionError("model text reached eval/exec")


GAME = game24.Game24()
STATES = [
    GAME.initial_state((4, 5, 6, 10)),
    game24.Game24State(puzzle=(4, 5, 6, 10), numbers=(Fraction(24),), steps=("x",)),
]
MATH = gsm8k.GSM8K()
QUESTION = MATH.initial_state({"question": "How many?", "answer": "#### 42"})


def one_input(data: bytes) -> None:
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(len(data))
    saved = builtins.eval, builtins.exec
    builtins.eval = builtins.exec = _refuse
    try:
        for fn in (arith.evaluate, arith.parse_number, game24.parse_puzzle):
            try:
                fn(text)
            except ParseError:
                pass
        game24.apply_move((Fraction(4), Fraction(5), Fraction(6), Fraction(10)), text)
        game24.check_answer(text, (4, 5, 6, 10))
        for st in STATES:
            for c in GAME.parse_children(st, text):
                GAME.value(c.state)
        gsm8k.extract_number(text)
        for c in MATH.parse_children(QUESTION, text):
            MATH.is_solved(c.state)
        choice.extract_choice(text, "ABCD")
    finally:
        builtins.eval, builtins.exec = saved


if __name__ == "__main__":
    atheris.Setup(sys.argv, one_input)
    atheris.Fuzz()
