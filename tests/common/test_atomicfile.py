"""`write_text_atomic`: the new text appears whole under the final name or not at all; a failure
mid-write keeps the old file and leaves no temporary; the file gets the usual permissions."""

from __future__ import annotations

import os

import pytest

from treesearch.common.atomicfile import write_text_atomic


def test_writes_utf8_and_replaces_the_old_file_leaving_only_it(tmp_path):
    path = tmp_path / "a.json"
    assert write_text_atomic(path, "first") == path
    assert write_text_atomic(str(path), "zweite Fassung: é ✓") == path  # a str path is returned as a Path
    assert path.read_bytes() == "zweite Fassung: é ✓".encode()
    assert os.listdir(tmp_path) == ["a.json"]


def test_a_failure_while_writing_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "a.json"
    write_text_atomic(path, "old")
    with pytest.raises(UnicodeEncodeError):
        write_text_atomic(path, "half \ud800 written")  # a lone surrogate cannot be encoded
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["a.json"]


def test_ctrl_c_before_the_rename_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    write_text_atomic(path, "old")

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_text_atomic(path, "new")
    assert path.read_text() == "old"
    assert os.listdir(tmp_path) == ["a.json"]


def test_the_file_gets_the_usual_permissions_not_mkstemps_0600(tmp_path):
    before = os.umask(0o027)
    try:
        path = write_text_atomic(tmp_path / "a.txt", "x")
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == 0o640
    assert os.umask(before) == before  # the umask is left as it was


def test_a_bare_file_name_is_written_in_the_current_folder_and_a_missing_folder_is_an_error(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    write_text_atomic("here.txt", "x")
    assert (tmp_path / "here.txt").read_text() == "x"
    with pytest.raises(FileNotFoundError):
        write_text_atomic(tmp_path / "missing" / "a.txt", "x")
    assert os.listdir(tmp_path) == ["here.txt"]
