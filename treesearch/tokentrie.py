"""Counts distinct token positions over many contexts (the `unique_tokens` statistic).

Two contexts that share a prefix share those positions: the count is the number of nodes of the
token trie of all contexts, the least work any cache could do to compute them all.
"""

from __future__ import annotations

from collections.abc import Sequence


class TokenTrie:
    """A trie of token ids; `add` returns how many positions were new."""

    def __init__(self) -> None:
        self._root: dict = {}
        self.size = 0

    def add(self, ids: Sequence[int]) -> int:
        node, new = self._root, 0
        for t in ids:
            nxt = node.get(t)
            if nxt is None:
                nxt = node[t] = {}
                new += 1
            node = nxt
        self.size += new
        return new
