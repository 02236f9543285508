"""The engine on a CUDA GPU, what only a device run checks: models load onto it, a layer-exit rule
gets its tensors there, and in bf16 exact sharing agrees with no sharing as closely as bf16 allows.
That exact sharing is lossless in fp32 on the GPU is checked by tests/engine/test_lossless.py's
`cuda` cases (every case there takes a device).

Marked `cuda`; skipped without a GPU. `TREESEARCH_TEST_DEVICE=cpu` runs the same checks on the CPU
at small sizes (that is how `scripts/device-check --cpu` tests them on a machine without a GPU).

bf16 and exact sharing: bit-identity is not expected, since reusing a prefix changes the shapes of
the matrix products (and so their rounding), and greedy decoding over random weights amplifies any
rounding: a near-tie between two tokens flips, and the rest of the sequence differs. So the bf16
check measures and bounds: how often off and exact pick the same first token, how long their greedy
sequences agree, and how far the label log-probabilities of the scoring pass differ; and it prints
the noise floor of bf16 itself (off batched vs off one prompt at a time). A real bug (wrong
positions, a wrong or missing prefix) gives first tokens that agree by chance only (1 in 128,256),
a common prefix of at most one token once decoding goes wrong (1/32 = 0.03), and label logits off
by about one nat (the random logits' spread). Measured on a CPU in bf16 (full 16 layers, 8 prompts
x 24 tokens): first tokens 8/8, common prefix 0.34 of the tokens, |dP(yes)| at most 0.024; with 4
layers and 16 tokens the noise floor (off batched vs alone) was a common prefix of 0.58 to 0.73.
"""

from __future__ import annotations

import math
import os

import pytest
import torch

from treesearch import Engine, RKSCConfig, Sampling, load_model

DEVICE = os.environ.get("TREESEARCH_TEST_DEVICE", "cuda")
ON_GPU = DEVICE.startswith("cuda")
pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        ON_GPU and not torch.cuda.is_available(),
        reason="needs a CUDA GPU (torch.cuda.is_available() is False); "
        "TREESEARCH_TEST_DEVICE=cpu runs these checks on the CPU at small sizes",
    ),
]
# bf16 check sizes: the real 1B shape on a GPU; 2 of its 16 layers and fewer tokens on a CPU
BF16 = {"layers": None, "prompts": 16, "tokens": 32} if ON_GPU else {"layers": 2, "prompts": 8, "tokens": 8}
# bounds for bf16 (see the module docstring): loose against bf16 noise, far from what a bug gives
MIN_FIRST_TOKEN_AGREEMENT = 0.5
MIN_COMMON_PREFIX = 0.1
MAX_LABEL_LOGPROB_DIFF = 0.5  # nats, over the whole vocabulary (Score.raw)
LABELS = [" yes", " no"]
FEW_SHOT = (
    "Solve the problem step by step, then give the answer after ####.\n"
    "Q: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nA: In May she sold 48 / 2 = 24 clips. "
    "Altogether 48 + 24 = 72. #### 72\n"
)


@pytest.fixture(scope="module")
def tiny_dev():
    return load_model("tiny", device=DEVICE)


def _on_device(lm) -> bool:
    want = torch.device(DEVICE).type
    tensors = list(lm.model.parameters()) + list(lm.model.buffers())
    return all(t.device.type == want for t in tensors)


def test_load_model_puts_tiny_and_dummy_models_on_the_device(tiny_dev):
    dummy = load_model("dummy:smollm2-135m", device=DEVICE, dtype="bfloat16")
    assert _on_device(tiny_dev) and tiny_dev.dtype == torch.float32
    assert _on_device(dummy) and dummy.dtype == torch.bfloat16
    assert dummy.model.model.rotary_emb.inv_freq.dtype == torch.float32


