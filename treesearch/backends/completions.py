"""A `/v1/completions` answer as our results: a choice as a `Generation` (text, per-token
log-probabilities, each token's character range, finish), the next token's top-k log-probabilities,
the labels' probabilities read from them, and the answer's token counts (`usage`). Pure functions
over the decoded JSON, so each is tested without a server.

Two layouts of `logprobs` are read: the OpenAI completions one (vLLM, SGLang, llama-cpp-python:
parallel lists `tokens`, `token_logprobs`, `top_logprobs` of {text: logprob} and `text_offset`) and
llama.cpp's server's (`content`: one {id, token, bytes, logprob, top_logprobs: [{token, logprob}]}
per generated token; its token ids are kept and the character ranges come from the bytes)."""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from typing import Any

from treesearch.backends.protocol import Generation
from treesearch.common.config import Sampling
from treesearch.common.errors import ProblemDefinitionError


def check_prompt(prompt: Any) -> str:
    """The prompt itself, or ProblemDefinitionError naming what was passed instead of a str."""
    if not isinstance(prompt, str):
        raise ProblemDefinitionError(f"a prompt must be a str, got {type(prompt).__name__}: {prompt!r:.80}")
    return prompt


def usage_counts(data: dict) -> tuple[int, int, int]:
    """(prompt tokens, completion tokens, cached prompt tokens) of an answer's `usage`; cached is
    usage.prompt_tokens_details.cached_tokens where the server reports it (else 0), at most prompt."""
    usage = data.get("usage") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return prompt, completion, min(cached, prompt)


def label_probs(
    top: dict[str, float], labels: Sequence[str], keys: Sequence[str], floor: float
) -> tuple[dict[str, float], int]:
    """(label -> probability of its first token, labels given the floor): exp(logprob) of the label's
    key in the top-k; a key not in the top-k gets min(floor, smallest top-k probability)."""
    listed = [math.exp(v) for v in top.values() if v is not None and math.isfinite(v)]
    low = min([floor] + listed)
    raw, floored = {}, 0
    for lab, key in zip(labels, keys):
        v = top.get(key)
        if v is None or not math.isfinite(v):
            raw[lab], floored = low, floored + 1
        else:
            raw[lab] = math.exp(v)
    if sum(raw.values()) <= 0:  # every label underflowed: no information, a uniform distribution
        raw = {lab: floor for lab in labels}
    return raw, floored


def top_logprobs(logprobs: Any) -> dict[str, float]:
    """The first position's top-k {token text: logprob} of a completions logprobs object (either
    layout; where two listed tokens share a text, the likelier one's)."""
    if not isinstance(logprobs, dict):
        return {}
    content = logprobs.get("content")
    if isinstance(content, list):  # llama.cpp's server
        first = content[0].get("top_logprobs") if content and isinstance(content[0], dict) else None
        out: dict[str, float] = {}
        for e in first if isinstance(first, list) else []:
            v = e.get("logprob") if isinstance(e, dict) else None
            if isinstance(v, (int, float)) and float(v) > out.get(str(e.get("token")), -math.inf):
                out[str(e.get("token"))] = float(v)
        return out
    tops = logprobs.get("top_logprobs") or []
    first = tops[0] if tops else None
    if not isinstance(first, dict):
        return {}
    return {str(k): float(v) for k, v in first.items() if isinstance(v, (int, float))}


def generation(
    choice: dict, sampling: Sampling, prompt_tokens: int, cached: int, completion_tokens: int = 0
) -> Generation:
    """The Generation of one choice: its text, the per-token log-probabilities and character ranges
    (from the choice's logprobs, where asked for), the finish reason in the local engine's names."""
    text = str(choice.get("text") or "")
    raw = choice.get("logprobs")
    lp = raw if isinstance(raw, dict) else {}
    content = lp.get("content")
    ids: list[int] = []
    if isinstance(content, list):  # llama.cpp's server: one entry per token
        entries = [e for e in content if isinstance(e, dict)]
        tokens = [str(e.get("token") or "") for e in entries]
        logprobs = [float(e["logprob"]) if _number(e.get("logprob")) else 0.0 for e in entries]
        if all(isinstance(e.get("id"), int) for e in entries):
            ids = [int(e["id"]) for e in entries]
        if all(isinstance(e.get("bytes"), list) for e in entries):
            offsets = byte_char_offsets(text, [bytes(e["bytes"]) for e in entries])
        else:
            offsets = token_char_offsets(text, tokens, None)
    else:
        tokens = [str(t) for t in lp.get("tokens") or []]
        logprobs = [float(v) if v is not None else 0.0 for v in lp.get("token_logprobs") or []][: len(tokens)]
        offsets = token_char_offsets(text, tokens, lp.get("text_offset"))
    cut = isinstance(content, list) and completion_tokens > len(tokens)
    return Generation(
        text=text,
        token_ids=ids,
        logprobs=logprobs,
        finish=finish_name(choice, sampling, stop_cut=cut),
        prompt_tokens=prompt_tokens,
        reused_tokens=cached,
        offsets=offsets,
    )


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def finish_name(choice: dict, sampling: Sampling, *, stop_cut: bool = False) -> str:
    """The local engine's finish names: "length", "stop" (a stop string) or "eos". vLLM names the
    stop string in stop_reason; llama.cpp's server says "stop" for both and leaves out of its
    per-token logprobs the tokens of a matched stop string (stop_cut: fewer than it generated)."""
    reason = choice.get("finish_reason")
    if reason == "length":
        return "length"
    stop_reason = choice.get("stop_reason")  # vLLM: the stop string matched, or an EOS token id / None
    if isinstance(stop_reason, str):
        return "stop" if stop_reason in sampling.stop else "eos"
    return "stop" if stop_cut and reason == "stop" and sampling.stop else "eos"


def byte_char_offsets(text: str, pieces: Sequence[bytes]) -> list[tuple[int, int]]:
    """Character range [start, end) in text of each token given its UTF-8 bytes, clipped to the text:
    a character split over two tokens belongs to the token that completes it."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    out, pos, size = [], 0, len(text)
    for piece in pieces:
        end = pos + len(decoder.decode(piece))
        out.append((min(pos, size), min(end, size)))
        pos = end
    return out


def token_char_offsets(
    text: str, tokens: Sequence[str], text_offset: Sequence[int] | None
) -> list[tuple[int, int]]:
    """Character range [start, end) in text of each generated token, clipped to the text (tokens of a
    stop string that the server cut off get empty ranges at the end).

    From the server's text_offset where it gives one per token (some count from the prompt's start,
    some from the completion's: both work, since offsets are taken relative to the first token's),
    else from the running length of the token strings."""
    n = len(tokens)
    if (
        text_offset is not None
        and len(text_offset) == n
        and n
        and all(isinstance(o, int) for o in text_offset)
    ):
        starts = [o - text_offset[0] for o in text_offset]
    else:
        starts, pos = [], 0
        for t in tokens:
            starts.append(pos)
            pos += len(t)
    ends = starts[1:] + [starts[-1] + len(tokens[-1])] if n else []
    size = len(text)
    out = []
    for s, e in zip(starts, ends):
        s = min(max(s, 0), size)
        out.append((s, min(max(e, s), size)))
    return out
