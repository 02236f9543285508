"""The flags several commands share, each defined once here (the server flags: `treesearch.cli.backend`):
the model, threads, seed, progress and JSON output flags, the task argument, and the search flags of
`treesearch solve` and `treesearch run`. A command composes the groups it needs."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from treesearch.cli.checks import strategy_names
from treesearch.models.install import KNOWN
from treesearch.tasks.names import aliases_of, task_name

MODEL_HELP = (
    "HF model folder, a Hub id such as Qwen/Qwen2.5-0.5B-Instruct (downloaded once into the Hugging Face "
    f"cache), a model that `treesearch models install` installs ({', '.join(KNOWN)}), or 'tiny' for a "
    "random test model (default: embedded SmolLM2-135M-Instruct)"
)


class OfflineAction(argparse.Action):
    """--offline: sets HF_HUB_OFFLINE=1 for the process as the flag is read, before anything loads."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)  # type: ignore[arg-type]

    def __call__(
        self, parser: object, namespace: argparse.Namespace, values: object, option_string=None
    ) -> None:
        from treesearch.models.hub import set_offline

        setattr(namespace, self.dest, True)
        set_offline()


def add_model_flag(p: argparse.ArgumentParser, model_help: str = MODEL_HELP) -> None:
    """--model: the model a command loads (a folder, a Hub id, 'tiny'; none: the default model), and
    --offline: Hub ids from the local cache only."""
    p.add_argument("--model", default=None, help=model_help)
    p.add_argument(
        "--offline",
        action=OfflineAction,
        help="download nothing: a Hub id must be in the local Hugging Face cache already (the same as "
        "HF_HUB_OFFLINE=1)",
    )


QUANTIZATION_CHOICES = (
    "float32",
    "int8",
    "int8a8",
)  # `treesearch.models.quantize.QUANTIZATIONS` (not imported: no torch)


def add_model_flags(
    p: argparse.ArgumentParser, model_help: str = MODEL_HELP, *, quantization: bool = True
) -> None:
    """--model, --device, --dtype and --quantization: which model runs where, at which precision."""
    add_model_flag(p, model_help)
    p.add_argument("--device", default=None, help="torch device, e.g. cuda (default: cpu)")
    p.add_argument("--dtype", default=None, help="float32 (default), bfloat16 or float16")
    if quantization:
        add_quantization_flag(p)


def add_quantization_flag(p: argparse.ArgumentParser) -> None:
    """--quantization: the weights' precision (int8: Llama and Qwen2 on the CPU; docs/guide/precision.md)."""
    p.add_argument(
        "--quantization",
        default="float32",
        choices=QUANTIZATION_CHOICES,
        help="weight precision: float32 (default) or int8 (a quarter of the weight bytes; Llama and "
        "Qwen2 models on the CPU; converted once and cached); int8a8: int8 with the layers' inputs "
        "rounded to int8 too (a prototype)",
    )


def add_threads_flag(p: argparse.ArgumentParser) -> None:
    """--threads N: torch's CPU threads while the command runs."""
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        metavar="N",
        help="torch CPU threads for the run (default: torch's own; 1 is faster on a busy machine)",
    )


def add_seed_flag(p: argparse.ArgumentParser) -> None:
    """--seed: the seed of every random choice the command makes."""
    p.add_argument("--seed", type=int, default=0, help="random seed of the search and its sampling")


def add_progress_flag(p: argparse.ArgumentParser) -> None:
    """--no-progress: no progress bar on stderr."""
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_json_flag(p: argparse.ArgumentParser, what: str) -> None:
    """--json PATH: write the command's result as JSON."""
    p.add_argument(
        "--json", dest="json_path", default=None, metavar="PATH", help=f"write {what} as JSON (default: none)"
    )


def task_choice(names: list[str] | tuple[str, ...]) -> str:
    """The help text's list of task names, with their short aliases."""
    aliases = aliases_of(names)
    return ", ".join(names) + (f" ({aliases})" if aliases else "")


def add_task_argument(p: argparse.ArgumentParser, names: list[str]) -> None:
    """The positional TASK of solve and run: a long or short task name (the command checks it). The
    help names the tasks with a search Problem, and the shipped sets without one."""
    from treesearch.tasks.names import TASK_NAMES

    others = [n for n in TASK_NAMES if n not in names]
    more = f" ({' and '.join(others)}: no search Problem, for bench and calibrate only)" if others else ""
    p.add_argument(
        "task",
        type=task_name,
        help=f"task name: {task_choice(names)}{more}; or your own treesearch.Problem subclass as "
        "MODULE:CLASS (e.g. my_module:MyProblem, imported from the current directory)",
    )


def add_task_flag(p: argparse.ArgumentParser, names: tuple[str, ...], default: str | None, help: str) -> None:
    """--task NAME, one of `names` (long names; the short aliases are taken too)."""
    aliases = aliases_of(names)
    p.add_argument(
        "--task",
        type=task_name,
        default=default,
        choices=names,
        help=help + (f"; {aliases}" if aliases else ""),
    )


def add_search_flags(p: argparse.ArgumentParser) -> None:
    """The flags of a search (model, KV sharing, strategy, sampling), shared by solve and run."""
    from strategies import DFS, MCTS, SelfConsistency

    add_model_flags(p)
    add_threads_flag(p)
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
        "--step-tokens",
        type=int,
        default=None,
        metavar="N",
        help="local engine: the most uncached prompt tokens one scheduler step prefills; a longer prompt "
        "is prefilled in parts beside the running rows' decode (default 2048)",
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
    p.add_argument(
        "--strategy",
        default="bfs",
        help=f"one of {', '.join(strategy_names())} (default bfs; cot: one chain-of-thought generation, "
        "no search; sc: self-consistency, the majority answer of --samples sampled chains of thought)",
    )
    p.add_argument("--breadth", type=int, default=None, help="BFS/beam: states kept per step (default 5)")
    p.add_argument("--depth", type=int, default=None, help="depth limit (default: the task's)")
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"MCTS iterations (default: MCTS's own, {MCTS.iterations})",
    )
    p.add_argument(
        "--exploration",
        type=float,
        default=None,
        help=f"MCTS exploration constant (default: MCTS's own, {MCTS.exploration:g})",
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="DFS: prune below this value (default: none, prune nothing)",
    )
    p.add_argument(
        "--max-states",
        type=int,
        default=None,
        help=f"DFS: state budget (default: DFS's own, {DFS.max_states})",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=None,
        metavar="K",
        help=f"sc: chains of thought sampled (default: SelfConsistency's own, {SelfConsistency.samples})",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="0 = greedy (default: the task's own; game24 is greedy, gsm8k samples at 0.7)",
    )
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling (default: the task's own)")
    add_seed_flag(p)
    add_progress_flag(p)


def range_type(example: str) -> Callable[[str], tuple[int, int]]:
    """An argparse type for a START:END row range (START < END); `example` goes into its error."""

    def parse(text: str) -> tuple[int, int]:
        a, _, b = text.partition(":")
        if not a.isdigit() or not b.isdigit() or int(b) <= int(a):
            raise argparse.ArgumentTypeError(
                f"range {text!r}; use START:END with START < END, e.g. {example}"
            )
        return int(a), int(b)

    return parse
