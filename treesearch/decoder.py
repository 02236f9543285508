"""The fast decode step (`Decoder`) for Llama-style float32 models on the CPU.

Why: a decode step through the transformers layers is mostly per-operation overhead (30 layers of
dozens of small eager ops, Python per layer and per cached run), not weight reads. This step runs
about 20 tensor ops per layer over weights packed once per model:
- q/k/v fused into one projection and gate/up into another; each packed for oneDNN's linear
  (`mkldnn._reorder_linear_weight`) where torch has it: on this project's machines it streams a
  matrix-vector product about twice as fast as `F.linear` and keeps batched rows near that rate.
  The packed weights are a second copy (the model's weight bytes again, held per model).
- RoPE as x cos + roll(x, d/2) sin', sin' = sin with its first half negated (rotate_half in one op).
- Attention over the batch's own buffer and each cached prefix run (`treesearch.attention.BatchKV`),
  each part with its log-sum-exp l_i (`ATTENTION`: plain matmul/logsumexp, or SDPA's CPU flash
  kernel, which returns l_i too but is slower here for a step's few query rows); all rows'
  parts merged at once (per row, head and query): out = sum_i e^{l_i - m} o_i / sum_i e^{l_i - m},
  m = max_i l_i (the Hydragen decomposition, as in `treesearch.attention`).

`qualifies(model)`: a Llama model (model_type "llama", SiLU, no biases, float32, CPU). Any other
model decodes through the transformers layers (`treesearch.forward.Forward.layers`). Prefill and
scoring always take the layer path; only the one-token decode step comes here.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
import torch.nn.functional as F

from .attention import BatchKV

PACK_ROWS = 4  # oneDNN's batch-size hint for packing: 4 and 16 stream alike at 1..16 rows, 1 is slower
# "math" (matmul, logsumexp, exp, matmul) or "flash" (SDPA's CPU flash kernel, which also returns
# the log-sum-exp): measured per step in examples/measure_kv.py decode; flash was several times
# slower over a 1,000-token prefix with a decode step's few query rows.
ATTENTION = "math"

_DECODERS: "weakref.WeakKeyDictionary[Any, Decoder]" = weakref.WeakKeyDictionary()


def qualifies(model: Any) -> bool:
    """True when `Decoder` computes exactly what the model's own layers do (see the module doc)."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) != "llama" or not hasattr(model, "model"):
        return False
    if getattr(cfg, "hidden_act", None) != "silu" or getattr(cfg, "attention_bias", False):
        return False
    if getattr(cfg, "mlp_bias", False) or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    w = model.lm_head.weight
    return w.dtype == torch.float32 and w.device.type == "cpu" and getattr(model.lm_head, "bias", None) is None


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


