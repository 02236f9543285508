"""Torch's CPU threads on a shared machine: a bounded OpenMP spin, set before torch loads.

Torch's CPU wheels run their parallel loops on GNU OpenMP (libgomp). Between loops a worker thread
spins (busy-waits) up to GOMP_SPINCOUNT iterations before it sleeps; libgomp's own default is
300,000, so two processes that each spin on all the cores slow each other by an order of magnitude
(SmolLM2-135M beside another torch decode: 810 ms a token against 57 quiet). Sleeping at once
(OMP_WAIT_POLICY=PASSIVE) cures that (145 ms busy) but costs 2.1x on a quiet machine (119 ms), since
every one of a decode step's hundreds of small parallel loops then wakes its threads from sleep.
A bounded spin of SPIN_COUNT keeps most of both: 65 ms quiet, 241 ms busy (measured with
`treesearch bench threads`; docs/guide/test-sets.md, Threads). libgomp reads the variables once, when
torch loads it, so they must be in the environment before `import torch`: the command line and `load_model`
set GOMP_SPINCOUNT then, unless the user set either variable (their choice is kept).
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN = "GOMP_SPINCOUNT"
SPIN_COUNT = "10000"


def bounded_openmp_wait(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set GOMP_SPINCOUNT=SPIN_COUNT unless the user set it or OMP_WAIT_POLICY, or torch is already
    imported (then it would have no effect). True when it set it."""
    env = os.environ if environ is None else environ
    if WAIT_POLICY in env or SPIN in env or "torch" in sys.modules:
        return False
    env[SPIN] = SPIN_COUNT
    return True
