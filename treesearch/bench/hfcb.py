"""Generation replay: the same generation requests through our engine (exact sharing) and through
transformers' continuous batching (`model.generate_batch`, block sharing on), both greedy.

The requests are the prompts a workload's generate calls issued, batch by batch, item by item.
Both sides replay them with the same token ids, greedy, no stop strings and the same
`max_new_tokens` (EOS still ends a request, unless `ignore_eos`: then every request runs its full
length, as with dummy weights), so both do the same work and their outputs should be identical
token for token; `token_agreement` checks that.
Each side keeps its cache for the whole item: our engine shares across the item's calls, while
`generate_batch` starts a fresh manager per call (block sharing works within a call), as it would
for a user calling it once per search step.

hf-cb runs on a separate copy of the model whose attention is transformers' own SDPA (our model
object is switched to the "treesearch" attention); transformers 5.24 pages it inside
`generate_batch` (the "paged|" prefix is deprecated there).
"""

from __future__ import annotations

import copy
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from treesearch.common.config import RKSCConfig, Sampling
from treesearch.engine.eos import eos_token_ids
from treesearch.engine.local import Engine
from treesearch.models.load import LanguageModel

CB_SETTINGS: dict[str, Any] = dict(
    allow_block_sharing=True,
    num_blocks=256,
    max_batch_tokens=512,
    max_requests_per_batch=16,
    max_memory_percent=0.9,
)
_COPIES: dict[int, object] = {}


@dataclass
class ReplayResult:
    """One side of a replay: wall time, token counts and the generated ids per request."""

    wall_s: float = 0.0
    requests: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    # item -> call -> prompt ids per request
    inputs: list[list[list[list[int]]]] = field(default_factory=list)
    stats: dict = field(default_factory=dict)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0


def hf_model(lm: LanguageModel):
    """A copy of the model with transformers' SDPA attention (made once per model object)."""
    key = id(lm.model)
    if key not in _COPIES:
        model = copy.deepcopy(lm.model)
        model.set_attn_implementation("sdpa")
        _COPIES[key] = model
    return _COPIES[key]


def _strip(ids: list[int], eos: set[int]) -> list[int]:
    ids = list(ids)
    while ids and ids[-1] in eos:
        ids.pop()
    return ids


def replay_engine(
    lm: LanguageModel, requests: list[list[list[str]]], max_new_tokens: int, *, ignore_eos: bool = False
) -> ReplayResult:
    """Our engine, exact sharing, greedy, no stop strings; a fresh engine per item."""
    out = ReplayResult()
    sampling = Sampling(max_new_tokens=max_new_tokens, temperature=0.0, ignore_eos=ignore_eos)
    for batches in requests:
        engine = Engine(lm, RKSCConfig(kv_sharing="exact"))
        out.inputs.append([])
        t0 = time.perf_counter()
        for prompts in batches:
            ids = [engine.tokenize(p) for p in prompts]  # the ids generate() will use; hf-cb gets them too
            out.inputs[-1].append(ids)
            gens = engine.generate(prompts, sampling)
            out.outputs += [_strip(g.token_ids, set() if ignore_eos else engine.eos_ids) for g in gens]
            out.prompt_tokens += sum(len(i) for i in ids)
            out.generated_tokens += sum(len(g.token_ids) for g in gens)
            out.requests += len(prompts)
        out.wall_s += time.perf_counter() - t0
        for k, v in engine.stats.as_dict().items():
            if isinstance(v, int):
                out.stats[k] = out.stats.get(k, 0) + v
    return out


def replay_hf(
    lm: LanguageModel, inputs: list[list[list[list[int]]]], max_new_tokens: int, *, ignore_eos: bool = False
) -> ReplayResult:
    """transformers `generate_batch` with block sharing, greedy, one call per batch of prompt ids
    (ignore_eos: eos_token_id=-1, which generate_batch reads as "no EOS")."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    model = hf_model(lm)
    eos = [] if ignore_eos else sorted(eos_token_ids(lm.model, lm.tokenizer))
    gen_cfg = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos or -1,
        pad_token_id=lm.tokenizer.pad_token_id,
    )
    out = ReplayResult()
    quiet = logging.getLogger("ContinuousBatchingLogger")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for batches in inputs:
            for ids in batches:
                t0 = time.perf_counter()
                res = model.generate_batch(
                    inputs=ids,
                    generation_config=gen_cfg,
                    continuous_batching_config=ContinuousBatchingConfig(**CB_SETTINGS),
                )
                out.wall_s += time.perf_counter() - t0
                ordered = [res[k] for k in sorted(res, key=_request_index)]
                if len(ordered) != len(ids) or any(r.error for r in ordered):
                    errors = [r.error for r in ordered if r.error]
                    raise RuntimeError(
                        f"generate_batch returned {len(ordered)} of {len(ids)} requests; {errors[:1]}"
                    )
                out.outputs += [_strip(r.generated_tokens, set(eos)) for r in ordered]
                out.prompt_tokens += sum(len(i) for i in ids)
                out.generated_tokens += sum(len(r.generated_tokens) for r in ordered)
                out.requests += len(ids)
    finally:
        quiet.setLevel(level)
    return out


def _request_index(key: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", key)
    return (int(m.group(1)) if m else 0, key)


def token_agreement(a: ReplayResult, b: ReplayResult) -> float:
    """Fraction of requests whose generated ids are identical on both sides."""
    n = max(len(a.outputs), len(b.outputs))
    if n == 0:
        return 1.0
    return sum(1 for x, y in zip(a.outputs, b.outputs) if x == y) / n


def warm_up_hf(lm: LanguageModel) -> None:
    """One tiny generate_batch call (builds the model copy, first-call overheads)."""
    replay_hf(lm, [[[lm.tokenizer.encode("Warm up: 1 2 3", add_special_tokens=False)]]], 2)
