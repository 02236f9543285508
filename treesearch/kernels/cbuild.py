"""Compiling a kernel's C source once and loading it: the project's compiled kernels
(`treesearch.models.int8_kernel`, `treesearch.models.w8a8_kernel`, `treesearch.kernels.runs_kernel`)
are built at first use by the system compiler and cached by source, flags and compiler."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from treesearch.common.cachedir import cache_dir


def compiler(cc: str | None = None) -> str:
    """cc, else $CC, cc or gcc; OSError naming the fix where there is none."""
    cc = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cc:
        raise OSError("no C compiler found (set CC, or install gcc)")
    return cc


def compile_library(source: str, stem: str, flags: list[str], cc: str) -> ctypes.CDLL:
    """source compiled with flags (and -lm) into the cache folder as `<stem>-<hash>.so`, atomically,
    once per source, flags and compiler; then loaded. OSError with the compiler's message on failure."""
    key = hashlib.sha256((source + " ".join(flags) + cc).encode()).hexdigest()[:16]
    folder = cache_dir() / "kernels"
    lib = folder / f"{stem}-{key}.so"
    if not lib.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src, out = Path(tmp) / f"{stem}.c", Path(tmp) / f"{stem}.so"
            src.write_text(source)
            done = subprocess.run(
                [cc, *flags, "-o", str(out), str(src), "-lm"], capture_output=True, text=True, timeout=120
            )
            if done.returncode != 0:
                raise OSError(f"{cc} failed: {done.stderr.strip()[-300:]}")
            os.replace(out, lib)
    return ctypes.CDLL(str(lib))


def build_openmp(source: str, stem: str, flags: list[str], cc: str | None = None) -> tuple[ctypes.CDLL, bool]:
    """`compile_library` with OpenMP where the compiler has it (-fopenmp links libgomp, which torch's
    CPU builds load already), else for one thread: (library, built with OpenMP)."""
    cc = compiler(cc)
    try:
        return compile_library(source, stem, [*flags, "-fopenmp"], cc), True
    except OSError:
        return compile_library(source, stem, flags, cc), False
