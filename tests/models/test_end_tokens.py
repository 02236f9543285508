"""End tokens a known model adds to its GGUF config's one EOS (`KnownModel.end_tokens`,
`treesearch.models.load.add_end_tokens`): Qwen2.5 also ends a document with <|endoftext|>."""

from __future__ import annotations

import pytest

from treesearch import RKSCConfig, Sampling
from treesearch.engine.eos import eos_token_ids
from treesearch.models import install as registry
from treesearch.models.load import add_end_tokens, tiny_model

PROMPT = "Count: 1 2 3"


def greedy_ids(lm) -> list[int]:
    from treesearch.engine.local import Engine

    return list(Engine(lm, RKSCConfig()).generate([PROMPT], Sampling(max_new_tokens=8))[0].token_ids)


def test_an_added_end_token_ends_the_generation_where_the_model_writes_it():
    ids = greedy_ids(tiny_model(seed=0))
    assert len(ids) == 8  # the random model writes no EOS in 8 tokens
    lm = tiny_model(seed=0)
    end = ids[3] if ids[3] not in ids[:3] else ids[0]
    before = eos_token_ids(lm.model, lm.tokenizer)
    add_end_tokens(lm, (lm.tokenizer.convert_ids_to_tokens(end),))
    assert eos_token_ids(lm.model, lm.tokenizer) == before | {end}
    assert greedy_ids(lm) == ids[: ids.index(end) + 1]  # the end token is the last one generated


def test_adding_an_end_token_twice_or_none_changes_nothing():
    lm = tiny_model(seed=0)
    add_end_tokens(lm, ("<|endoftext|>",))
    once = lm.model.generation_config.eos_token_id
    add_end_tokens(lm, ("<|endoftext|>",))
    add_end_tokens(lm, ())
    assert lm.model.generation_config.eos_token_id == once == [2, 0]  # <|im_end|>, then <|endoftext|>


def test_an_end_token_the_tokenizer_lacks_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"end token '<\|no such token\|>' is not a token"):
        add_end_tokens(tiny_model(seed=0), ("<|no such token|>",))


def test_the_qwen_models_also_end_on_endoftext():
    assert {m.name: m.end_tokens for m in registry.KNOWN.values()} == {
        "qwen2.5-coder-0.5b": ("<|endoftext|>",),
        "qwen2.5-coder-1.5b": ("<|endoftext|>",),
    }
