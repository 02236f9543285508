"""The front door stays short and current: README.md is at most 150 lines, and no date or commit
hash appears in README.md, the guide or the concepts pages (history lives in CHANGELOG.md and the
commit messages; benchmark captions carry dates and commits, and are exempt)."""

from __future__ import annotations

import re

from doc_blocks import ROOT

DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
# a commit-like token: 7-40 hex digits with at least one letter and one digit (not a plain number)
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b")
CURRENT = [
    "README.md",
    *sorted(
        str(p.relative_to(ROOT)) for d in ("guide", "concepts") for p in (ROOT / "docs" / d).rglob("*.md")
    ),
]


def test_the_readme_is_at_most_150_lines():
    n = len((ROOT / "README.md").read_text().splitlines())
    assert n <= 150, f"README.md has {n} lines; move detail into docs/ and link it"


def test_no_date_or_commit_hash_in_the_readme_the_guide_or_the_concepts():
    found = []
    for name in CURRENT:
        for i, line in enumerate((ROOT / name).read_text().splitlines(), 1):
            found += [f"{name}:{i}: {m.group()}" for m in (*DATE.finditer(line), *HASH.finditer(line))]
    assert found == [], (
        "dates and commits belong in CHANGELOG.md, commit messages and benchmark captions:\n"
        + ("\n".join(found))
    )


def test_the_checks_catch_a_date_and_a_hash_and_pass_plain_numbers():
    assert DATE.search("measured on 2026-12-05") and HASH.search("at commit 3ecad75,")
    assert not HASH.search("491400064 bytes") and not HASH.search("deadbeef")  # a number, a word
