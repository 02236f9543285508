"""Configuration dataclasses: what RKSC does (`RKSCConfig`) and how text is sampled (`Sampling`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from treesearch.common.errors import ConfigError

KV_MODES = ("off", "exact", "asks")
EVICTIONS = ("omega", "lru")


@dataclass
class RKSCConfig:
    """Switches and thresholds of the three RKSC policies.

    kv_sharing: "off" recomputes every context from scratch on every call (the no-reuse baseline);
        "exact" starts every forward from the longest cached token prefix (lossless);
        "asks" adds hidden-state-gated sharing between branches that differ in words, not meaning.
    block_size: tokens per KV block (the unit of memory accounting and eviction).
    cache_budget: bytes of KV the store may hold (None = unbounded); RSBCM evicts to stay under it.
    eviction: the order unread cached blocks are evicted in, and running rows preempted in, under a
        budget: "omega" (RSBCM: lowest score/(depth+1) first, ties least recently used) or "lru"
        (least recently used, the order vLLM and SGLang use; the latest admitted row is preempted).
    cgee: early exit for verification (skip when generation is decisive; stop at a settled layer).
    fast_decode: decode steps through `treesearch.engine.decoder` (packed weights, fused attention) where
        the model qualifies (a float32 Llama or Qwen2 on the CPU); False: through the transformers layers.
        Same tokens either way (logits agree within 1e-4, tests/test_decoder.py).
    step_tokens: the most uncached prompt tokens the local engine's scheduler prefills in one step;
        a longer prompt is prefilled in parts over consecutive steps, each beside the running rows'
        decode, so no decode step waits long for a long prompt. Same results whatever the value.
    """

    kv_sharing: str = "exact"
    block_size: int = 16
    cache_budget: int | None = None
    eviction: str = "omega"
    # ASKS gate: sigma = sum_l w_l cos(h_l, h_l_ref) / sum_l w_l, w_l = exp(alpha * l / L).
    # Calibrated on Game of 24 value prompts (examples/calibrate_asks.py, 20 puzzles of rows
    # 800-819, SmolLM2-135M): at tau 0.995 the attached rows kept the exact best label 100% of the time.
    asks_alpha: float = 8.0
    asks_tau: float = 0.995
    # CGEE
    cgee: bool = False
    tau_conf: float = 0.95
    margin: float = 0.1
    theta: float = 0.1
    eps: float = 0.01
    min_layer: int | None = None
    cgee_measure: bool = False
    fast_decode: bool = True
    step_tokens: int = 2048

    def __post_init__(self) -> None:
        if self.kv_sharing not in KV_MODES:
            raise ConfigError(f"kv_sharing={self.kv_sharing!r}; use one of {', '.join(KV_MODES)}")
        if self.block_size < 1:
            raise ConfigError(f"block_size={self.block_size}; use a positive number of tokens such as 16")
        if self.eviction not in EVICTIONS:
            raise ConfigError(f"eviction={self.eviction!r}; use one of {', '.join(EVICTIONS)}")
        if self.step_tokens < 1:
            raise ConfigError(f"step_tokens={self.step_tokens}; use a positive number of tokens such as 2048")
        if self.cache_budget is not None and self.cache_budget <= 0:
            raise ConfigError(f"cache_budget={self.cache_budget}; use a positive number of bytes or None")

    @property
    def shares(self) -> bool:
        """True when cached KV is reused between calls."""
        return self.kv_sharing != "off"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Sampling:
    """How the engine generates: greedy when temperature == 0, else temperature / top-p sampling.

    Generation stops at EOS, after max_new_tokens, or when the decoded text contains a stop string
    (the returned text ends before the stop string; the kept KV covers the tokens that were fed back).
    ignore_eos: neither EOS nor a stop string ends a row, so every row generates exactly
    max_new_tokens (fixed lengths for timing, e.g. with dummy weights; the returned text is still
    cut at the first stop string, so pass no stop strings when the text matters).
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int = 0
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens={self.max_new_tokens}; use at least 1")
        if self.temperature < 0:
            raise ConfigError(f"temperature={self.temperature}; use 0 for greedy or a positive value")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p={self.top_p}; use a value in (0, 1]")
        self.stop = tuple(self.stop)
