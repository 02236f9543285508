"""The flags of a search (model, threads, KV sharing, CGEE, strategy, sampling), shared by
`treesearch solve` and `treesearch run`."""

from __future__ import annotations

import argparse

from treesearch.cli.checks import strategy_names


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a search (model, KV sharing, strategy, sampling), shared by solve and run."""
    p.add_argument(
        "--model",
        default=None,
        help=(
            "HF model folder or cached id (default: embedded SmolLM2-135M-Instruct; "
            "'tiny' for a random test model)"
        ),
    )
    p.add_argument("--device", default=None, help="torch device (default cpu)")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads for the run (default: torch's own; 1 is faster on a busy machine)",
    )
    p.add_argument(
        "--kv", default="exact", choices=["off", "exact", "asks"], help="KV sharing mode (default exact)"
    )
    p.add_argument(
        "--cache-budget",
        type=int,
        default=None,
        metavar="BYTES",
        help="KV cache budget in bytes (default unbounded)",
    )
    p.add_argument(
        "--eviction",
        default="omega",
        choices=["omega", "lru"],
        help="under a budget: evict and preempt lowest omega first (RSBCM, default) or least recently used",
    )
    p.add_argument("--cgee", default="off", choices=["on", "off"], help="CGEE early exit for verification")
    p.add_argument(
        "--cgee-measure", action="store_true", help="run every verification both ways and count disagreements"
    )
    p.add_argument("--strategy", default="bfs", help=f"one of {', '.join(strategy_names())} (default bfs)")
    p.add_argument("--breadth", type=int, default=5, help="BFS/beam: states kept per step (default 5)")
    p.add_argument("--depth", type=int, default=None, help="depth limit (default: the task's)")
    p.add_argument("--iterations", type=int, default=None, help="MCTS iterations")
    p.add_argument("--exploration", type=float, default=None, help="MCTS exploration constant")
    p.add_argument("--threshold", type=float, default=None, help="DFS: prune below this value")
    p.add_argument("--max-states", type=int, default=None, help="DFS: state budget")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy (default: the task's own; game24 is greedy, gsm8k samples at 0.7)",
    )
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the task's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
