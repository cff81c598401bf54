"""`biprm.data.writer.atomic_write`, the one way biprm replaces a file: whole or not at all."""

import os

import pytest

from biprm.data.writer import atomic_write


def test_a_write_replaces_the_file_whole_in_a_new_folder_too(tmp_path):
    path = atomic_write(tmp_path / "a" / "b.json", lambda f: f.write(b'{"done": 1}'))
    assert path.read_bytes() == b'{"done": 1}'
    atomic_write(path, lambda f: f.write(b'{"done": 2}'))
    assert path.read_bytes() == b'{"done": 2}' and os.listdir(path.parent) == ["b.json"]


def test_a_write_that_fails_midway_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "scores.npz"
    path.write_bytes(b"old")

    def dies(f):
        f.write(b"half of the new")
        raise KeyboardInterrupt  # a kill in the middle of the write

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, dies)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["scores.npz"]


def test_the_file_is_readable_as_the_umask_allows(tmp_path):
    """Caches are shared: a temporary file made owner-only (as mkstemp makes it) must not pass that on."""
    mask = os.umask(0o022)
    try:
        path = atomic_write(tmp_path / "memo.json", lambda f: f.write(b"{}"))
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644
