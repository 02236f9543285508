"""The generated pages equal what their sources give: the command reference (the parsers), the API
reference (`treesearch.__all__`) and each benchmark page (its JSON reports under
docs/benchmarks/data/). `python -m treesearch.cli.docs` writes them; this is its --check."""

from __future__ import annotations

import re
import subprocess
import sys

from doc_blocks import ROOT

from treesearch.bench.pages import PAGES
from treesearch.cli import docs


def test_every_generated_page_equals_what_its_sources_give():
    stale = [str(p.relative_to(ROOT)) for p, text in docs.pages().items() if p.read_text() != text]
    assert stale == [], f"{stale}: run python -m treesearch.cli.docs"


def test_the_check_command_agrees_and_exits_0():
    proc = subprocess.run(
        [sys.executable, "-m", "treesearch.cli.docs", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_api_reference_documents_every_public_name_once():
    import treesearch

    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    documented = re.findall(r"^::: [\w.]+\.(\w+)$", text, re.M)
    assert sorted(documented) == sorted(treesearch.__all__)


def test_the_command_reference_has_every_command_and_every_flag_of_solve():
    from treesearch.cli.main import build_parser

    text = (ROOT / "docs" / "reference" / "cli.md").read_text()
    for command in (
        "solve",
        "run",
        "bench",
        "bench claims",
        "bench threads",
        "bench calibrate-asks",
        "calibrate",
    ):
        assert f"## `treesearch {command}`" in text
    solve = build_parser()._subparsers._group_actions[0].choices["solve"]  # type: ignore[union-attr]
    section = text.split("## `treesearch solve`", 1)[1].split("\n## ", 1)[0]
    flags = [o for a in solve._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    assert flags and all(f"`{f}`" in section for f in flags)


def test_each_benchmark_page_shows_its_plots_and_a_caption_per_report():
    bench = ROOT / "docs" / "benchmarks"
    for name in PAGES:
        text = (bench / f"{name}.md").read_text()
        generated = text.split(docs.BEGIN, 1)[1].split(docs.END, 1)[0]
        for png in re.findall(r"\]\(plots/([\w.-]+\.png)\)", generated):
            assert (bench / "plots" / png).is_file(), (
                f"{name}.md shows plots/{png}: run python -m treesearch.cli.docs"
            )
        prefix = {"decode-step": "decode-step"}.get(name, f"{name}-")
        for data in sorted((bench / "data").glob(f"{prefix}*.json")):
            assert f"(`data/{data.name}`)" in generated, f"{name}.md has no caption for data/{data.name}"
