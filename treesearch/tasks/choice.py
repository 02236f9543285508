"""Reading a multiple-choice letter out of model text (the text is data: only regular expressions).

Preference order: an explicit "answer is (X)" / "Answer: X"; else the last standalone letter among
the allowed ones written as "(X)" or "X." / "X)" ; else None. A bare capital letter inside a word
or sentence ("A ball falls") is not taken for an answer.
"""

from __future__ import annotations

import re

_EXPLICIT = re.compile(r"answer\s*(?:is|:)?\s*:?\s*\(?([A-E])\b\)?", re.IGNORECASE)
_MARKED = re.compile(r"\(([A-E])\)|(?:^|\s)([A-E])[.)](?=\s|$)")


def extract_choice(text: str, letters: str = "ABCD") -> str | None:
    """The answer letter in text, restricted to `letters` (e.g. "ABC" for a 3-choice question)."""
    if not isinstance(text, str):
        return None
    text = text[:10_000]
    for m in _EXPLICIT.finditer(text):
        letter = m.group(1).upper()
        if letter in letters and (m.group(1).isupper() or m.group(0).rstrip().endswith(")")):
            return letter
    found = [a or b for a, b in _MARKED.findall(text)]
    found = [x for x in found if x in letters]
    return found[-1] if found else None
