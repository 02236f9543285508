"""`stable_seed`: a 63-bit seed that depends only on its parts (their values, types and order),
the same in every process whatever PYTHONHASHSEED, so searches and benchmarks repeat exactly."""

from __future__ import annotations

import os
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from treesearch.common.seeds import stable_seed

parts = st.lists(st.one_of(st.integers(-(2**70), 2**70), st.text(max_size=20)), max_size=6)


@given(parts)
def test_a_seed_is_a_63_bit_function_of_its_parts(p):
    s = stable_seed(*p)
    assert 0 <= s < 2**63
    assert stable_seed(*p) == s


def test_values_types_and_order_of_the_parts_all_change_the_seed():
    seeds = {stable_seed(), stable_seed(1), stable_seed("1"), stable_seed(1, 2), stable_seed(2, 1)}
    seeds |= {stable_seed("node", 7), stable_seed("node", 8), stable_seed("node7")}
    assert len(seeds) == 8


def test_the_seed_is_the_same_in_fresh_processes_with_different_hash_seeds():
    code = "from treesearch.common.seeds import stable_seed; print(stable_seed(3, 'node', 7))"
    outs = [
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": h},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for h in ("1", "2")
    ]
    assert outs == [str(stable_seed(3, "node", 7))] * 2
