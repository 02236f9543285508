"""Game of 24 children carry the span of their own line, so CGEE Level 1 sees one confidence per
move line instead of the whole generation's (which made every sibling tie)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.config import RKSCConfig
from treesearch.engine.local import Engine
from treesearch.policies.cgee import span_confidence, token_offsets
from treesearch.tasks.game24 import Game24, Game24State, apply_move

LINES = st.sampled_from(
    [
        "4 + 5 = 9 (left: 6 9 10)",
        "  10 - 6 = 4",
        "6 * 5 = 30 ",
        "junk",
        "",
        "4 / 0 =",
        "5 + 5 = 10",
        "é 4 + 6 = 10",
        "10 / 4 = 2.5 (left: 2.5 5 6)",
    ]
)
ENDS = st.sampled_from(["\n", "\r\n", "\r", "\u2028", "\x0b"])


def test_each_move_line_gets_its_own_span():
    g = Game24()
    state = g.initial_state("4 5 6 10")
    text = "4 + 5 = 9 (left: 6 9 10)\n  no move here\r\n 10 - 6 = 4 (left: 4 4 5)  \n7 * 7 = 49\n6 * 5 = 30"
    kids = g.parse_children(state, text)
    assert [c.thought for c in kids] == [
        "4 + 5 = 9 (left: 6 9 10)",
        "10 - 6 = 4 (left: 4 4 5)",
        "6 * 5 = 30 (left: 4 10 30)",
    ]
    assert [c.span for c in kids] == [(0, 24), (42, 66), (80, 90)]
    assert [text[slice(*c.span)] for c in kids] == [
        "4 + 5 = 9 (left: 6 9 10)",
        "10 - 6 = 4 (left: 4 4 5)",
        "6 * 5 = 30",
    ]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(LINES, ENDS), max_size=8))
def test_every_span_holds_the_line_its_child_was_parsed_from(parts):
    g = Game24()
    state = g.initial_state("4 5 6 10")
    text = "".join(line + end for line, end in parts)
    kids = g.parse_children(state, text)
    for c in kids:
        s, e = c.span
        assert 0 <= s < e <= len(text)
        piece = text[s:e]
        assert piece == piece.strip() and not any(ch in piece for ch in "\n\r\u2028\x0b")
        assert apply_move(state.numbers, piece)[0] == c.thought
    assert [c.thought for c in kids] == [
        m[0] for m in (apply_move(state.numbers, ln) for ln in text.splitlines()) if m is not None
    ]


def test_the_answer_line_gets_its_span():
    g = Game24()
    state = Game24State(puzzle=(4, 5, 6, 10), numbers=(Fraction(24),), steps=("a", "b", "c"))
    text = "  (4 + 5 - 6) * 10 = 24 \nAnswer: something else"
    (kid,) = g.parse_children(state, text)
    assert kid.thought == "Answer: (4 + 5 - 6) * 10 = 24" and kid.state.answer == "(4 + 5 - 6) * 10"
    assert kid.span == (2, 23) and text[2:23] == "(4 + 5 - 6) * 10 = 24"
    assert g.parse_children(state, "  \n ") == []


@pytest.mark.real_model
def test_real_siblings_no_longer_tie(real_lm):
    """One real Game of 24 expansion (greedy): its move lines get distinct confidences, each the
    geometric mean of its own tokens' probabilities."""
    g = Game24()
    state = g.initial_state("1 2 3 4")  # greedy: three legal move lines (most puzzles give one or two)
    gen = Engine(real_lm, RKSCConfig()).generate([g.expand_prompt(state)], g.sampling)[0]
    kids = g.parse_children(state, gen.text)
    assert len(kids) == 3, gen.text
    offs = token_offsets(real_lm.tokenizer, gen.token_ids)
    confs = [span_confidence(offs, gen.logprobs, c.span, len(gen.text)) for c in kids]
    assert len(set(confs)) == len(kids)
    assert all(0.0 < c <= 1.0 for c in confs)
    assert any(abs(c - gen.confidence) > 1e-6 for c in confs)