def test_tiny_per_row_layer_exit_keeps_the_other_rows_exact(tiny_dev):
    """A CGEE-style rule that stops row 0 after layer 2 (a bool tensor on the device); the other
    rows run every layer and score what a full pass scores."""
    prompts = [f"Is {k} + {k} = {2 * k}? Answer:" for k in range(4)]
    full = Engine(tiny_dev, RKSCConfig()).score(prompts, LABELS)

    def stop_row0_at_2(layer: int, probs: torch.Tensor) -> torch.Tensor:
        assert probs.device.type == torch.device(DEVICE).type
        return (torch.arange(probs.shape[0], device=probs.device) == 0) & (layer == 2)

    cut = Engine(tiny_dev, RKSCConfig()).score(prompts, LABELS, exit_rule=stop_row0_at_2)
    assert [s.layers_run for s in cut] == [2] + [tiny_dev.num_layers] * 3
    for a, b in zip(full[1:], cut[1:]):
        for lab in LABELS:
            assert b.probs[lab] == pytest.approx(a.probs[lab], abs=1e-4)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _agreement(a: list[list[int]], b: list[list[int]], tokens: int) -> tuple[float, float]:
    """(fraction of rows with the same first token, mean common prefix as a fraction of tokens)."""
    first = sum(x[0] == y[0] for x, y in zip(a, b)) / len(a)
    prefix = sum(_common_prefix(x, y) for x, y in zip(a, b)) / (len(a) * tokens)
    return first, prefix


def test_dummy_1b_bf16_exact_agrees_with_off_within_bf16_noise(capsys):
    from treesearch.models.dummy import dummy_model

    lm = dummy_model("dummy:llama-3.2-1b", device=DEVICE, dtype="bfloat16", num_layers=BF16["layers"])
    n, tokens = BF16["prompts"], BF16["tokens"]
    prompts = [
        FEW_SHOT + f"Q: A shop has {k + 3} crates of {2 * k + 5} apples and sells {k} crates. "
        "How many apples are left?\nA:"
        for k in range(n)
    ]
    sampling = Sampling(max_new_tokens=tokens, ignore_eos=True)
    ids, probs, logps = {}, {}, {}
    for mode in ("off", "exact"):
        eng = Engine(lm, RKSCConfig(kv_sharing=mode))
        ids[mode] = [g.token_ids for g in eng.generate(prompts, sampling)]
        scores = eng.score([p + " 42. Is this right? Answer yes or no:" for p in prompts], LABELS)
        probs[mode] = [s.probs[" yes"] for s in scores]
        logps[mode] = [math.log(s.raw[lab]) for s in scores for lab in LABELS]
        assert all(len(t) == tokens for t in ids[mode])
    alone = Engine(lm, RKSCConfig(kv_sharing="off"))
    ids["off-alone"] = [alone.generate([p], sampling)[0].token_ids for p in prompts]
    first, prefix = _agreement(ids["off"], ids["exact"], tokens)
    floor_first, floor_prefix = _agreement(ids["off"], ids["off-alone"], tokens)
    diffs = [abs(a - b) for a, b in zip(probs["off"], probs["exact"])]
    dlog = max(abs(a - b) for a, b in zip(logps["off"], logps["exact"]))
    with capsys.disabled():
        print(
            f"\nbf16 {lm.name} on {DEVICE}, {n} prompts x {tokens} greedy tokens: off vs exact: first token "
            f"{first:.3f}, common prefix {prefix:.3f}, |dP(yes)| max {max(diffs):.4f} mean "
            f"{sum(diffs) / len(diffs):.4f}, |d log P(label)| max {dlog:.4f}; bf16 noise floor (off batched "
            f"vs alone): first token {floor_first:.3f}, common prefix {floor_prefix:.3f}"
        )
    assert first >= MIN_FIRST_TOKEN_AGREEMENT
    assert prefix >= MIN_COMMON_PREFIX
    assert dlog <= MAX_LABEL_LOGPROB_DIFF