class Linear:
    """y = x W^T (+ other): W packed for oneDNN when torch has it, else a plain tensor."""

    def __init__(self, weight: torch.Tensor) -> None:
        w = weight.detach().contiguous()
        self.out_features = w.shape[0]
        self.mkldnn = torch.backends.mkldnn.is_available()
        self.w = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS) if self.mkldnn else w

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.mkldnn:
            return torch.ops.mkldnn._linear_pointwise(x, self.w, None, "none", [], "")
        return F.linear(x, self.w)

    def add(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """other + x W^T in one kernel (the residual connection)."""
        if self.mkldnn:
            return torch.ops.mkldnn._linear_pointwise.binary(x, other, self.w, None, "add")
        return torch.addmm(other, x, self.w.t())


class Layer:
    """One decoder layer's weights, packed: norms, fused q/k/v, output, fused gate/up, down."""

    def __init__(self, layer: Any) -> None:
        att, mlp = layer.self_attn, layer.mlp
        self.ln1 = layer.input_layernorm.weight.detach()
        self.ln2 = layer.post_attention_layernorm.weight.detach()
        self.qkv = Linear(torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]))
        self.o = Linear(att.o_proj.weight)
        self.gate_up = Linear(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        self.down = Linear(mlp.down_proj.weight)
        self.inter = mlp.gate_proj.weight.shape[0]


class Decoder:
    """One decode step (one new token per row) of a qualifying model over a `BatchKV`."""

    def __init__(self, model: Any) -> None:
        if not qualifies(model):
            raise ValueError(f"{type(model).__name__} does not qualify for the fast decode step "
                             "(a float32 Llama on the CPU); decode through Forward.layers instead")
        base, cfg = model.model, model.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = getattr(cfg, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.scale = base.layers[0].self_attn.scaling
        self.eps = cfg.rms_norm_eps
        self.hidden = cfg.hidden_size
        self.rotary = base.rotary_emb
        self.embed = base.embed_tokens.weight.detach()
        self.norm = base.norm.weight.detach()
        self.head = Linear(model.lm_head.weight)
        self.layers = [Layer(layer) for layer in base.layers]
        self.version = _weights_version(model)

    def stale(self, model: Any) -> bool:
        """True when a weight of model was written in place since this decoder packed it."""
        return self.version != _weights_version(model)

    @torch.no_grad()
    def step(self, toks: list[int], positions: list[int], batch: BatchKV, write_pos: int) -> torch.Tensor:
        """Each row's last token (at absolute positions given; its K/V goes to buffer position
        write_pos) -> next-token logits [B, V]."""
        bsz, d = len(toks), self.head_dim
        x = F.embedding(torch.tensor(toks), self.embed)  # [B, D]
        pos = torch.tensor(positions)[:, None]  # [B, 1]
        cos, sin = self.rotary(x[:, None], position_ids=pos)  # [B, 1, d] each
        half = d // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        batch.valid[:, write_pos] = True
        t = write_pos + 1
        mask = torch.zeros(bsz, 1, 1, t).masked_fill_(~batch.valid[:, None, None, :t], float("-inf"))
        # views made once per step, selected per layer: the new token's K/V slot, the buffer so far
        kv_new = (batch.k[:, :, :, write_pos], batch.v[:, :, :, write_pos])  # [L, B, Hkv, d]
        kv_buf = (batch.k[:, :, :, :t], batch.v[:, :, :, :t])  # [L, B, Hkv, t, d]
        parts = _prefix_parts(batch.groups, bsz)
        for i, lw in enumerate(self.layers):
            h = F.rms_norm(x, (self.hidden,), lw.ln1, self.eps)
            attn = self._attend(i, lw.qkv(h), cos, sin, kv_new, kv_buf, mask, parts)  # [B, H d]
            x = lw.o.add(attn, x)
            h = F.rms_norm(x, (self.hidden,), lw.ln2, self.eps)
            gu = lw.gate_up(h)  # [B, 2I]
            x = lw.down.add(F.silu(gu[:, :lw.inter]) * gu[:, lw.inter:], x)
        return self.head(F.rms_norm(x, (self.hidden,), self.norm, self.eps))

    def _attend(self, layer: int, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_new: tuple,
                kv_buf: tuple, mask: torch.Tensor, parts: tuple) -> torch.Tensor:
        """RoPE, write the new K/V into the buffer, attend over buffer and prefix runs -> [B, H d]."""
        bsz, d, heads, hkv = qkv.shape[0], self.head_dim, self.heads, self.kv_heads
        g = heads // hkv
        qk = qkv[:, :(heads + hkv) * d].view(bsz, heads + hkv, d)
        qk = torch.addcmul(qk * cos, qk.roll(d // 2, -1), sin)  # RoPE on q and k together
        q = qk[:, :heads].view(bsz, hkv, g, d)  # head h uses kv head h // g
        if ATTENTION == "math":
            q = q * self.scale  # scaled once for every part
        kv_new[0][layer].copy_(qk[:, heads:])
        kv_new[1][layer].copy_(qkv[:, (heads + hkv) * d:].view(bsz, hkv, d))
        out, lse = _flash(q, kv_buf[0][layer], kv_buf[1][layer], self.scale, mask)
        groups, rid = parts
        if groups:
            outs, lses = [out], [lse]
            folded = None
            for ks_all, vs_all, rows in groups:
                ks, vs = ks_all[layer], vs_all[layer]  # [1, Hkv, m, d]
                if isinstance(rows, int):  # one row: its queries as they are
                    o, lp = _flash(q[rows:rows + 1], ks, vs, self.scale)
                else:  # several rows: their queries folded into one sequence per kv head
                    if rows is None:
                        folded = q.transpose(0, 1).reshape(1, hkv, bsz * g, d) if folded is None else folded
                        qr, r = folded, bsz
                    else:
                        r = rows.shape[0]
                        qr = q.index_select(0, rows).transpose(0, 1).reshape(1, hkv, r * g, d)
                    o, lp = _flash(qr, ks, vs, self.scale)
                    o, lp = o.view(hkv, r, g, d).transpose(0, 1), lp.view(hkv, r, g).transpose(0, 1)
                outs.append(o)
                lses.append(lp)
            out = _merge(torch.cat(outs), torch.cat(lses), rid, lse)
        return out.reshape(bsz, heads * d)


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
           mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention with its log-normaliser: q [N, Hkv, n, d] (already scaled when ATTENTION is
    "math"), k/v [N, Hkv, m, d] -> (out [N, Hkv, n, d], lse [N, Hkv, n]). "flash": SDPA's CPU flash
    kernel in one op; "math": five ops, faster for the few query rows of a decode step."""
    if ATTENTION == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask,
                                                                           scale=scale)
    s = torch.matmul(q, k.transpose(-1, -2))  # [N, Hkv, n, m]
    if mask is not None:
        s = s + mask
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.exp(s - lse[..., None]), v), lse


def _merge(outs: torch.Tensor, lses: torch.Tensor, rid: torch.Tensor, first: torch.Tensor) -> torch.Tensor:
    """Merge partial attentions outs [K, Hkv, g, d] with log-normalisers lses [K, Hkv, g] into each
    row's (rid[k]: the row of part k; the first B parts are the rows' buffers, lse `first`)."""
    bsz = first.shape[0]
    rest = lses[bsz:]
    m = first.scatter_reduce(0, rid[bsz:, None, None].expand_as(rest), rest, "amax")  # [B, Hkv, g]: max per row
    w = torch.exp(lses - m.index_select(0, rid))  # [K, Hkv, g]
    den = torch.zeros_like(first).index_add_(0, rid, w)
    num = outs.new_zeros((bsz,) + outs.shape[1:]).index_add_(0, rid, outs * w[..., None])
    return num / den[..., None]


def _prefix_parts(groups: list, bsz: int) -> tuple[list, torch.Tensor | None]:
    """The batch's prefix groups as (K [L, 1, Hkv, m, d], V, rows) with rows None (all), an int
    (one row) or a tensor, and rid: the row of each merged part (the buffers' first, then each group's)."""
    if not groups:
        return [], None
    out, rids = [], [torch.arange(bsz)]
    for kv, used, rows in groups:
        ks, vs = kv[:, 0, :, :used].unsqueeze(1), kv[:, 1, :, :used].unsqueeze(1)
        if rows is None:
            out.append((ks, vs, None))
            rids.append(torch.arange(bsz))
        else:
            out.append((ks, vs, int(rows[0]) if rows.shape[0] == 1 else rows))
            rids.append(rows)
    return out, torch.cat(rids)
