"""The model forward: prefill, one decode step, label probabilities and sampling.

Every forward runs a batch of rows, each extending its own cached prefix (K/V tensors handed in by
the caller; this module never sees the cache) through shared-prefix attention
(`treesearch.cache.attention.BatchKV`; a prefill or scoring pass writes each row's new K/V into the
row's own tensor instead, `treesearch.cache.direct_kv.DirectKV`). Work is charged to `Stats` here,
where it is done: model_calls, prefill_tokens and decode_tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from treesearch.cache.attention import BatchKV, Prefix
from treesearch.cache.direct_kv import DirectKV, Sink
from treesearch.common.config import Sampling
from treesearch.common.stats import Stats, distinct
from treesearch.engine.decoder import decoder_for, qualifies
from treesearch.engine.eos import eos_token_ids
from treesearch.models import int8_kernel
from treesearch.models.model import LanguageModel


def cut_at_stop(text: str, stops: Sequence[str]) -> str:
    """text up to the first occurrence of any stop string."""
    cut = len(text)
    for s in stops:
        i = text.find(s)
        if i != -1:
            cut = min(cut, i)
    return text[:cut]


def sample(
    logits: torch.Tensor, sampling: Sampling, generators: Sequence[torch.Generator]
) -> tuple[list[int], list[float]]:
    """Next token of every row of logits [B, V] and its log p (untempered): argmax when greedy, else
    temperature + top-p. Each row draws from its own generator (results never depend on the batch);
    a draw is torch.multinomial's own rule (argmax of p / Exp(1) noise), done for all rows at once."""
    logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    if sampling.temperature == 0:
        toks = torch.argmax(logits, dim=-1)
    else:
        probs = torch.softmax(logits / sampling.temperature, dim=-1)
        if sampling.top_p < 1.0:
            sp, si = torch.sort(probs, descending=True, dim=-1)
            keep = torch.cumsum(sp, dim=-1) - sp < sampling.top_p
            probs = torch.zeros_like(probs).scatter_(1, si, torch.where(keep, sp, torch.zeros_like(sp)))
        probs = probs.cpu()
        noise = torch.stack([torch.empty(probs.shape[1]).exponential_(1, generator=g) for g in generators])
        toks = (probs / noise).argmax(dim=-1).to(logits.device)
    lps = logp.gather(1, toks[:, None])[:, 0]
    return toks.tolist(), lps.tolist()


# Prefill and scoring on the decoder's packed layers where a model has the decoder (`Forward`); False:
# through the transformers layers (the reference path), as every model without the decoder runs them.
FAST_PREFILL = True


