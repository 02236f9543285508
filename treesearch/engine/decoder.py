"""The fast decode step (`Decoder`) for Llama-style float32 models (Llama, Qwen2) on the CPU.

Why: a decode step through the transformers layers is mostly per-operation overhead (30 layers of
dozens of small eager ops, Python per layer and per cached run), not weight reads. This step runs
about 40 small ops per layer (views included) over weights packed once per model:
- q/k/v side by side in one projection (with their biases, as Qwen2 has) and gate/up in another.
  A step of up to `linear.KERNEL_ROWS` (6) rows multiplies the model's own float32 weights by the streaming
  kernel of `treesearch.models.int8_kernel` (no copy; a row's result the same bits at any batch
  size); wider products (prefill chunks, wide steps) use oneDNN's packed copy
  (`mkldnn._reorder_linear_weight`) of the folded matrix, where torch has oneDNN. The LM head keeps
  no copy. Each RMSNorm's weight multiplies the input first (folded into the packed copy's
  columns), and the attention scale multiplies q's outputs (folded into its packed rows).
- RoPE as x cos + roll(x, d/2) sin', sin' = sin with its first half negated (rotate_half in one op).
- Attention with `ATTENTION = "kernel"`: every run each row reads (cached prefix runs, shared or
  its own, and the step's buffer) in one compiled call per layer on all the step's threads, split
  into chunks merged by log-sum-exp (`treesearch.kernels.attend_kernel`); the torch ops below are
  the default (see `ATTENTION`); the torch ops below are the path where it cannot be built.
- Attention ("math", `_attend_joint`): one softmax over each row's buffer and the cached runs every
  row reads, their scores side by side (K/V read in place). The runs a row reads apart from the
  others (its own, and runs only some rows read) are merged into it by the compiled kernel of
  `treesearch.kernels.runs_kernel`, one call per layer, in place (`RUNS_KERNEL`). Without it:
  the row's own runs join the softmax (copied into one block per step when short and no cache
  budget is set), and runs that only some rows read (and every run, with `ATTENTION = "flash"`:
  SDPA's CPU flash kernel, slower here for a step's few query rows) are parts with their
  log-sum-exp l_i, merged at once (per row, head and query): out = sum_i e^{l_i - m} o_i /
  sum_i e^{l_i - m}, m = max_i l_i (the Hydragen decomposition, as in `treesearch.cache.attention`).

torch.compile was measured against this step and lost at every granularity tried
(`examples/measure_kv.py compile`; README, Performance), so nothing here is compiled.

`qualifies(model)`: a Llama or Qwen2 model (model_type "llama" or "qwen2", SiLU, no bias but on
q/k/v, full attention in every layer, float32, CPU); the RoPE base (Qwen2's 1e6) comes with the
model's own rotary embedding, and tied or untied LM heads read `lm_head`. Any other model decodes
through the transformers layers (`treesearch.engine.forward.Forward.layers`). Prefill and scoring
run the same packed products over a chunk of tokens per row (`layer_rows`), with the batch's own
shared-prefix attention (`treesearch.cache.attention.BatchKV.attend`).
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from treesearch.cache.attention import BatchKV
from treesearch.cache.direct_kv import DirectKV
from treesearch.engine.fused_step import FusedLayers
from treesearch.engine.linear import A8Linear, FloatLinear, Linear
from treesearch.engine.step_plan import Plan
from treesearch.kernels import attend_kernel, runs_kernel
from treesearch.kernels.attend_kernel import StepRuns
from treesearch.kernels.chunk_attend import add_rows
from treesearch.models.quantize import Int8Linear, W8A8Linear, is_quantized

# "math" (matmul, softmax with its log-normaliser, matmul), "flash" (SDPA's CPU flash kernel: per
# step in examples/measure_kv.py decode, several times slower over a 1,000-token prefix) or
# "kernel": every run in one compiled call per layer on all threads (`treesearch.kernels.attend_kernel`;
# where it cannot be built, "math"). `measure_kv.py limit` times the variants side by side; alone on
# a 2-core EPYC, two threads, 1,000-token context, the kernel's step against math's: default model
# 40 vs 53 ms at 1 row, 53 vs 63 at 4, 109 vs 125 at 16; 0.5B 81-88 vs 94-96 at 1 row, about equal
# at 4 and 16. (On a machine loaded ~9x over it lost: its barriers wait on descheduled threads.)
ATTENTION = "kernel"
# The runs each read by one row are copied side by side into one padded K/V block per step (two
# matrix products per layer for all rows, not two per row and run) when that block takes at most
# this many bytes: at 16 rows of 4-6 own tokens on the default model (a 4.4 MB block) the step
# took 1.10-1.15x less time (README, Performance). Longer own runs are read in place, one row at a
# time, and so are all runs under a cache budget (the copy is K/V memory the budget would not
# count: `Forward.pack_own_runs`).
PACK_SINGLES_BYTES = 8 << 20
# ("math" and "flash") The attention's small products each pay an intra-op fork/join: run them on one
# thread, the dense products on all (2 cores, a 14-row step: 297 ms -> 127 ms; README, Running a test
# set). The "kernel" attention shares its work out over the threads itself.
SERIAL_ATTENTION = True
# The runs each row reads apart from the others (its own, and runs some rows read) through the
# compiled kernel of `treesearch.kernels.runs_kernel` where it builds: one call per layer instead of
# two products per row and run (False: always the torch ops below).
RUNS_KERNEL = True
# Steps the compiled layer calls take (`treesearch.engine.fused_step`: two per layer around the
# attention kernel, instead of ~30 torch ops) run there; False: always the torch ops below.
FUSED = True

MODEL_TYPES = ("llama", "qwen2")  # the same decoder layer; Qwen2 adds q/k/v biases and its RoPE base
_DECODERS: weakref.WeakKeyDictionary[Any, Decoder] = weakref.WeakKeyDictionary()


def qualifies(model: Any) -> bool:
    """True when `Decoder` computes exactly what the model's own layers do (see the module doc)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in MODEL_TYPES or not hasattr(model, "model"):
        return False
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False  # a sliding window: not what this step's attention computes
    for layer in model.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        if any(
            getattr(m, "bias", None) is not None
            for m in (att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        ):
            return False
    if is_quantized(model):  # int8 weights (`treesearch.models.quantize`): CPU and float32 activations
        return isinstance(model.lm_head, (Int8Linear, W8A8Linear)) and model.lm_head.bias is None
    w = model.lm_head.weight
    return (
        w.dtype == torch.float32 and w.device.type == "cpu" and getattr(model.lm_head, "bias", None) is None
    )


def decoder_for(model: Any) -> Decoder:
    """The model's `Decoder`, packed once and rebuilt when a weight changed in place since."""
    dec = _DECODERS.get(model)
    if dec is None or dec.stale(model):
        dec = Decoder(model)
        _DECODERS[model] = dec
    return dec


def _weights_version(model: Any) -> int:
    """Sum of the parameters' in-place version counters: changes when any weight is written."""
    return sum(p._version for p in model.parameters())


class Layer:
    """One decoder layer's weights, packed: norms, fused q/k/v (and their biases), output, fused
    gate/up, down."""

    qkv: Linear | FloatLinear
    o: Linear | FloatLinear
    gate_up: Linear | FloatLinear
    down: Linear | FloatLinear

    def __init__(self, layer: Any) -> None:
        att, mlp = layer.self_attn, layer.mlp
        if hasattr(layer, "int8"):
            self._int8(layer)
            return
        # each RMSNorm's weight is folded into the columns of the projections it feeds ((x w) W^T =
        # x (W diag w)^T), and q's rows carry the attention scale (RoPE is linear, so scaling before
        # it is the same; for head_dim 64 the scale is 1/8, a power of two, exact in float32); q's
        # bias (Qwen2) is scaled with its rows, and the norm's weight does not touch a bias
        ln1 = layer.input_layernorm.weight.detach()
        ln2 = layer.post_attention_layernorm.weight.detach()
        self.qkv = FloatLinear(
            [
                (p.weight, att.scaling if p is att.q_proj else 1.0, getattr(p, "bias", None))
                for p in (att.q_proj, att.k_proj, att.v_proj)
            ],
            in_scale=ln1,
        )
        self.o = FloatLinear([(att.o_proj.weight, 1.0, None)])
        self.gate_up = FloatLinear(
            [(mlp.gate_proj.weight, 1.0, None), (mlp.up_proj.weight, 1.0, None)], in_scale=ln2
        )
        self.down = FloatLinear([(mlp.down_proj.weight, 1.0, None)])
        self.inter = mlp.gate_proj.weight.shape[0]

    def _int8(self, layer: Any) -> None:
        """The int8 layer (`treesearch.models.quantize.Int8Layer`): q/k/v and gate/up read from the
        modules' views of the layer's fused int8 buffers (one kernel call each); the attention
        scale goes into q's channel scales (and bias), the norms' weights are applied to the input
        (`Linear.in_scale`)."""
        att, mlp = layer.self_attn, layer.mlp
        q, k, v = att.q_proj, att.k_proj, att.v_proj
        qb = None if q.bias is None else q.bias * att.scaling
        ln1 = layer.input_layernorm.weight.detach()
        ln2 = layer.post_attention_layernorm.weight.detach()
        qkv = [
            (q.qweight, q.scale * att.scaling, qb),
            (k.qweight, k.scale, k.bias),
            (v.qweight, v.scale, v.bias),
        ]
        # int8a8 (`quantize.to_int8a8`): the w8a8 product, outside the compiled layer calls
        lin: Any = A8Linear if q.qweight.dtype == torch.uint8 else Linear
        self.qkv = lin(qkv, in_scale=ln1)
        self.o = lin([(att.o_proj.qweight, att.o_proj.scale, None)])
        gu = [(m.qweight, m.scale, None) for m in (mlp.gate_proj, mlp.up_proj)]
        self.gate_up = lin(gu, in_scale=ln2)
        self.down = lin([(mlp.down_proj.qweight, mlp.down_proj.scale, None)])
        self.inter = mlp.gate_proj.out_features


class Decoder:
    """One decode step (one new token per row) of a qualifying model over a `BatchKV`."""

    def __init__(self, model: Any) -> None:
        if not qualifies(model):
            raise ValueError(
                f"{type(model).__name__} does not qualify for the fast decode step "
                "(a float32 Llama or Qwen2 on the CPU); decode through Forward.layers instead"
            )
        base, cfg = model.model, model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size
        self.rotary = base.rotary_emb
        self._rope_table = (torch.empty(0, self.head_dim), torch.empty(0, self.head_dim))  # `_step_rope`
        self.context = getattr(cfg, "max_position_embeddings", None) or 0
        norm = base.norm.weight.detach()
        self.head: Linear | FloatLinear | A8Linear
        if is_quantized(model):  # the int8 table (shared with the head when tied): rows made per lookup
            emb, head = base.embed_tokens, model.lm_head
            self.embed = emb.forward
            lin = A8Linear if head.qweight.dtype == torch.uint8 else Linear  # int8a8: the w8a8 product
            self.head = lin([(head.qweight, head.scale, None)], in_scale=norm)
        else:
            weight = base.embed_tokens.weight.detach()
            self.embed = lambda ids: F.embedding(ids, weight)  # token ids -> rows
            # the final norm's weight applied to the input; no packed copy (the head is read a row at a
            # time, and its weight is as large as the embedding table it is often tied to)
            self.head = FloatLinear([(model.lm_head.weight, 1.0, None)], in_scale=norm, pack=False)
        self.layers = [Layer(layer) for layer in base.layers]
        self.fused = FusedLayers.make(
            self.layers, self.eps, self.heads, self.kv_heads, self.head_dim, self.head
        )
        self.version = _weights_version(model)

    def stale(self, model: Any) -> bool:
        """True when a weight of model was written in place since this decoder packed it."""
        return self.version != _weights_version(model)

    @torch.no_grad()
    def step(
        self, toks: list[int], positions: list[int], batch: BatchKV, write_pos: int, *, pack: bool = True
    ) -> torch.Tensor:
        """Each row's last token (at absolute positions given; its K/V goes to buffer position
        write_pos) -> next-token logits [B, V]. pack: the rows' own runs may be copied into one
        block for the step (up to PACK_SINGLES_BYTES); False under a cache budget, which bounds
        all K/V memory and does not count that copy."""
        bsz = len(toks)
        x = self.embed(torch.tensor(toks))  # [B, D]
        cos, sin = self._step_rope(positions)  # [B, 1, d] each
        batch.valid[:, write_pos] = True
        t = write_pos + 1
        fn = attend_kernel.load() if ATTENTION == "kernel" else None
        runs = step_runs(batch, t) if fn is not None else None
        if runs is not None:
            return self._kernel_step(x, cos, sin, batch, write_pos, runs, fn)
        valid = batch.valid[:, :t]
        mask = (
            None
            if bool(valid.all())
            else torch.zeros(bsz, 1, 1, t).masked_fill_(~valid[:, None, None, :], float("-inf"))
        )
        attention = "math" if ATTENTION == "kernel" else ATTENTION
        kernel = runs_kernel.load() if RUNS_KERNEL and attention == "math" else None
        threads = torch.get_num_threads()
        plan = Plan(batch, write_pos, mask, PACK_SINGLES_BYTES if pack else 0, attention, kernel, threads)
        serial = SERIAL_ATTENTION and threads > 1
        for i, lw in enumerate(self.layers):
            qkv = lw.qkv(self._norm(x))
            if serial:  # the attention's small ops on this thread alone, the products on all
                torch.set_num_threads(1)
                try:
                    attn = self._attend(i, qkv, cos, sin, plan)
                finally:
                    torch.set_num_threads(threads)
            else:
                attn = self._attend(i, qkv, cos, sin, plan)
            x = self.dense(lw, attn, x)
        return self.head(self._norm(x))

    def _kernel_step(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        batch: BatchKV,
        write_pos: int,
        runs: StepRuns,
        fn: Any,
    ) -> torch.Tensor:
        """The step with `attend_kernel`: per layer q/k/v, RoPE, the new K/V written into the
        buffer, then one kernel call for the whole attention on all threads; -> logits [B, V]."""
        bsz, d, heads, hkv = x.shape[0], self.head_dim, self.heads, self.kv_heads
        threads = torch.get_num_threads()
        if FUSED and self.fused is not None and self.fused.takes(bsz):
            k_at, v_at = batch.k[:, :, :, write_pos], batch.v[:, :, :, write_pos]  # [L, B, Hkv, d]
            out = self.fused.run(x, cos, sin, k_at, v_at, runs, fn, threads)
            return out if self.fused.head is not None else self.head(self._norm(out))
        k_new = batch.k[:, :, :, write_pos].unbind(0)  # L x [B, Hkv, d]
        v_new = batch.v[:, :, :, write_pos].unbind(0)
        out = x.new_empty(bsz, hkv, heads // hkv, d)  # each layer's attention, read before the next's
        attn = out.view(bsz, heads * d)
        qk_end = (heads + hkv) * d
        for i, lw in enumerate(self.layers):
            qkv = lw.qkv(self._norm(x))
            qk = qkv[:, :qk_end].view(bsz, heads + hkv, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE on q and k together
            k_new[i].copy_(qk[:, heads:])
            v_new[i].copy_(qkv[:, qk_end:].view(bsz, hkv, d))
            runs.attend(fn, i, qk[:, :heads].view(bsz, hkv, heads // hkv, d), out, threads)
            x = self.dense(lw, attn, x)
        return self.head(self._norm(x))

    def _step_rope(self, positions: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """`rope` at each row's position -> cos, sin' [B, 1, d], read from a table `rope` made
        for positions 0..n-1 at once (each entry one product and its cos or sin: the same bits as
        at one position), grown past the largest position asked for."""
        cos, sin = self._rope_table
        top = max(positions) + 1
        if top > cos.shape[0]:  # doubled, up to the model's context (past it only as asked)
            n = max(2 * cos.shape[0], 1024)
            n = max(top, min(n, self.context) if self.context else n)
            cos, sin = (t[0] for t in self.rope(torch.arange(n)[None]))  # [n, d] each
            self._rope_table = cos, sin
        at = torch.tensor(positions)
        return cos[at, None], sin[at, None]

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin' (sin with its first half negated: rotate_half in one op) at positions pos
        [B, n] -> [B, n, d] each, from the model's own rotary embedding."""
        cos, sin = self.rotary(torch.zeros(1, dtype=torch.float32), position_ids=pos)  # dtype, device only
        half = self.head_dim // 2
        return cos, torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)

    @torch.no_grad()
    def layer_rows(
        self,
        layer: int,
        h: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: BatchKV | DirectKV,
    ) -> torch.Tensor:
        """One decoder layer over a chunk of n tokens per row (prefill, scoring): the packed
        products over all B n rows at once, RoPE, and the batch's own attention (its buffer,
        causal, and the cached prefix runs, `BatchKV.attend`: the layer path's, so the K/V it
        writes is where the layer path writes it). h [B, n, D] -> the layer's output [B, n, D]."""
        bsz, n, dim = h.shape
        d, heads, hkv = self.head_dim, self.heads, self.kv_heads
        cos, sin = rope
        lw = self.layers[layer]
        x = h.reshape(bsz * n, dim)
        qkv = lw.qkv(self._norm(x))  # [B n, (H + 2 Hkv) d]
        qk_end = (heads + hkv) * d
        qk = qkv[:, :qk_end].view(bsz, n, heads + hkv, d)
        qk = torch.addcmul(qk * cos[:, :, None], qk.roll(d // 2, -1), sin[:, :, None])  # RoPE
        q = qk[:, :, :heads].transpose(1, 2)  # [B, H, n, d], already scaled
        k = qk[:, :, heads:].transpose(1, 2)  # [B, Hkv, n, d]
        v = qkv[:, qk_end:].view(bsz, n, hkv, d).transpose(1, 2)
        attn = batch.attend(layer, q, k, v, 1.0)  # [B, n, H, d]
        return self.dense(lw, attn.reshape(bsz * n, heads * d), x).view(bsz, n, dim)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits of hidden states [B, D] (the final norm and the LM head)."""
        return self.head(self._norm(hidden))

    def dense(self, lw: Layer, attn: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A layer's part after attention: output projection + residual, RMSNorm, gate/up, SiLU x
        up, down + residual. attn [B, H d], x [B, D] -> the layer's output [B, D]."""
        x = lw.o.add(attn, x)
        gu = lw.gate_up(self._norm(x))  # [B, 2I]
        return lw.down.add(F.silu(gu[:, : lw.inter]) * gu[:, lw.inter :], x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        """RMSNorm without its weight (folded into the next projection): x / sqrt(mean(x^2) + eps),
        as the model's own RMSNorm computes it, in five small ops (F.rms_norm runs about eight here)."""
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True).add_(self.eps))

    def _attend(
        self, layer: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan: Plan
    ) -> torch.Tensor:
        """RoPE, write the new K/V into the buffer, attend over buffer and prefix runs -> [B, H d]."""
        bsz, d, heads, hkv = qkv.shape[0], self.head_dim, self.heads, self.kv_heads
        g = heads // hkv
        qk = qkv[:, : (heads + hkv) * d].view(bsz, heads + hkv, d)
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE on q and k together
        q = qk[:, :heads].view(bsz, hkv, g, d)  # head h uses kv head h // g; already scaled
        plan.k_new[layer].copy_(qk[:, heads:])
        plan.v_new[layer].copy_(qkv[:, (heads + hkv) * d :].view(bsz, hkv, d))
        if ATTENTION == "math":
            one = bsz == 1 and not plan.singles and not plan.parts and plan.runs is None
            out, lse = _attend_one(layer, q, plan) if one else _attend_joint(layer, q, plan)
            if plan.runs is not None:  # every run read apart, merged in place in one kernel call
                assert lse is not None
                plan.runs.attend(plan.kernel, layer, q, out, lse, plan.threads)
        else:
            out, lse = _flash(q, plan.k_buf[layer].transpose(-1, -2), plan.v_buf[layer], plan.mask)
        if plan.parts:
            assert lse is not None  # with parts, every attention above returns its log-normaliser
            outs, lses = [out], [lse]
            folded = None
            for ks_all, vs_all, rows in plan.parts:
                ks, vs = ks_all[layer], vs_all[layer]  # [1, Hkv, m, d]
                if isinstance(rows, int):  # one row: its queries as they are
                    o, lp = _flash(q[rows : rows + 1], ks, vs)
                else:  # several rows: their queries folded into one sequence per kv head
                    if rows is None:
                        folded = _fold(q) if folded is None else folded
                        qr, r = folded, bsz
                    else:
                        r = rows.shape[0]
                        qr = _fold(q.index_select(0, rows))
                    o, lp = _flash(qr, ks, vs)
                    o, lp = _unfold(o, r), lp.view(hkv, r, g).transpose(0, 1)
                outs.append(o)
                lses.append(lp)
            out = _merge(torch.cat(outs), torch.cat(lses), plan.rid, lse)
        return out.reshape(bsz, heads * d)


def step_runs(batch: BatchKV, t: int) -> StepRuns | None:
    """Every run a step's rows read, for `attend_kernel`: each row's cached prefix runs in its
    context order, then its valid stretches of the buffer up to t. None when some run is not one
    the kernel reads (`StepRuns.fits`)."""
    runs = StepRuns()
    if not add_rows(runs, batch.prefixes, batch.k, batch.v, batch.valid[:, :t]):
        return None
    runs.done(queries=batch.batch)
    return runs


def _fold(q: torch.Tensor) -> torch.Tensor:
    """[r, Hkv, g, x] -> [1, Hkv, r g, x]: several rows' queries as one sequence per kv head."""
    r, hkv, g, x = q.shape
    return q.transpose(0, 1).reshape(1, hkv, r * g, x)


def _unfold(o: torch.Tensor, r: int) -> torch.Tensor:
    """The inverse of `_fold`: [1, Hkv, r g, x] -> [r, Hkv, g, x] (a view)."""
    hkv, x = o.shape[1], o.shape[-1]
    return o.view(hkv, r, -1, x).transpose(0, 1)


def _attend_one(layer: int, q: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, None]:
    """`_attend_joint` for a batch of one row, in 3-d products (`bmm`, no matmul broadcasting): one
    row reads every run it has (all are `shared`); its buffer is masked where it was padded for
    rows that have finished since."""
    q3 = q[0]  # [Hkv, g, d]
    cols = [torch.bmm(q3, plan.k_buf[layer][0])] + [torch.bmm(q3, kt[layer]) for kt, _ in plan.shared]
    if plan.mask is not None:  # the padding of rows that have left the batch
        cols[0] = cols[0] + plan.mask[0]
    p = torch.softmax(torch.cat(cols, dim=-1) if len(cols) > 1 else cols[0], dim=-1)  # [Hkv, g, T]
    t = cols[0].shape[-1]
    out = torch.bmm(p[..., :t], plan.v_buf[layer][0])
    for (_, vs), c in zip(plan.shared, cols[1:]):
        m = c.shape[-1]
        out = torch.baddbmm(out, p[..., t : t + m], vs[layer])
        t += m
    return out.unsqueeze(0), None


def _attend_joint(layer: int, q: torch.Tensor, plan: Plan) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention of every row over its buffer, the runs all rows read and its own runs, as one
    softmax: the scores side by side (no K/V is copied, only scores: each row's own runs packed into
    one block padded with -inf to the longest row's), one softmax, each part's share of the
    probabilities times its V, summed. q [B, Hkv, g, d], already scaled -> (out [B, Hkv, g, d], its
    log-normaliser [B, Hkv, g] when some runs are merged after (`plan.parts`), else None)."""
    bsz = q.shape[0]
    scores = torch.matmul(q, plan.k_buf[layer])  # [B, Hkv, g, t]
    if plan.mask is not None:
        scores = scores + plan.mask
    cols = [scores]
    if plan.shared:
        qf = _fold(q)  # [1, Hkv, B g, d]
        cols += [_unfold(torch.matmul(qf, kt[layer]), bsz) for kt, _ in plan.shared]  # [B, Hkv, g, m]
    if plan.packed is not None:  # every row's own runs, side by side: one product for all rows
        kt, _, mask = plan.packed
        cols.append(torch.matmul(q, kt[layer]).add_(mask))  # [B, Hkv, g, S]
    elif plan.singles:
        block = q.new_full(q.shape[:-1] + (plan.single_len,), float("-inf"))  # [B, Hkv, g, S]
        for row, runs in plan.singles.items():
            qr, off = q[row], 0
            for kt, _, m in runs:
                torch.matmul(qr, kt[layer], out=block[row, :, :, off : off + m])
                off += m
        cols.append(block)
    scores = torch.cat(cols, dim=-1) if len(cols) > 1 else scores
    with_lse = plan.parts or plan.runs is not None
    p, lse = _softmax_lse(scores) if with_lse else (torch.softmax(scores, dim=-1), None)
    t = plan.v_buf[layer].shape[-2]
    out = torch.matmul(p[..., :t], plan.v_buf[layer])
    for _, vs in plan.shared:
        m = vs[layer].shape[-2]
        out = out + _unfold(torch.matmul(_fold(p[..., t : t + m]), vs[layer]), bsz)
        t += m
    if plan.packed is not None:
        out = out + torch.matmul(p[..., t:], plan.packed[1][layer])
        return out, lse
    for row, runs in plan.singles.items():
        orow, off = out[row], t
        for _, vs, m in runs:
            orow.baddbmm_(p[row, :, :, off : off + m], vs[layer])
            off += m
    return out, lse


def _flash(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its log-normaliser: q [N, Hkv, n, d] (already scaled), k/v [N, Hkv, m, d] ->
    (out [N, Hkv, n, d], lse [N, Hkv, n]). "flash": SDPA's CPU flash kernel in one op; "math": five
    ops, faster for the few query rows of a decode step."""
    if ATTENTION == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask, scale=1.0
        )
    s = torch.matmul(q, k.transpose(-1, -2))  # [N, Hkv, n, m]
    if mask is not None:
        s = s + mask
    p, lse = _softmax_lse(s)
    return torch.matmul(p, v), lse


def _softmax_lse(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(s) and logsumexp(s) over the last dim, from torch's fused softmax: the largest
    probability is e^(max - lse), so lse = max(s) - log(max(p)) (it is at least 1/n: no underflow).
    About 3x faster here than logsumexp and exp(s - lse), which run several unfused passes."""
    p = torch.softmax(s, dim=-1)
    return p, s.amax(-1).sub_(p.amax(-1).log_())


def _merge(outs: torch.Tensor, lses: torch.Tensor, rid: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Merge partial attentions outs [K, Hkv, g, d] with log-normalisers lses [K, Hkv, g] into each
    row's (rid[k]: the row of part k; the first B parts are the rows' buffers, lse `first`)."""
    bsz = first.shape[0]
    rest = lses[bsz:]
    m = first.scatter_reduce(
        0, rid[bsz:, None, None].expand_as(rest), rest, "amax"
    )  # [B, Hkv, g]: max per row
    w = torch.exp(lses - m.index_select(0, rid))  # [K, Hkv, g]
    den = torch.zeros_like(first).index_add_(0, rid, w)
    num = outs.new_zeros((bsz,) + outs.shape[1:]).index_add_(0, rid, outs * w[..., None])
    return num / den[..., None]
