"""Built-in tasks. Each keeps its prompt templates in one place, readable and replaceable."""

from treesearch.tasks.countdown import Countdown, CountdownState
from treesearch.tasks.game24 import Game24, Game24State, check_answer, load_puzzles
from treesearch.tasks.gsm8k import GSM8K, GSM8KState, extract_number

TASKS = {"game24": Game24, "gsm8k": GSM8K, "countdown": Countdown}

__all__ = [
    "Countdown",
    "CountdownState",
    "GSM8K",
    "GSM8KState",
    "Game24",
    "Game24State",
    "TASKS",
    "check_answer",
    "extract_number",
    "load_puzzles",
]