class Forward:
    """Runs a `LanguageModel`'s decoder over a batch of rows with shared-prefix attention.

    fast_decode: decode steps through `treesearch.engine.decoder` (packed weights, fused kernels)
    where the model qualifies; otherwise the transformers layers (the reference the tests compare
    against, and the path of every model the decoder does not cover).
    fast_prefill (with the decoder; None: `FAST_PREFILL`; an attribute too): prefill and scoring
    on the same packed layers (`Decoder.layer_rows`), label probabilities read from the same
    forward; False: through the transformers layers. The two differ as the decode step does, in
    float32 rounding only (the norms' weights folded into the products, oneDNN's packed matrix
    products: the same sums in another order); the tokens are the same
    (tests/engine/test_fast_prefill.py, test_decoder.py, test_lossless.py).
    pack_own_runs: that step may copy each row's own cached runs into one block per step (False
    under a cache budget, which bounds all K/V memory)."""

    def __init__(
        self,
        lm: LanguageModel,
        *,
        fast_decode: bool = True,
        fast_prefill: bool | None = None,
        pack_own_runs: bool = True,
    ) -> None:
        self.lm = lm
        self.eos_ids = eos_token_ids(lm.model, lm.tokenizer)
        self.decoder = decoder_for(lm.model) if fast_decode and qualifies(lm.model) else None
        self.pack_own_runs = pack_own_runs  # the fast step may copy rows' own runs into one block (no budget)
        fast_prefill = FAST_PREFILL if fast_prefill is None else fast_prefill
        self.fast_prefill = fast_prefill and self.decoder is not None  # prefill and scoring packed too
        # seconds inside model forwards (prefill, scoring, decode steps) and their count: a call's
        # wall time less these is the engine's own time (scheduling, planning, results)
        self.busy_s = 0.0
        self.forwards = 0

    def prefill(
        self,
        prefixes: list[Prefix],
        news: list[list[int]],
        starts: list[int],
        *,
        extra: int,
        want_logits: bool,
        charge: Sequence[Stats],
        exit_rule: Callable | None = None,
        exits: Any = None,
        label_ids: list[int] | None = None,
        capture: list | None = None,
    ) -> tuple[BatchKV, Any]:
        """One padded forward of each row's new tokens (at absolute positions starts[b]..) over its
        prefix; returns (batch, result) with room in the batch for `extra` more tokens per row.
        result: last-position logits [B, V] (want_logits), label probabilities (label_ids; see
        `layers`) or None. charge[b]: the Stats row b's work is counted in. capture: a list that receives
        each decoder layer's output [B, n, hidden]."""
        t0 = time.perf_counter()
        lm = self.lm
        lens = [len(t) for t in news]
        batch = BatchKV(
            lm.num_layers, len(news), lm.num_kv_heads, lm.head_dim, max(lens) + extra, lm.dtype, lm.device
        )
        batch.set_prefixes(prefixes)
        result = self._chunk(batch, news, starts, want_logits, exit_rule, exits, label_ids, capture)
        self._count(charge, lens, t0)
        return batch, result

    def prefill_into(
        self,
        prefixes: list[Prefix],
        news: list[list[int]],
        starts: list[int],
        sinks: list[Sink],
        charge: Sequence[Stats],
        *,
        want_logits: bool = True,
        exit_rule: Callable | None = None,
        exits: Any = None,
        label_ids: list[int] | None = None,
        capture: list | None = None,
    ) -> Any:
        """`prefill` of each row's new tokens over its prefix, writing their K/V straight into the
        row's own tensor (sinks[b]: kv [L, 2, Hkv, cap, d] and the position its first new token
        goes to: a generate or score row's open segment) instead of a batch buffer (`DirectKV`).
        Returns `prefill`'s result (by default the last-position logits [B, V])."""
        t0 = time.perf_counter()
        lens = [len(t) for t in news]
        batch = DirectKV(sinks, lens, self.lm.device)
        batch.set_prefixes(prefixes)
        result = self._chunk(batch, news, starts, want_logits, exit_rule, exits, label_ids, capture)
        self._count(charge, lens, t0)
        return result

    def _chunk(self, batch, news, starts, want_logits, exit_rule, exits, label_ids, capture) -> Any:
        """Run each row's new tokens (padded to the longest) at positions starts[b].. through the
        layers over `batch`; `layers`' result."""
        lm = self.lm
        if self.decoder is not None and self.decoder.stale(lm.model):  # a weight changed in place
            self.decoder = decoder_for(lm.model)
        bsz = len(news)
        lens = [len(t) for t in news]
        nmax = max(lens)
        pad = lm.tokenizer.pad_token_id or 0
        ids = torch.full((bsz, nmax), pad, dtype=torch.long)
        for b, t in enumerate(news):
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.long)
        ar = torch.arange(nmax)
        valid = ar[None, :] < torch.tensor(lens)[:, None]
        pos = torch.tensor(starts)[:, None] + ar[None, :]
        batch.begin(0, valid.to(lm.device))
        last = torch.tensor([n - 1 for n in lens])
        return self.layers(
            ids.to(lm.device),
            pos.to(lm.device),
            batch,
            last,
            want_logits,
            exit_rule=exit_rule,
            exits=exits,
            label_ids=label_ids,
            capture=capture,
        )

    def _count(self, charge: Sequence[Stats], lens: list[int], t0: float) -> None:
        """A prefill forward's work: a model call per search, its tokens per row, its time."""
        for st in distinct(charge):
            st.model_calls += 1
        for st, n in zip(charge, lens):
            st.prefill_tokens += n
        self.busy_s += time.perf_counter() - t0
        self.forwards += 1

    def step(
        self, batch: BatchKV, toks: list[int], positions: list[int], write_pos: int, charge: Sequence[Stats]
    ) -> torch.Tensor:
        """One decode step: each row's last token (absolute positions given) -> next-token logits [B, V]."""
        t0 = time.perf_counter()
        if self.decoder is not None:
            logits = self.decoder.step(toks, positions, batch, write_pos, pack=self.pack_own_runs)
        else:
            dev = self.lm.device
            ids = torch.tensor(toks, dtype=torch.long, device=dev)[:, None]
            pos = torch.tensor(positions, device=dev)[:, None]
            batch.begin(write_pos, torch.ones(len(toks), 1, dtype=torch.bool, device=dev))
            logits = self.layers(ids, pos, batch, torch.zeros(len(toks), dtype=torch.long), True)
        for st in distinct(charge):
            st.model_calls += 1
        for st in charge:
            st.decode_tokens += 1
        self.busy_s += time.perf_counter() - t0
        self.forwards += 1
        return logits

    def finished(self, gen: list[int], sampling: Sampling) -> str | None:
        """ "eos", "stop" or None for a row whose generated ids so far are gen (always None with
        `sampling.ignore_eos`: fixed lengths, only max_new_tokens ends a row)."""
        if sampling.ignore_eos:
            return None
        if gen[-1] in self.eos_ids:
            return "eos"
        if sampling.stop:
            tail = self.lm.tokenizer.decode(gen[-16:], skip_special_tokens=True)
            if any(s in tail for s in sampling.stop):
                return "stop"
        return None

    def layers(
        self,
        ids,
        pos,
        batch: BatchKV | DirectKV,
        last,
        want_logits: bool,
        *,
        exit_rule=None,
        exits=None,
        label_ids=None,
        capture: list | None = None,
    ):
        """Embed, run the decoder layers with shared-prefix attention, return last-position logits.

        With exit_rule, label probabilities are read through the final norm and LM head after every
        layer (a logit lens) and the pass stops where the rule says: returns (probs, layers_run) for
        a whole-batch verdict, or `exits` (a `treesearch.policies.cgee.RowExits`) when the rule decides per
        row (a bool tensor): the rows it marks stop there, the others run on.
        """
        model = self.lm.model
        base = model.model
        fast = self.decoder if self.fast_prefill else None
        if fast is not None:  # the packed layers (`Decoder.layer_rows`)
            h = fast.embed(ids)
            pe = fast.rope(pos)
        else:
            h = base.embed_tokens(ids)
            pe = base.rotary_emb(h, position_ids=pos)
        rows = torch.arange(ids.shape[0], device=ids.device)
        last = last.to(ids.device)
        layers = base.layers
        per_row = False
        for i, layer in enumerate(layers):
            if fast is not None:
                h = fast.layer_rows(i, h, pe, batch)
            else:
                h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=pe, ts_batch=batch)
            if capture is not None:
                capture.append(h)
            if exit_rule is not None and i < len(layers) - 1:
                probs = self.label_probs(base.norm(h[rows, last]), label_ids)
                verdict = exit_rule(i + 1, probs)
                if isinstance(verdict, torch.Tensor):
                    per_row = True
                    keep = exits.drop(verdict, probs, i + 1)
                    if not exits.alive:
                        return exits
                    if keep is not None:  # rows that settled stop here; the others run on
                        idx = torch.tensor(keep, dtype=torch.long, device=h.device)
                        h, pos, last = h[idx], pos[idx], last[idx]
                        pe = (pe[0][idx], pe[1][idx])
                        rows = torch.arange(len(keep), device=h.device)
                        batch.select(keep)
                elif verdict:
                    return probs, i + 1
        if not want_logits:
            return None
        logits = self.head(h[rows, last])
        if per_row:
            exits.finish(torch.softmax(logits, dim=-1), len(layers))
            return exits
        if label_ids is not None:
            return torch.softmax(logits, dim=-1), len(layers)
        return logits

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits of hidden states [..., D] through the final norm and the LM head, on the
        path the forward ran (the decoder's packed head with fast prefill, else the model's own)."""
        fast = self.decoder if self.fast_prefill else None
        if fast is None:
            model = self.lm.model
            return model.lm_head(model.model.norm(hidden)).float()
        shape = hidden.shape
        return fast.logits(hidden.reshape(-1, shape[-1])).float().view(*shape[:-1], -1)

    def label_probs(self, hidden: torch.Tensor, label_ids: list[int]) -> torch.Tensor:
        """Softmax over the labels' logits only: the LM head's rows of the labels, not the whole
        vocabulary (a full head per layer would cost more than the layer itself)."""
        head = self.lm.model.lm_head
        idx = torch.as_tensor(label_ids, device=hidden.device)
        rows = head.weight_rows(idx) if hasattr(head, "weight_rows") else head.weight.index_select(0, idx)
        bias = head.bias.index_select(0, idx) if getattr(head, "bias", None) is not None else None
        if hidden.dtype == rows.dtype == torch.float32 and hidden.device.type == "cpu":
            # the compiled product: a row's sums its own, so its probabilities are the same bits in
            # any batch (a matrix product's summation order may depend on the batch's rows)
            logits = int8_kernel.float_linear(hidden.contiguous(), rows.contiguous(), bias)
        else:
            logits = hidden @ rows.T
            logits = logits if bias is None else logits + bias
        return torch.softmax(logits.float(), dim=-1)
