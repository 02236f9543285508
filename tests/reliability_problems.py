"""Small problems for the reliability tests, built to exercise the search machinery with the tiny
random model: their children come from whatever the model writes, so every tree depends on real
generations and (with `lm_value`) on real label scores.

`Words`: each generation's first `width` whitespace-separated words become children (a
placeholder "#i" when the text has fewer), depth `depth`; values from the labels " yes"/" no"
(or a stable hash when `lm_value=False`). `pad`/`value_pad` grow the expand / value prompts by
that many " pad" words per depth level (for context-limit tests); `chain=True` makes each
child's prompt its parent's prompt plus the child's word (chain style).
"""

from __future__ import annotations

import hashlib
import math

import pytest
import torch

from treesearch import Child, Problem, Sampling


class Words(Problem):
    name = "words"
    labels = {" yes": 1.0, " no": 0.0}
    value_range = (0.0, 1.0)

    def __init__(
        self,
        *,
        width: int = 3,
        depth: int = 3,
        max_new_tokens: int = 6,
        lm_value: bool = True,
        chain: bool = False,
        pad: int = 0,
        value_pad: int = 0,
        samples: int = 1,
        temperature: float = 0.0,
    ) -> None:
        self.width, self.max_depth, self.lm_value, self.chain = width, depth, lm_value, chain
        self.pad, self.value_pad = pad, value_pad
        self.samples_per_expand = samples
        self.sampling = Sampling(max_new_tokens=max_new_tokens, temperature=temperature)

    def initial_state(self, x) -> tuple:
        return (str(x),)

    def expand_prompt(self, state: tuple) -> str:
        depth = len(state) - 1
        if self.chain:
            return "Story: " + state[0] + "".join(" " + w for w in state[1:]) + " pad" * (self.pad * depth)
        return f"Task: {state[0]}\nSo far: {' / '.join(state[1:])}" + " pad" * (self.pad * depth) + "\nNext:"

    def parse_children(self, state: tuple, text: str) -> list[Child]:
        words = text.split()
        out = []
        for i in range(self.width):
            w = words[i][:24] if i < len(words) else f"#{i}"
            out.append(Child(thought=w, state=state + (w,)))
        return out

    def value_prompt(self, state: tuple) -> str:
        return (
            f"Is '{' '.join(state[1:])}' right?" + " pad" * (self.value_pad * (len(state) - 1)) + " Answer:"
        )

    def value(self, state: tuple) -> float | None:
        if self.lm_value:
            return None
        h = hashlib.blake2b(repr(state).encode(), digest_size=8).digest()
        return int.from_bytes(h, "little") / 2**64

    def is_terminal(self, state: tuple) -> bool:
        return len(state) - 1 >= self.max_depth

    def is_solved(self, state: tuple) -> bool:
        return self.is_terminal(state) and len(state[-1]) % 2 == 0

    def answer(self, state: tuple) -> str | None:
        return " ".join(state[1:])

    def state_to_json(self, state: tuple) -> list:
        return list(state)

    def state_from_json(self, data: list) -> tuple:
        return tuple(data)


class FailAt(Words):
    """Words that raises `exc` inside `method` on its `at`-th call (a deterministic interruption)."""

    def __init__(self, method: str, at: int, exc: BaseException, **kw) -> None:
        super().__init__(**kw)
        self._method, self._at, self._exc, self._calls = method, at, exc, 0

    def _tick(self, method: str) -> None:
        if method == self._method:
            self._calls += 1
            if self._calls == self._at:
                raise self._exc

    def expand_prompt(self, state):
        self._tick("expand_prompt")
        return super().expand_prompt(state)

    def value_prompt(self, state):
        self._tick("value_prompt")
        return super().value_prompt(state)

    def parse_children(self, state, text):
        self._tick("parse_children")
        return super().parse_children(state, text)


def tree_data(result, problem) -> dict:
    """A result's tree as JSON data, metadata about earlier runs left out (for comparisons)."""
    data = result.tree.to_json(problem.state_to_json)
    data["graph"] = {k: v for k, v in data["graph"].items() if k != "previous_stats"}
    return data


def assert_same_tree(a: dict, b: dict, exact: bool) -> None:
    """Equal trees: structure, thoughts, states, statuses and flags exactly; floats exactly or within 1e-5."""
    assert a["links"] == b["links"]
    assert len(a["nodes"]) == len(b["nodes"])
    for na, nb in zip(a["nodes"], b["nodes"]):
        assert na.keys() == nb.keys(), na["id"]
        for k in na:
            va, vb = na[k], nb[k]
            if exact or not isinstance(va, (float, dict)):
                assert va == vb, (na["id"], k, va, vb)
            elif isinstance(va, float):
                assert math.isclose(va, vb, rel_tol=1e-5, abs_tol=1e-6), (na["id"], k, va, vb)
            else:
                assert va.keys() == vb.keys() and all(math.isclose(va[x], vb[x], abs_tol=1e-5) for x in va)
    assert a["graph"] == b["graph"]


@pytest.fixture(autouse=True)
def one_thread():
    """Single-threaded torch for the test (restored after): on a shared 2-core machine torch's
    spinning worker threads multiply wall time several-fold; results do not depend on it. Import
    this name into a test module to use it there."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
