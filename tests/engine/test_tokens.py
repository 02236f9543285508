"""`treesearch.engine.tokens`: the tokenization memory, the radix trie behind it, distinct-token
counts and label ids, tested directly on the default model's tokenizer (shipped, no download)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treesearch.common.errors import ProblemDefinitionError
from treesearch.engine.tokens import TextTrie, TokenMemory, TokenTrie, label_token_ids


@pytest.fixture(scope="module")
def tokenizer(tiny_lm):
    return tiny_lm.tokenizer


def test_token_trie_counts_each_distinct_position_once():
    trie = TokenTrie()
    assert trie.add([1, 2, 3]) == 3
    assert trie.add([1, 2, 4]) == 1  # shares 1, 2
    assert trie.add([1, 2]) == 0
    assert trie.add([5]) == 1
    assert trie.size == 5


@given(st.lists(st.lists(st.integers(0, 3), max_size=6), max_size=8))
@settings(max_examples=60, deadline=None)
def test_token_trie_size_is_the_number_of_distinct_prefixes(contexts):
    trie = TokenTrie()
    for c in contexts:
        trie.add(c)
    assert trie.size == len({tuple(c[: i + 1]) for c in contexts for i in range(len(c))})


@given(st.lists(st.text(alphabet="ab ", max_size=6), max_size=8), st.text(alphabet="ab ", max_size=8))
@settings(max_examples=80, deadline=None)
def test_text_trie_finds_the_longest_stored_prefix(keys, text):
    trie = TextTrie()
    for i, k in enumerate(keys):
        trie.insert(k, i)
    found = [k for k in keys if text.startswith(k)]
    n, value = trie.longest_prefix(text)
    if not found:
        assert (n, value) == (0, None)
    else:
        best = max(len(k) for k in found)
        assert n == best and keys[value] == text[:best]
        assert value == max(i for i, k in enumerate(keys) if k == text[:best])  # the last insert wins


def test_a_text_extending_a_known_text_keeps_the_known_ids(tokenizer):
    mem = TokenMemory(tokenizer)
    made_up = [81, 82, 83]  # ids that tokenizing "xyz" would never give
    mem.remember("xyz", made_up)
    assert mem.tokenize("xyz") == made_up
    tail = tokenizer.encode(" and more", add_special_tokens=False)
    assert mem.tokenize("xyz and more") == made_up + tail


def test_a_generation_is_remembered_with_and_without_its_last_token(tokenizer):
    mem = TokenMemory(tokenizer)
    prompt_ids = mem.tokenize("Once upon")
    gen = tokenizer.encode(" a time", add_special_tokens=False) + [0]  # ends with EOS (id 0)
    mem.remember_generation("Once upon", prompt_ids, gen)
    with_eos = "Once upon" + tokenizer.decode(gen, skip_special_tokens=False)
    assert mem.tokenize(with_eos) == prompt_ids + gen
    assert mem.tokenize("Once upon a time") == prompt_ids + gen[:-1]


def test_the_memory_forgets_its_oldest_half_when_full(tokenizer):
    mem = TokenMemory(tokenizer, limit=4)
    for i in range(5):
        mem.remember(f"text{i}", [i])
    assert mem.tokenize("text4") == [4] and mem.tokenize("text2") == [2]
    assert mem.tokenize("text0") == tokenizer.encode("text0", add_special_tokens=False)


def test_a_prompt_that_is_not_text_is_refused(tokenizer):
    with pytest.raises(ProblemDefinitionError, match="must be a str"):
        TokenMemory(tokenizer).tokenize(42)  # type: ignore[arg-type]


def test_label_ids_are_first_tokens_and_must_differ(tokenizer):
    ids = label_token_ids(tokenizer, [" sure", " likely"])
    assert ids == [tokenizer.encode(" sure")[0], tokenizer.encode(" likely")[0]]
    with pytest.raises(ProblemDefinitionError, match="distinct tokens"):
        label_token_ids(tokenizer, [" sure", " sure"])
    with pytest.raises(ProblemDefinitionError, match="tokenizes to nothing"):
        label_token_ids(tokenizer, [""])
