"""Exact arithmetic over model-written expressions: a small recursive-descent parser of numbers,
+ - * / and parentheses, evaluated in `fractions.Fraction`. Model output is data: nothing here
calls eval, exec or a symbolic library; anything else in the text is a `ParseError`.

Grammar:  expr := term (('+' | '-') term)* ;  term := factor (('*' | '/') factor)* ;
          factor := '-' factor | NUMBER | '(' expr ')'
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from treesearch.common.errors import ParseError

MAX_LEN = 200  # longer texts are refused before parsing (bounded work on hostile input)
MAX_DEPTH = 32
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")
_OPS = {"×": "*", "x": "*", "X": "*", "÷": "/", "−": "-", "–": "-"}


@dataclass(frozen=True)
class Evaluated:
    """The value of an expression and the number literals it used, in order."""

    value: Fraction
    numbers: tuple[Fraction, ...]


def tokenize(text: str) -> list[str]:
    if len(text) > MAX_LEN:
        raise ParseError(f"expression longer than {MAX_LEN} characters")
    out: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:  # only trailing whitespace is left
            break
        num, other = m.groups()
        if num is not None:
            out.append(num)
        else:
            ch = _OPS.get(other, other)
            if ch not in "+-*/()":
                raise ParseError(f"unexpected character {other!r} at {m.start(2)}")
            out.append(ch)
        pos = m.end()
    return out


def evaluate(text: str) -> Evaluated:
    """Parse and evaluate an arithmetic expression exactly. Raises ParseError on anything else,
    division by zero included."""
    toks = tokenize(text)
    if not toks:
        raise ParseError("empty expression")
    parser = _Parser(toks)
    value = parser.expr(0)
    if parser.i != len(toks):
        raise ParseError(f"unexpected {toks[parser.i]!r} after a complete expression")
    return Evaluated(value, tuple(parser.numbers))


class _Parser:
    def __init__(self, toks: list[str]) -> None:
        self.toks = toks
        self.i = 0
        self.numbers: list[Fraction] = []

    def _peek(self) -> str | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def expr(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self.toks[self.i]
            self.i += 1
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self._peek() in ("*", "/"):
            op = self.toks[self.i]
            self.i += 1
            rhs = self.factor(depth)
            if op == "*":
                value = value * rhs
            elif rhs == 0:
                raise ParseError("division by zero")
            else:
                value = value / rhs
        return value

    def factor(self, depth: int) -> Fraction:
        if depth > MAX_DEPTH:
            raise ParseError("expression nested too deeply")
        tok = self._peek()
        if tok is None:
            raise ParseError("expression ends too early")
        self.i += 1
        if tok == "-":
            return -self.factor(depth + 1)
        if tok == "(":
            value = self.expr(depth + 1)
            if self._peek() != ")":
                raise ParseError("missing ')'")
            self.i += 1
            return value
        if tok[0].isdigit():
            num = Fraction(tok)
            self.numbers.append(num)
            return num
        raise ParseError(f"unexpected {tok!r}")


def parse_number(text: str) -> Fraction:
    """A plain number ("12", "-3", "2.5", "7/3") as a Fraction; ParseError otherwise."""
    if len(text) > MAX_LEN:  # bounded work, and no int() of thousands of digits (a ValueError)
        raise ParseError(f"number text longer than {MAX_LEN} characters")
    m = re.fullmatch(r"\s*(-?\d+(?:\.\d+)?)(?:\s*/\s*(\d+))?\s*", text)
    if m is None:
        raise ParseError(f"not a number: {text[:40]!r}")
    num = Fraction(m.group(1))
    if m.group(2) is not None:
        den = Fraction(m.group(2))
        if den == 0:
            raise ParseError("division by zero")
        num /= den
    return num


def fmt(x: Fraction) -> str:
    """Integers as "12", other fractions as "7/3"."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator}/{x.denominator}"
