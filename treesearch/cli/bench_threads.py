"""`treesearch bench threads`: one short fixed decode under each OpenMP wait policy (libgomp's default
spin, OMP_WAIT_POLICY=PASSIVE, and treesearch's bounded spin GOMP_SPINCOUNT=10000), on a quiet machine
and beside a busy process, in one run.

Each measurement is a fresh process (libgomp reads the policy once, when torch loads): it loads the
model, warms up, then times `--rounds` greedy generate calls of `--rows` prompts x `--tokens` new
tokens (EOS ignored) and reports the median seconds per call. "busy" starts the competitor first
and waits until it runs: `--busy torch` is another torch process decoding the same way in a loop
with torch's default policy (an older treesearch, or any torch job), `--busy spin` one pure-Python
busy loop per core. Printed: one JSON line per (policy, machine) and one of ratios; the figures
are the machine's, never asserted (`treesearch.common.threads` says why the default is a bounded spin).

    treesearch bench threads                       # tiny model, ~30 s on 2 quiet cores
    treesearch bench threads --model SmolLM2-135M-Instruct --tokens 16 --busy spin --json threads.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from treesearch.cli.flags import add_json_flag
from treesearch.cli.parser import ArgumentParser
from treesearch.common.errors import UsageError
from treesearch.common.threads import SPIN, SPIN_COUNT, WAIT_POLICY

POLICIES = ("default", "passive", "bounded")  # libgomp's own, sleep at once, treesearch's
MACHINES = ("quiet", "busy")
READY = "ready"


def build_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="treesearch bench threads",
        description="A short fixed decode under libgomp's default OpenMP wait, OMP_WAIT_POLICY=PASSIVE and "
        "treesearch's bounded spin (GOMP_SPINCOUNT), on a quiet machine and beside a busy process; prints "
        "the ratios.",
    )
    p.add_argument(
        "--model",
        default="tiny",
        help="'tiny' (default), SmolLM2-135M-Instruct (the default model), an installed model's name "
        "or a model folder",
    )
    p.add_argument("--tokens", type=int, default=48, help="new tokens per generate call")
    p.add_argument("--rows", type=int, default=4, help="prompts decoded together")
    p.add_argument("--rounds", type=int, default=5, help="timed generate calls per measurement")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads in every process (default: torch's, all cores)",
    )
    p.add_argument(
        "--busy",
        choices=["torch", "spin"],
        default="torch",
        help="the competitor: another torch decode with the default policy (default), or busy loops",
    )
    add_json_flag(p, "the rows")
    p.add_argument("--child", choices=["measure", "compete"], default=None, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for flag in ("tokens", "rows", "rounds", "threads"):
        v = getattr(args, flag)
        if v is not None and v < 1:
            raise UsageError(f"--{flag} {v}: use at least 1")
    if args.child is not None:
        return _child(args)
    rows = []
    for machine in MACHINES:
        for policy in POLICIES:
            rows.append(_measure(args, policy, machine))
            print(json.dumps(rows[-1]), flush=True)
    t = {(r["policy"], r["machine"]): r["s_per_call"] for r in rows}
    ratios = {
        f"{policy}/default {machine}": round(t[policy, machine] / t["default", machine], 3)
        for policy in POLICIES[1:]
        for machine in MACHINES
    }
    ratios.update(
        {f"busy/quiet {policy}": round(t[policy, "busy"] / t[policy, "quiet"], 3) for policy in POLICIES}
    )
    print(json.dumps({"ratios": ratios}), flush=True)
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({"rows": rows, "ratios": ratios}, indent=1) + "\n")
    return 0


def _command(args: argparse.Namespace, child: str) -> list[str]:
    cmd = [sys.executable, "-m", "treesearch.cli.bench_threads", "--child", child, "--model", args.model]
    cmd += ["--tokens", str(args.tokens), "--rows", str(args.rows), "--rounds", str(args.rounds)]
    return cmd + (["--threads", str(args.threads)] if args.threads else [])


def _env(policy: str) -> dict[str, str]:
    """The environment of a process under the policy: libgomp's own default (both variables unset;
    the child imports torch before treesearch can set them), PASSIVE, or the bounded spin."""
    env = {k: v for k, v in os.environ.items() if k not in (WAIT_POLICY, SPIN)}
    if policy == "passive":
        env[WAIT_POLICY] = "PASSIVE"
    elif policy == "bounded":
        env[SPIN] = SPIN_COUNT
    return env


def _measure(args: argparse.Namespace, policy: str, machine: str) -> dict:
    competitors: list[subprocess.Popen] = []
    try:
        if machine == "busy":
            competitors = _start_competitors(args)
        out = subprocess.run(
            _command(args, "measure"), env=_env(policy), capture_output=True, text=True, check=False
        )
        if out.returncode != 0:
            raise UsageError(f"the {policy}/{machine} measurement failed: {out.stderr.strip()[-500:]}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for c in competitors:
            c.kill()
            c.wait()
    return {"policy": policy, "machine": machine, "busy": args.busy if machine == "busy" else None, **row}


def _start_competitors(args: argparse.Namespace) -> list[subprocess.Popen]:
    """The busy process(es), started and running before the measurement begins."""
    if args.busy == "spin":
        loop = "import sys\nprint('ready', flush=True)\nwhile True:\n    pass\n"
        cmds = [[sys.executable, "-c", loop] for _ in range(os.cpu_count() or 1)]
        env = dict(os.environ)
    else:
        cmds, env = [_command(args, "compete")], _env("default")
    procs = [
        subprocess.Popen(c, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for c in cmds
    ]
    for p in procs:
        assert p.stdout is not None
        if p.stdout.readline().strip() != READY:
            raise UsageError(f"the busy process did not start (exit status {p.wait()})")
    return procs


def _child(args: argparse.Namespace) -> int:
    """One process: time the decode (measure), or decode in a loop until killed (compete)."""
    import torch  # first: the policy is the one this process was started with

    from treesearch.common.config import RKSCConfig, Sampling
    from treesearch.engine.local import Engine
    from treesearch.models.load import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    lm = load_model(args.model)
    eng = Engine(lm, RKSCConfig(kv_sharing="exact"))
    prompts = [f"Numbers: {r + 1} 5 6 10\nMoves:\n" for r in range(args.rows)]
    sampling = Sampling(max_new_tokens=args.tokens, ignore_eos=True)
    eng.generate(prompts, sampling)  # warm-up; the prompts' K/V is cached from here on
    if args.child == "compete":
        print(READY, flush=True)
        while True:
            eng.generate(prompts, sampling)
    times = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        eng.generate(prompts, sampling)
        times.append(time.perf_counter() - t0)
    row = {
        "s_per_call": round(statistics.median(times), 4),
        "ms_per_token": round(1000 * statistics.median(times) / args.tokens, 2),
        "calls": len(times),
        "rows": args.rows,
        "tokens": args.tokens,
        "model": args.model,
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get(WAIT_POLICY),
        "gomp_spincount": os.environ.get(SPIN),
    }
    print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
