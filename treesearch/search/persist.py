"""Saving and loading search results: one JSON file, checksummed, written atomically.

File layout (keys sorted, compact):
    {"format": "treesearch-result/1", "sha256": HEX, "result": {...}}
where "result" holds answer, solved, best, status, error, stats, config and the tree as
node-link data (thoughts, states via the problem's `state_to_json`, scores, statuses, MCTS
visits / value_sum, every other node attribute but the KV handle, and the tree's metadata).
HEX is the SHA-256 of the canonical JSON text of "result", so a file cut short, edited or
damaged anywhere is refused with `SaveFileError` before anything is built: a load gives the
whole saved search or nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from treesearch.common.atomicfile import write_text_atomic
from treesearch.common.errors import SaveFileError

FORMAT = "treesearch-result/1"


def canonical(obj: Any) -> str:
    """The canonical JSON text hashed by the checksum (sorted keys, no spaces)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def save_payload(path: str | Path, payload: dict) -> Path:
    """Write payload (JSON-able; tuples become lists, non-JSON values their repr) with its checksum."""
    plain = json.loads(json.dumps(payload, default=repr, allow_nan=True))  # JSON types only, str keys
    body = canonical(plain)
    digest = hashlib.sha256(body.encode("utf-8")).hexdigest()
    text = '{"format":' + json.dumps(FORMAT) + ',"sha256":"' + digest + '","result":' + body + "}\n"
    return write_text_atomic(path, text)


def load_payload(path: str | Path) -> dict:
    """The "result" object of a file written by `save_payload`, after every check passed."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise SaveFileError(
            f"{path} does not exist; save a result first with SearchResult.save(path)"
        ) from None
    if not raw.strip():
        raise SaveFileError(f"{path} is empty (a save that never finished?); nothing was loaded")
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SaveFileError(
            f"{path} is not valid JSON: truncated or corrupted ({exc}); nothing was loaded"
        ) from exc
    if not isinstance(data, dict) or "format" not in data:
        hint = (
            " (it looks like a bare tree: use ThoughtTree.load)"
            if isinstance(data, dict) and "nodes" in data
            else ""
        )
        raise SaveFileError(f"{path} is not a saved search result{hint}")
    if data["format"] != FORMAT:
        raise SaveFileError(f"{path} has format {data['format']!r:.60}; this version reads {FORMAT!r}")
    result, digest = data.get("result"), data.get("sha256")
    if not isinstance(result, dict) or not isinstance(digest, str):
        raise SaveFileError(f"{path} lacks its result or checksum; nothing was loaded")
    if hashlib.sha256(canonical(result).encode("utf-8")).hexdigest() != digest:
        raise SaveFileError(
            f"{path} failed its checksum: the file was modified or damaged after saving; "
            "nothing was loaded (restore it, or re-run the search)"
        )
    _check_fields(path, result)
    return result


def _check_fields(path: str | Path, r: dict) -> None:
    want: dict[str, type | tuple[type, ...]] = {
        "answer": (str, type(None)),
        "solved": bool,
        "best": (int, type(None)),
        "status": str,
        "error": (str, type(None)),
        "stats": dict,
        "config": dict,
        "tree": dict,
    }
    for key, typ in want.items():
        if not isinstance(r.get(key), typ):
            raise SaveFileError(f"{path}: field {key!r} is {r.get(key)!r:.40}; nothing was loaded")
    for key, v in r["stats"].items():
        if isinstance(v, float) and math.isnan(v):
            raise SaveFileError(f"{path}: stats[{key!r}] is NaN; nothing was loaded")
