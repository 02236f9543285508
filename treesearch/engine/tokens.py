"""Token bookkeeping of an engine: the tokenization memory, label token ids and distinct-token counts.

`TokenMemory.tokenize` keeps the ids of texts it has seen: a text that extends a known text (an
earlier prompt, or a prompt plus its generation) keeps the known ids and only the rest is
tokenized, so a chain-style child prompt reuses its parent's ids (generated ids included) and
with them its K/V. The longest known prefix is found in a `TextTrie` in one walk over the text.

`TokenTrie` counts distinct token positions over many contexts (`Stats.unique_tokens`): two
contexts that share a prefix share those positions, so the count is the number of nodes of the
trie of all contexts, the least work any cache could do to compute them all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from treesearch.common.errors import ProblemDefinitionError


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


class _Node:
    __slots__ = ("edges", "value", "has")

    def __init__(self) -> None:
        self.edges: dict[str, list] = {}  # first character -> [label, child]
        self.value: Any = None
        self.has = False


def _common_len(label: str, text: str, i: int) -> int:
    """Length of the common prefix of label and text[i:] (binary search over C-level startswith)."""
    lo, hi = 0, min(len(label), len(text) - i)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if text.startswith(label[:mid], i):
            lo = mid
        else:
            hi = mid - 1
    return lo


class TextTrie:
    """A radix trie of strings: `longest_prefix(text)` finds the longest stored key that text
    starts with in one walk (edges hold runs of characters, so memory grows with distinct text)."""

    def __init__(self) -> None:
        self._root = _Node()

    def insert(self, key: str, value: Any) -> None:
        node, i = self._root, 0
        while i < len(key):
            edge = node.edges.get(key[i])
            if edge is None:
                leaf = _Node()
                leaf.value, leaf.has = value, True
                node.edges[key[i]] = [key[i:], leaf]
                return
            label, child = edge
            k = len(label) if key.startswith(label, i) else _common_len(label, key, i)
            if k < len(label):  # split the edge at k
                mid = _Node()
                mid.edges[label[k]] = [label[k:], child]
                edge[0], edge[1] = label[:k], mid
                child = mid
            node, i = child, i + k
        node.value, node.has = value, True

    def longest_prefix(self, text: str) -> tuple[int, Any]:
        """(length, value) of the longest stored key that is a prefix of text; (0, None) if none."""
        node, i = self._root, 0
        best: tuple[int, Any] = (0, node.value) if node.has else (0, None)
        while i < len(text):
            edge = node.edges.get(text[i])
            if edge is None or not text.startswith(edge[0], i):
                break
            i += len(edge[0])
            node = edge[1]
            if node.has:
                best = (i, node.value)
        return best


class TokenMemory:
    """Remembers the token ids of texts an engine has seen (at most `limit`; the oldest half is
    forgotten when it overflows) and tokenizes new texts by extending the longest known prefix."""

    def __init__(self, tokenizer: Any, limit: int = 20000) -> None:
        self.tokenizer = tokenizer
        self.limit = limit
        self._known: dict[str, tuple[int, ...]] = {}  # insertion-ordered: oldest first
        self._trie = TextTrie()

    def tokenize(self, text: str) -> list[int]:
        """Token ids of text; a text that extends a known text keeps the known ids."""
        if not isinstance(text, str):
            raise ProblemDefinitionError(f"a prompt must be a str, got {type(text).__name__}: {text!r:.80}")
        hit = self._known.get(text)
        if hit is not None:
            return list(hit)
        n, known = self._trie.longest_prefix(text)
        ids = list(known) if n else []
        if text[n:]:
            ids += self.tokenizer.encode(text[n:], add_special_tokens=False)
        self.remember(text, ids)
        return ids

    def remember(self, text: str, ids: Sequence[int]) -> None:
        if text in self._known:
            return
        self._known[text] = tuple(ids)
        self._trie.insert(text, self._known[text])
        if len(self._known) > self.limit:
            keep = list(self._known.items())[self.limit // 2 :]
            self._known = dict(keep)
            self._trie = TextTrie()
            for k, v in keep:
                self._trie.insert(k, v)

    def remember_generation(self, prompt: str, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """Record that prompt + the decoded generation has the ids prompt_ids + token_ids (with and
        without the last, e.g. EOS, token), so a chain-style child prompt keeps the generated ids."""
        gen = list(token_ids)
        for k in (len(gen), len(gen) - 1):
            tail = self.tokenizer.decode(gen[:k], skip_special_tokens=False)
            self.remember(prompt + tail, list(prompt_ids) + gen[:k])


def label_token_ids(tokenizer: Any, labels: Sequence[str]) -> list[int]:
    """First token id of each label; labels must start with distinct tokens."""
    ids = []
    for lab in labels:
        toks = tokenizer.encode(lab, add_special_tokens=False)
        if not toks:
            raise ProblemDefinitionError(f"label {lab!r} tokenizes to nothing; use a non-empty word")
        ids.append(toks[0])
    if len(set(ids)) != len(ids):
        raise ProblemDefinitionError(
            f"labels {list(labels)} do not start with distinct tokens ({ids}); pick words whose first "
            "token differs, e.g. with a leading space: ' sure', ' likely', ' impossible'"
        )
    return ids
