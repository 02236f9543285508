"""The task names every command takes: the long ones, with the short ones as aliases
(`treesearch calibrate --task arc` is `--task arc_challenge`)."""

from __future__ import annotations

TASK_NAMES = ("game24", "gsm8k", "arc_challenge", "mmlu_stem")
ALIASES = {"arc": "arc_challenge", "mmlu": "mmlu_stem"}
# the keys of a model's CGEE calibration file (treesearch/policies/calibrations/<model>.json), kept short
CALIBRATION_KEYS = {"game24": "game24", "gsm8k": "gsm8k", "arc_challenge": "arc", "mmlu_stem": "mmlu"}


def task_name(name: str) -> str:
    """The long name of a task given by its long or short name; any other name is returned as given
    (the command then says which names it takes)."""
    return ALIASES.get(name, name)


def aliases_of(names: list[str] | tuple[str, ...]) -> str:
    """The short names of `names`, for a flag's help: "aliases: arc, mmlu" (empty when none)."""
    short = [a for a, long in ALIASES.items() if long in names]
    return f"aliases: {', '.join(short)}" if short else ""
