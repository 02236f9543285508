"""The site builds strictly and looks right: `mkdocs build --strict` into a temporary folder, then
the home page and a benchmarks page open in headless Chromium (tests/browser.py, as the tree views'
browser test does): each has its navigation, its heading and every image loaded (a script added to
the built copy records each image's natural width at the load event), and a screenshot that is a
real picture. Screenshots are kept in $TREESEARCH_ARTIFACTS (default test-artifacts/, git-ignored).
The browser checks skip, saying why, only when no Chromium binary is found."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from browser import CHROMIUM, chromium, why_no_chromium
from doc_blocks import ROOT

PAGES = {"index.html": "treesearch", "benchmarks/budget/index.html": "The budget curve"}
SOURCES = {"index.html": "docs/index.md", "benchmarks/budget/index.html": "docs/benchmarks/budget.md"}
PROBE = (
    "<script>addEventListener('load', () => { document.documentElement.dataset.images = "
    "[...document.images].map(i => (i.complete && i.naturalWidth > 0 ? 'y' : 'n')).join(''); });</script>"
)
no_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason=why_no_chromium(os.environ.get("TREESEARCH_CHROMIUM_INSTALL"))
)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"mkdocs build --strict failed (the docs extra: pip install -e '.[docs]'):\n{proc.stderr[-4000:]}"
    )
    return out


def artifacts() -> Path:
    out = Path(os.environ.get("TREESEARCH_ARTIFACTS", ROOT / "test-artifacts"))
    out.mkdir(parents=True, exist_ok=True)
    return out


def test_the_site_builds_strictly_with_every_page_of_the_nav(site):
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text().replace("!!python", "python"))["nav"]

    def files(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [f for e in entry for f in files(e)]
        return [f for v in entry.values() for f in files(v)]

    for md in files(nav):
        page = site / (
            "index.html"
            if md == "index.md"
            else md.removesuffix(".md").removesuffix("/index") + "/index.html"
        )
        assert page.is_file(), f"{md} was not built"
    assert (site / "changelog" / "index.html").read_text().count("Unreleased") >= 1  # CHANGELOG.md included


@no_chromium
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_page_renders_in_chromium_with_navigation_and_images(site, page):
    html = site / page
    text = html.read_text()
    wanted = text.count("<img ")
    assert wanted == (ROOT / SOURCES[page]).read_text().count("!["), (
        f"{page}: an image of the page was not built"
    )
    html.write_text(text.replace("</body>", PROBE + "</body>"))
    dom = chromium(html, size="1440,900", extra=("--virtual-time-budget=10000",))
    assert re.search(rf"<h1[^>]*>{re.escape(PAGES[page])}", dom), f"{page}: no heading {PAGES[page]!r}"
    nav = re.findall(
        r'class="md-nav__link[^"]*"[^>]*href="([^"]+)"|href="([^"]+)"[^>]*class="md-nav__link', dom
    )
    hrefs = {a or b for a, b in nav}
    assert any("guide/your-problem/" in h for h in hrefs), f"{page}: the navigation has no guide pages"
    assert any("benchmarks/" in h or h.startswith("../") for h in hrefs)
    images = re.search(r'<html[^>]*data-images="([yn]*)"', dom)
    assert images is not None, f"{page}: the load event never fired"
    assert images.group(1) == "y" * wanted, f"{page}: images loaded {images.group(1)!r} of {wanted}"
    shot = artifacts() / f"site-{page.replace('/', '-').removesuffix('.html')}.png"
    shot.unlink(missing_ok=True)
    chromium(html, screenshot=shot, size="1440,900")  # wide enough for the navigation sidebar
    from PIL import Image

    with Image.open(shot) as im:
        colours = len(im.convert("RGB").getcolors(maxcolors=1 << 20) or [])
        assert im.size == (1440, 900) and shot.stat().st_size > 10_000 and colours > 50, (im.size, colours)
