"""One-line notes the views of a tree print with it: why its search stopped early, read from
tree.meta["stop_reason"] (written by the Searcher; see `treesearch.search.stop`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def stop_line(reason: Mapping[str, Any] | None) -> str | None:
    """The line `stopped early (CODE): MESSAGE` for a stop reason {"code", "message"}; None for none."""
    if not isinstance(reason, Mapping) or not reason.get("code"):
        return None
    return f"stopped early ({reason['code']}): {reason.get('message', '')}".rstrip(": ")
