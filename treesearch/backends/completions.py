"""A `/v1/completions` answer as our results: a choice as a `Generation` (text, per-token
log-probabilities, each token's character range, finish), the next token's top-k log-probabilities,
the labels' probabilities read from them, and the answer's token counts (`usage`). Pure functions
over the decoded JSON, so each is tested without a server."""

from __future__ import annotations

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
    """The first position's top-k {token text: logprob} of a completions logprobs object."""
    if not isinstance(logprobs, dict):
        return {}
    tops = logprobs.get("top_logprobs") or []
    first = tops[0] if tops else None
    if not isinstance(first, dict):
        return {}
    return {str(k): float(v) for k, v in first.items() if isinstance(v, (int, float))}


def generation(choice: dict, sampling: Sampling, prompt_tokens: int, cached: int) -> Generation:
    """The Generation of one choice: its text, the per-token log-probabilities and character ranges
    (from the choice's logprobs, where asked for), the finish reason in the local engine's names."""
    text = str(choice.get("text") or "")
    raw = choice.get("logprobs")
    lp = raw if isinstance(raw, dict) else {}
    tokens = [str(t) for t in lp.get("tokens") or []]
    logprobs = [float(v) if v is not None else 0.0 for v in lp.get("token_logprobs") or []][: len(tokens)]
    offsets = token_char_offsets(text, tokens, lp.get("text_offset"))
    return Generation(
        text=text,
        token_ids=[],
        logprobs=logprobs,
        finish=finish_name(choice, sampling),
        prompt_tokens=prompt_tokens,
        reused_tokens=cached,
        offsets=offsets,
    )


def finish_name(choice: dict, sampling: Sampling) -> str:
    """The local engine's finish names: "length", "stop" (a stop string) or "eos"."""
    reason = choice.get("finish_reason")
    if reason == "length":
        return "length"
    stop_reason = choice.get("stop_reason")  # vLLM: the stop string matched, or an EOS token id / None
    return "stop" if isinstance(stop_reason, str) and stop_reason in sampling.stop else "eos"


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
