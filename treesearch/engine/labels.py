"""Labels of a value prompt scored as whole token sequences.

    P(label | prompt) = p(t_0 | prompt) * prod_{j >= 1} p(t_j | prompt, t_0 .. t_{j-1})

for a label of tokens t_0 .. t_m. The first factor is read from the scoring pass itself (its
last-position distribution over the vocabulary). The others come from one more forward, for all
rows and all multi-token labels at once: each (prompt, label) row feeds t_0 .. t_{m-1} after
the prompt, attending in place over the prompt's K/V (its cached chain plus the open segment the
scoring pass wrote; nothing is copied per label), and reads log p(t_j) at each position. Labels of one token
need nothing more, so a problem whose labels are all single tokens scores exactly as before.

`treesearch.engine.scoring` runs that forward for the rows of a batch that ran every layer.

CGEE Level 2 reads the labels' first tokens through a logit lens; it needs labels whose first
tokens differ. With labels that share a first token every verification runs all layers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from treesearch.cache.attention import Prefix
from treesearch.cache.direct_kv import Sink
from treesearch.common.errors import ProblemDefinitionError
from treesearch.common.stats import Stats
from treesearch.engine.forward import Forward


def label_sequences(tokenizer: Any, labels: Sequence[str]) -> list[list[int]]:
    """Each label's token ids; refused: a label that tokenizes to nothing, two labels alike."""
    seqs = []
    for lab in labels:
        toks = tokenizer.encode(lab, add_special_tokens=False) if isinstance(lab, str) else []
        if not toks:
            raise ProblemDefinitionError(
                f"label {lab!r} tokenizes to nothing; use a non-empty word such as ' yes'"
            )
        seqs.append(list(toks))
    if len({tuple(q) for q in seqs}) != len(seqs):
        raise ProblemDefinitionError(
            f"labels {list(labels)} tokenize alike ({seqs}); give each label its own words"
        )
    return seqs


def first_tokens_differ(seqs: Sequence[Sequence[int]]) -> bool:
    return len({q[0] for q in seqs}) == len(seqs)


def tail_logprobs(
    forward: Forward,
    prefixes: list[Prefix],
    tails: list[list[int]],
    starts: list[int],
    charge: list[Stats],
    sinks: list[Sink],
) -> list[float]:
    """For each row, sum_j log p(tail[j] | prefix, tail[:j]) over j >= 1: one forward of
    tail[:-1] at absolute positions starts[b].. over the row's prefix (K/V runs read in place),
    its own K/V written to sinks[b]."""
    hidden: list[torch.Tensor] = []
    forward.prefill_into(
        prefixes, [t[:-1] for t in tails], starts, sinks, charge, want_logits=False, capture=hidden
    )
    logp = torch.log_softmax(forward.head(hidden[-1]), dim=-1)  # [B, n, V], the forward's own head
    out = []
    for b, tail in enumerate(tails):
        targets = torch.tensor(tail[1:], device=logp.device)
        out.append(float(logp[b, torch.arange(len(tail) - 1, device=logp.device), targets].sum()))
    return out
