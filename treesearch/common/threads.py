"""Torch's CPU threads on a shared machine: a passive OpenMP wait policy, set before torch loads.

Torch's CPU wheels run their parallel loops on GNU OpenMP (libgomp). Between loops its worker
threads spin (busy-wait) before sleeping, so a process that is waiting still burns its cores; two
processes that each spin on all the cores slow each other by an order of magnitude (a `treesearch
run` of 3 inputs: 714 s beside another busy process, against 37 s for 2 inputs with `--threads 1`).
With OMP_WAIT_POLICY=PASSIVE a waiting thread sleeps at once. libgomp reads the variable once,
when torch loads it, so it has to be in the environment before `import torch`; the command line
and `load_model` set it then, unless the user set it (any value, e.g. ACTIVE, is kept).
`treesearch bench threads` measures both policies on a quiet and on a busy machine.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"


def passive_openmp_wait(environ: MutableMapping[str, str] | None = None) -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE in the environment unless the user set it or torch is already
    imported (then it would have no effect). True when it set it."""
    env = os.environ if environ is None else environ
    if WAIT_POLICY in env or "torch" in sys.modules:
        return False
    env[WAIT_POLICY] = PASSIVE
    return True
