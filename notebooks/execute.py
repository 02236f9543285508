"""Run the notebooks top to bottom with a real kernel and save them with their outputs.

    python notebooks/execute.py                    # all three
    python notebooks/execute.py 01_quickstart      # one

Each runs in a scratch folder, so the files a notebook writes (HTML pages, saved trees) stay out
of the repository. Prints the time each notebook took. The kernel is the `python3` kernel of the
Python running this script (ipykernel in the same virtual environment).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
NOTEBOOKS = ("01_quickstart", "02_your_own_problem", "03_inside_rksc")


def execute(path: Path, *, cell_timeout: int = 1800) -> tuple[nbformat.NotebookNode, float]:
    """Execute a notebook in a scratch folder; returns the notebook with outputs and the seconds taken."""
    book = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory() as scratch:
        client = NotebookClient(
            book, timeout=cell_timeout, kernel_name="python3", resources={"metadata": {"path": scratch}}
        )
        t0 = time.perf_counter()
        client.execute()
        return book, time.perf_counter() - t0


def main(argv: list[str]) -> int:
    for name in argv or NOTEBOOKS:
        path = HERE / f"{name.removesuffix('.ipynb')}.ipynb"
        book, seconds = execute(path)
        nbformat.write(book, path)
        print(f"{path.name}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
