"""CGEE Level 1 per child: a child parsed out of part of a generation (`Child.span`) gets the
geometric-mean probability of the tokens that wrote that part, so siblings from ONE generation
(Game of 24's move lines) no longer tie. Exact token ranges on a hand-made generation, the
Searcher's confidences against a re-run of the same generation, no span = the old value, and
resume reproducing the tree."""

from __future__ import annotations

import math
import re

import pytest
from reliability_problems import (
    Words,
    assert_same_tree,
    one_thread,  # noqa: F401  (an autouse fixture)
    tree_data,
)

from treesearch import Child, RKSCConfig, Searcher
from treesearch.common.errors import ProblemDefinitionError
from treesearch.common.seeds import stable_seed
from treesearch.engine.local import Engine
from treesearch.policies.cgee import span_confidence, span_tokens, token_offsets

# Two move lines and the start of a stop string, as SmolLM2's tokenizer splits them (38 tokens):
#   tokens 0-17  "3 + 5 = 8 (left: 7 8 9)\n"   (token 17 is the newline)
#   tokens 18-35 "9 - 7 = 2 (left: 2 3 5)\n"
#   tokens 36-37 "Numbers:"
TEXT = "3 + 5 = 8 (left: 7 8 9)\n9 - 7 = 2 (left: 2 3 5)\nNumbers:"
IDS = [
    35,
    1232,
    216,
    37,
    446,
    216,
    40,
    365,
    8842,
    42,
    216,
    39,
    216,
    40,
    216,
    41,
    25,
    198,
    41,
    731,
    216,
    39,
    446,
    216,
    34,
    365,
    8842,
    42,
    216,
    34,
    216,
    35,
    216,
    37,
    25,
    198,
    39006,
    42,
]


def test_token_offsets_and_line_spans_on_a_hand_made_generation(tiny_lm):
    tok = tiny_lm.tokenizer
    assert tok(TEXT).input_ids == IDS
    offs = token_offsets(tok, IDS)
    assert "".join(TEXT[a:b] for a, b in offs) == TEXT
    assert offs[:4] == [(0, 1), (1, 3), (3, 4), (4, 5)]
    line1, line2 = (0, 23), (24, 47)  # the lines without their newlines
    assert (
        TEXT[slice(*line1)] == "3 + 5 = 8 (left: 7 8 9)" and TEXT[slice(*line2)] == "9 - 7 = 2 (left: 2 3 5)"
    )
    assert span_tokens(offs, line1) == (0, 17)
    assert span_tokens(offs, line2) == (18, 35)
    assert span_tokens(offs, (2, 2)) == (0, 0)  # an empty span overlaps no token
    assert span_tokens(offs, (2, 8)) == (1, 6)  # a span inside tokens takes every token it touches

    logprobs = [-0.01 * k for k in range(len(IDS))]
    want1 = math.exp(sum(logprobs[0:17]) / 17)
    want2 = math.exp(sum(logprobs[18:35]) / 17)
    whole = math.exp(sum(logprobs) / len(logprobs))
    assert span_confidence(offs, logprobs, line1, len(TEXT)) == pytest.approx(want1, rel=1e-12)
    assert span_confidence(offs, logprobs, line2, len(TEXT)) == pytest.approx(want2, rel=1e-12)
    assert want1 > want2  # earlier tokens carry higher log p here: the siblings no longer tie
    assert span_confidence(offs, logprobs, None, len(TEXT)) == pytest.approx(whole, rel=1e-12)
    assert span_confidence(offs, logprobs, (2, 2), len(TEXT)) == pytest.approx(whole, rel=1e-12)


