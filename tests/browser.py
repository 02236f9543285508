"""Headless Chromium for the browser tests (Debian's `chromium`, installed by .ci/run): finding the
binary, why a test skips without it, and running it on a local page for a screenshot or the DOM
after load. Shared by tests/viz/test_browser.py and tests/docs/test_doc_site.py."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser")) if p), None)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]


def why_no_chromium(tried: str | None) -> str:
    """The skip message: what the install attempt of .ci/run gave, or that nothing tried."""
    if tried:
        return f"Chromium is not installed; .ci/run tried to install it: {tried}"
    return (
        "Chromium is not installed, and nothing tried to install it (plain `make test` installs no system "
        "package; .ci/run does, or: apt-get install -y chromium)"
    )


def chromium(
    page: Path, *, screenshot: Path | None = None, size: str = "1200,800", extra: tuple[str, ...] = ()
) -> str:
    """Run headless Chromium on a local page; returns stdout (the DOM with --dump-dom)."""
    assert CHROMIUM is not None, "no Chromium binary (the caller skips first)"
    with tempfile.TemporaryDirectory() as profile:
        args = [CHROMIUM, *FLAGS, *extra, f"--user-data-dir={profile}", f"--window-size={size}"]
        args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        proc = subprocess.run([*args, page.resolve().as_uri()], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, f"chromium exited {proc.returncode}: {proc.stderr[-2000:]}"
    return proc.stdout
