"""Built-in tasks. Each keeps its prompt templates in one place, readable and replaceable."""

from .game24 import Game24, Game24State, check_answer, load_puzzles

TASKS = {"game24": Game24}

__all__ = ["Game24", "Game24State", "TASKS", "check_answer", "load_puzzles"]
