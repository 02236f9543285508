"""The built wheel: setuptools builds it without warnings, it holds every package and every data
file the code reads, its console script points at the CLI, and the Makefile's llama-cpp-python
range is the test extra's."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# folders (and files) whose contents the code reads at run time; all must ship in the wheel
DATA = [
    "treesearch/tasks/data",
    "treesearch/policies/calibrations",
    "treesearch/models/configs",
    "treesearch/models/smollm2-tokenizer",
    "treesearch/models/README.md",
    "treesearch/py.typed",
]
# build output lines that are not about the project's configuration (PYTHONDONTWRITEBYTECODE=1)
HARMLESS = re.compile(r"byte-compiling is disabled")


def _load_toml(path: Path) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    with open(path, "rb") as f:
        return tomllib.load(f)


def _tracked(paths: list[str]) -> set[str]:
    """The files under `paths` (relative to the repository root): git's list, else the disk's."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(
            ["git", "ls-files", "--", *paths], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout
        return {line for line in out.splitlines() if (ROOT / line).is_file()}
    files: set[str] = set()
    for p in paths:
        base = ROOT / p
        found = [base] if base.is_file() else [f for f in base.rglob("*") if f.is_file()]
        files |= {f.relative_to(ROOT).as_posix() for f in found if "__pycache__" not in f.parts}
    return files


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(build output, wheel path): `pip wheel` of the work tree, once for the module."""
    try:
        import setuptools
    except ImportError:
        pytest.skip("setuptools is not installed (the build runs without isolation)")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip(f"setuptools {setuptools.__version__} < 77 (pyproject's build requirement)")
    out_dir = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-v",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out_dir),
            str(ROOT),
        ],
        cwd=out_dir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    wheels = list(out_dir.glob("treesearch-*.whl"))
    assert len(wheels) == 1, (wheels, log[-2000:])
    return log, wheels[0]


@pytest.fixture(scope="module")
def names(built) -> set[str]:
    with zipfile.ZipFile(built[1]) as z:
        return set(z.namelist())


def test_the_build_prints_no_setuptools_warnings(built):
    log, _ = built
    bad = [
        line
        for line in log.splitlines()
        if re.search(r"warn|deprecat|absent from the", line, re.I) and not HARMLESS.search(line)
    ]
    assert not bad, "\n".join(bad)


def test_every_data_file_the_code_reads_is_in_the_wheel(names):
    on_disk = _tracked(DATA)
    assert any(f.startswith("treesearch/tasks/data/mmlu_stem/test/") for f in on_disk)  # nested folders seen
    missing = sorted(on_disk - names)
    assert not missing, missing


def test_every_package_is_in_the_wheel(names):
    packages = {
        init.parent.relative_to(ROOT).as_posix()
        for top in ("treesearch", "strategies")
        for init in (ROOT / top).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert "treesearch/search" in packages and "strategies" in packages
    missing = sorted(p for p in packages if f"{p}/__init__.py" not in names)
    assert not missing, missing


def test_the_wheel_holds_no_file_missing_from_the_source_tree(names):
    """A stale build/lib (a module since moved or deleted) would otherwise ship in the wheel."""
    stale = sorted(n for n in names if ".dist-info/" not in n and not (ROOT / n).is_file())
    assert not stale, stale


def test_the_console_script_is_the_cli(built):
    with zipfile.ZipFile(built[1]) as z:
        entry = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(entry).decode()
    assert re.search(r"^treesearch\s*=\s*treesearch\.cli\.main:main\s*$", text, re.M), text


def test_the_makefile_builds_the_llama_cpp_range_of_the_test_extra():
    make = (ROOT / "Makefile").read_text()
    m = re.search(r"^LLAMA_CPP\s*\?=\s*(.+?)\s*$", make, re.M)
    assert m, "no LLAMA_CPP ?= ... line in the Makefile"
    make_range = re.sub(r"\s+", "", m.group(1))
    test_extra = _load_toml(ROOT / "pyproject.toml")["project"]["optional-dependencies"]["test"]
    reqs = [r for r in test_extra if re.match(r"llama[-_.]cpp[-_.]python\b", r, re.I)]
    assert len(reqs) == 1, test_extra
    extra_range = re.sub(
        r"\s+", "", re.sub(r"^llama[-_.]cpp[-_.]python\s*(\[[^\]]*\])?", "", reqs[0], flags=re.I)
    )
    assert make_range == extra_range, (
        f"Makefile LLAMA_CPP {make_range!r} != pyproject test extra {reqs[0]!r}; keep them equal"
    )


def test_the_editable_install_of_the_setup_prints_no_warning_box(tmp_path):
    """`make setup` runs `pip install -e .`: setuptools' editable build warns nothing (a flat layout
    without `package-dir` got its meta-path finder and a "Please be careful with folders" box)."""
    pytest.importorskip("setuptools")
    code = "import sys; from setuptools import build_meta as b; print(b.build_editable(sys.argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    bad = [line for line in proc.stderr.splitlines() if re.search(r"warn|careful|!!", line, re.I)]
    assert not bad, "\n".join(bad)
    with zipfile.ZipFile(tmp_path / proc.stdout.split()[-1]) as z:
        pth = [n for n in z.namelist() if n.endswith(".pth")]
        assert len(pth) == 1 and pth[0].startswith("__editable__.treesearch-"), pth
        assert z.read(pth[0]).decode().split() == [str(ROOT)]  # the project root on sys.path
