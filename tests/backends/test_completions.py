"""Reading completion answers (`treesearch.backends.completions`), the request defaults per server
(`server_models`) and the request threads (`request_pool`): pure pieces, no server. The llama.cpp
server's layout here is the one its /v1/completions answers with (tests/backends/test_llama_server.py
reads it from a real llama-server)."""

from __future__ import annotations

import math
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from treesearch.backends.completions import (
    byte_char_offsets,
    finish_name,
    generation,
    top_logprobs,
    usage_counts,
)
from treesearch.backends.request_pool import RequestPool
from treesearch.backends.server_models import request_defaults
from treesearch.common.config import Sampling


def entry(token: str, logprob: float, tok_id: int, top: list[tuple[str, float]] = ()) -> dict:
    """One token of llama-server's `logprobs.content`."""
    return {
        "id": tok_id,
        "token": token,
        "bytes": list(token.encode()),
        "logprob": logprob,
        "top_logprobs": [
            {"id": i, "token": t, "bytes": list(t.encode()), "logprob": v} for i, (t, v) in enumerate(top)
        ],
    }


def test_llama_server_top_logprobs_are_read_from_the_first_tokens_list():
    content = [
        entry(" sure", -0.2, 7, [(" sure", -0.2), (" likely", -1.9), (" sure", -5.0)]),
        entry("\n", -0.1, 9),
    ]
    assert top_logprobs({"content": content}) == {" sure": -0.2, " likely": -1.9}


def test_openai_layout_top_logprobs_are_the_first_positions_dict():
    lp = {"tokens": [" a"], "token_logprobs": [-0.5], "top_logprobs": [{" a": -0.5, " b": -1.5}]}
    assert top_logprobs(lp) == {" a": -0.5, " b": -1.5} and top_logprobs(None) == {}


def test_a_llama_server_choice_gives_ids_logprobs_and_offsets():
    choice = {
        "text": "4 + 5",
        "finish_reason": "length",
        "logprobs": {"content": [entry("4", -0.5, 19), entry(" +", -0.25, 1232), entry(" 5", -1.0, 216)]},
    }
    gen = generation(choice, Sampling(), prompt_tokens=30, cached=12, completion_tokens=3)
    assert gen.token_ids == [19, 1232, 216] and gen.logprobs == [-0.5, -0.25, -1.0]
    assert gen.offsets == [(0, 1), (1, 3), (3, 5)] and gen.finish == "length"
    assert (gen.prompt_tokens, gen.reused_tokens) == (30, 12)


def test_a_character_split_over_two_tokens_belongs_to_the_token_that_completes_it():
    text = "é!"  # é is two bytes, here one per token
    assert byte_char_offsets(text, [b"\xc3", b"\xa9", b"!"]) == [(0, 0), (0, 1), (1, 2)]


@given(st.lists(st.text(max_size=4), max_size=8))
def test_byte_offsets_of_whole_tokens_cover_the_text_in_order(pieces):
    text = "".join(pieces)
    offsets = byte_char_offsets(text, [p.encode() for p in pieces])
    assert [text[s:e] for s, e in offsets] == pieces


def test_llama_server_finish_stop_is_a_stop_string_only_when_its_tokens_were_cut():
    stop = Sampling(stop=("\n",))
    # llama-server leaves the stop string's tokens out of logprobs: 3 generated, 2 listed
    choice = {
        "text": "ab",
        "finish_reason": "stop",
        "logprobs": {"content": [entry("a", -1, 1), entry("b", -1, 2)]},
    }
    assert generation(choice, stop, 5, 0, completion_tokens=3).finish == "stop"
    assert generation(choice, stop, 5, 0, completion_tokens=2).finish == "eos"
    assert finish_name({"finish_reason": "stop", "stop_reason": "\n"}, stop) == "stop"  # vLLM
    assert finish_name({"finish_reason": "stop", "stop_reason": 2}, stop) == "eos"


def test_usage_counts_cached_tokens_where_reported_and_never_above_the_prompt():
    usage = {"prompt_tokens": 40, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 31}}
    assert usage_counts({"usage": usage}) == (40, 3, 31)
    assert usage_counts({"usage": {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 9}}}) == (
        4,
        0,
        4,
    )
    assert usage_counts({}) == (0, 0, 0)


def test_request_defaults_per_server_and_extra_body_wins():
    neutral = {"top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0}
    assert request_defaults([{"owned_by": "llamacpp"}], {}) == {**neutral, "cache_prompt": True}
    assert request_defaults([{"owned_by": "me"}], {"top_k": 3}) == {**neutral, "top_k": 3}
    assert request_defaults([{"owned_by": "vllm"}], {}) == {}


def test_request_pool_keeps_order_and_raises_the_first_failure():
    pool = RequestPool(4)
    seen = set()

    def work(x):
        seen.add(threading.current_thread().name)
        return x * x

    assert pool.map(work, list(range(10))) == [x * x for x in range(10)]
    assert all(name.startswith("treesearch-server") for name in seen)

    def fail(x):
        if x == 3:
            raise ValueError("row 3")
        return x

    with pytest.raises(ValueError, match="row 3"):
        pool.map(fail, list(range(6)))
    pool.close()
    assert pool.map(math.sqrt, [4.0, 9.0]) == [2.0, 3.0]  # restarts after close
    pool.close()
