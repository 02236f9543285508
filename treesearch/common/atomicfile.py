"""Atomic file writes: the new content appears whole under the final name or not at all.

The text goes to a uniquely named temporary file in the same folder, is flushed and fsync'ed,
and then renamed over the target (`os.replace` is atomic on POSIX and Windows). A crash or
Ctrl-C mid-write leaves the previous file intact and at worst a stray temporary, which is removed
when the failure is seen.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, BinaryIO


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write text (UTF-8) to path atomically; returns the path."""
    with _open_atomic(path, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(path)


def open_atomic_binary(path: str | Path) -> AbstractContextManager[BinaryIO]:
    """A binary file to write in steps (a large file streamed in parts) that appears under path
    only when the block ends without an error; an error or Ctrl-C leaves no file and no temporary."""
    return _open_atomic(path, "wb")


@contextmanager
def _open_atomic(path: str | Path, mode: str, **kw: Any) -> Iterator[Any]:
    """The file object of a temporary beside path, renamed over path when the block ends cleanly."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the file the usual permissions
        with os.fdopen(fd, mode, **kw) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