def test_a_multibyte_character_is_charged_to_the_token_that_completes_it(tiny_lm):
    tok = tiny_lm.tokenizer
    ids = tok("é😀a").input_ids
    assert ids == [2756, 10813, 242, 218, 81]
    assert token_offsets(tok, ids) == [(0, 1), (1, 1), (1, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("span", [(-1, 3), (3, 2), (0, 57), (0.0, 3)])
def test_a_span_outside_the_text_is_a_problem_error(tiny_lm, span):
    offs = token_offsets(tiny_lm.tokenizer, IDS)
    with pytest.raises(ProblemDefinitionError, match="Child.span"):
        span_confidence(offs, [0.0] * len(IDS), span, len(TEXT))


class SpanWords(Words):
    """Words whose children carry the span of their word in the generation (placeholders none)."""

    def __init__(self, *, fail_at: int | None = None, **kw) -> None:
        super().__init__(**kw)
        self.fail_at, self.calls = fail_at, 0

    def parse_children(self, state, text):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyboardInterrupt
        found = list(re.finditer(r"\S+", text))
        out = []
        for i in range(self.width):
            if i < len(found):
                w = found[i].group()[:24]
                out.append(Child(thought=w, state=state + (w,), span=found[i].span()))
            else:
                out.append(Child(thought=f"#{i}", state=state + (f"#{i}",)))
        return out


def _search(lm, problem, strategy_breadth=2):
    from strategies import BFS

    return Searcher(
        lm, problem, BFS(breadth=strategy_breadth), RKSCConfig(kv_sharing="exact"), progress=False
    )


def test_searcher_gives_each_child_its_spans_confidence(tiny_lm):
    problem = SpanWords(width=3, depth=1, max_new_tokens=8, temperature=1.0)
    res = _search(tiny_lm, problem).solve("cats")
    tree = res.tree
    # the root's generation again, same prompt and per-node seed: its tokens and log p are known
    gen = Engine(tiny_lm, RKSCConfig()).generate(
        [problem.expand_prompt(tree.node(0)["state"])], problem.sampling, seeds=[stable_seed(0, 0, 0)]
    )[0]
    assert tree.node(0)["generation_ids"] == [gen.token_ids]
    offs = token_offsets(tiny_lm.tokenizer, gen.token_ids)
    words = list(re.finditer(r"\S+", gen.text))
    kids = sorted(tree.graph.successors(0))
    assert len(kids) == 3
    for i, cid in enumerate(kids):
        conf = tree.node(cid)["confidence"]
        if i < len(words):
            a, b = span_tokens(offs, words[i].span())
            assert b > a
            want = math.exp(sum(gen.logprobs[a:b]) / (b - a))
        else:  # a placeholder child without a span: the whole generation's confidence, as before
            want = gen.confidence
        assert conf == pytest.approx(want, rel=1e-6)
    assert len({tree.node(c)["confidence"] for c in kids[: len(words)]}) == min(3, len(words))


def test_children_without_spans_keep_the_generation_confidence(tiny_lm):
    res = _search(tiny_lm, Words(width=3, depth=1, max_new_tokens=8, temperature=1.0)).solve("cats")
    tree = res.tree
    gen = Engine(tiny_lm, RKSCConfig()).generate(
        [Words().expand_prompt(tree.node(0)["state"])],
        Words(max_new_tokens=8, temperature=1.0).sampling,
        seeds=[stable_seed(0, 0, 0)],
    )[0]
    kids = sorted(tree.graph.successors(0))
    assert [tree.node(c)["confidence"] for c in kids] == pytest.approx([gen.confidence] * 3, rel=1e-6)


def test_resume_reproduces_the_tree_with_span_confidences(tiny_lm):
    kw = dict(width=2, depth=3, max_new_tokens=6, temperature=1.0)
    ref = _search(tiny_lm, SpanWords(**kw)).solve("cats")
    s = _search(tiny_lm, SpanWords(fail_at=3, **kw))
    with pytest.raises(KeyboardInterrupt) as info:
        s.solve("cats")
    part = info.value.partial_result
    assert (len(part.tree), len(ref.tree)) == (3, 11)  # stopped at the third expansion, partway
    problem = SpanWords(**kw)
    resumed = _search(tiny_lm, problem).resume(part)
    assert (resumed.best, resumed.answer) == (ref.best, ref.answer)
    assert_same_tree(tree_data(resumed, problem), tree_data(ref, problem), exact=False)
    confs = [ref.tree.node(n)["confidence"] for n in ref.tree.graph.nodes if n != 0]
    assert len(set(confs)) > len(ref.tree.nodes_with(status="expanded"))  # siblings differ somewhere
