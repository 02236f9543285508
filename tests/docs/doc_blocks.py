"""The code blocks of README.md and docs/**/*.md: what each runs, what output it shows, and the
marker in front of it (`<!-- not-run: REASON -->`, `<!-- slow -->`).

Rules (docs/development/testing.md, "The documentation's tests"):
- ```python, ```bash, ```shell and ```console blocks are examples; other fences are not run.
- A ```text block that follows an example, with only prose between, is that example's output.
- In a console block, `$ COMMAND` lines are commands and the lines after each, its output.
- Shell commands must be `treesearch ...` (run as `python -m treesearch ...`); anything else needs a
  not-run marker.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ("python", "bash", "shell", "console")
MARKER = re.compile(r"^<!--\s*(not-run:\s*(?P<reason>.+?)|(?P<slow>slow))\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
SECONDS = re.compile(r"\b\d+(\.\d+)? s\b")  # wall times: compared as a placeholder


@dataclass
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None = None  # the reason, when marked
    slow: bool = False
    shown: str | None = None  # the output the page shows for it (a following ```text block)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def pages() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one page, with its marker and, for an example, its shown output."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i, marker, last_example = 0, None, None
    while i < len(lines):
        line = lines[i]
        fence = FENCE.match(line)
        if not fence:
            m = MARKER.match(line.strip())
            if m:
                marker = m
            elif line.strip() and not line.startswith("<!--"):
                marker = None  # a marker applies to the block right after it
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        block = Block(str(path.relative_to(ROOT)), i + 1, fence["lang"], "\n".join(lines[i + 1 : end]))
        if marker is not None:
            block.not_run = marker["reason"]
            block.slow = bool(marker["slow"])
        if block.lang == "text" and last_example is not None and last_example.shown is None:
            last_example.shown = block.code
        last_example = block if block.lang in EXAMPLES else None
        out.append(block)
        i, marker = end + 1, None
    return out


def examples() -> list[Block]:
    return [b for p in pages() for b in blocks(p) if b.lang in EXAMPLES]


def shell_commands(block: Block) -> list[list[str]]:
    """The argument lists of a bash/shell block's commands (comments dropped, `\\` lines joined)."""
    text = block.code.replace("\\\n", " ")
    return [
        shlex.split(line, comments=True) for line in text.splitlines() if shlex.split(line, comments=True)
    ]


def console_steps(block: Block) -> list[tuple[list[str], str]]:
    """(command, its shown output) for each `$ ` line of a console block."""
    steps: list[tuple[list[str], list[str]]] = []
    for line in block.code.splitlines():
        if line.startswith("$ "):
            steps.append((shlex.split(line[2:]), []))
        else:
            assert steps, f"{block.where}: a console block starts with a `$ ` command line"
            steps[-1][1].append(line)
    return [(cmd, "\n".join(shown)) for cmd, shown in steps]


def same_output(got: str, shown: str) -> bool:
    """Equal line by line, trailing blanks aside, wall times as a placeholder."""

    def norm(text: str) -> list[str]:
        return [SECONDS.sub("N s", line.rstrip()) for line in text.strip().splitlines()]

    return norm(got) == norm(shown)


def listed_reasons() -> list[str]:
    """The not-run reasons docs/development/testing.md lists (its "Examples not run" section)."""
    text = (ROOT / "docs" / "development" / "testing.md").read_text()
    section = text.split("## Examples not run", 1)[1].split("\n## ", 1)[0]
    return [line[2:].strip() for line in section.splitlines() if line.startswith("- ")]
