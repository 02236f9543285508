"""Stable seeds: one helper that every part of the project derives its random seeds with."""

from __future__ import annotations

import hashlib


def stable_seed(*parts: int | str) -> int:
    """A 63-bit seed from integers and strings, the same on every run and machine (independent of
    PYTHONHASHSEED): the engine's per-row seeds, the Searcher's per-node seeds and the bench's
    per-branch seeds all come from here, so a search or a benchmark repeats exactly."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFFFFFFFFFF
