"""The demo never deletes what the user owns: it writes to its own, marked directory, empties only a
directory that carries its marker (a regular file it wrote), and refuses any other non-empty one."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, child_env

from scripts import demo


def snapshot(top: Path) -> dict[str, tuple]:
    """Everything under `top`, links not followed: relative path -> (kind, mode, content or target)."""
    found: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            path = Path(dirpath, name)
            st = path.lstat()
            rel = str(path.relative_to(top))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir", st.st_mode)
            else:
                found[rel] = ("file", st.st_mode, path.read_bytes())
    return found


@pytest.fixture
def foreign(tmp_path) -> Path:
    """A directory of the user's: files, a subdirectory, a link, an empty directory."""
    top = tmp_path / "mine"
    (top / "sub" / "empty").mkdir(parents=True)
    (top / "notes.txt").write_text("precious\n")
    (top / "sub" / "data.bin").write_bytes(os.urandom(64))
    (top / "link").symlink_to(top / "notes.txt")
    return top


@pytest.mark.parametrize("keep", [False, True])
def test_foreign_non_empty_dir_is_refused_and_left_as_it_was(foreign, keep):
    before = snapshot(foreign)
    with pytest.raises(demo.DemoDirError, match="not a demo cache"):
        demo.prepare_demo_dir(foreign, keep)
    assert snapshot(foreign) == before


def test_a_real_cache_without_the_marker_is_refused(tmp_path):
    cache = tmp_path / "cache"
    (cache / "entries").mkdir(parents=True)
    (cache / "entries" / "ab").mkdir()
    (cache / "entries" / "ab" / ("ab" * 16)).write_bytes(b"the user's entry")
    before = snapshot(cache)
    with pytest.raises(demo.DemoDirError):
        demo.prepare_demo_dir(cache)
    assert snapshot(cache) == before


def test_a_file_is_refused(tmp_path):
    target = tmp_path / "file"
    target.write_text("keep me")
    with pytest.raises(demo.DemoDirError, match="not a directory"):
        demo.prepare_demo_dir(target)
    assert target.read_text() == "keep me"


def test_new_and_empty_dirs_are_created_and_marked(tmp_path):
    new = demo.prepare_demo_dir(tmp_path / "a" / "b")
    empty = tmp_path / "empty"
    empty.mkdir()
    demo.prepare_demo_dir(empty)
    for path in (new, empty):
        assert os.listdir(path) == [demo.MARKER] and demo.is_demo_dir(path)


def test_marked_dir_is_emptied_and_stays_marked(tmp_path, foreign):
    cache = demo.prepare_demo_dir(tmp_path / "demo")
    outside = snapshot(foreign)
    (cache / "entries" / "ab").mkdir(parents=True)
    (cache / "entries" / "ab" / "x").write_bytes(b"entry")
    (cache / "stats.json").write_text("{}")
    (cache / "link-to-dir").symlink_to(foreign)  # links are removed themselves, never followed
    (cache / "entries" / "link-to-file").symlink_to(foreign / "notes.txt")

    demo.prepare_demo_dir(cache, keep=True)
    assert (cache / "stats.json").exists() and (cache / "entries" / "ab" / "x").exists()

    demo.prepare_demo_dir(cache)
    assert os.listdir(cache) == [demo.MARKER] and demo.is_demo_dir(cache)
    assert snapshot(foreign) == outside
    demo.prepare_demo_dir(cache)  # again: still a demo dir
    assert os.listdir(cache) == [demo.MARKER]


def test_symlink_at_the_marker_path_does_not_make_a_demo_dir(tmp_path, foreign):
    real_demo = demo.prepare_demo_dir(tmp_path / "demo")
    (foreign / demo.MARKER).symlink_to(real_demo / demo.MARKER)  # points at a genuine marker
    assert not demo.is_demo_dir(foreign)
    before = snapshot(foreign)
    with pytest.raises(demo.DemoDirError):
        demo.prepare_demo_dir(foreign)
    assert snapshot(foreign) == before


@pytest.mark.parametrize("kind", ["directory", "other text", "dangling link"])
def test_anything_else_at_the_marker_path_is_no_marker(foreign, kind):
    marker = foreign / demo.MARKER
    if kind == "directory":
        marker.mkdir()
    elif kind == "other text":
        marker.write_text("the user's own file of that name\n")
    else:
        marker.symlink_to(foreign / "nowhere")
    before = snapshot(foreign)
    with pytest.raises(demo.DemoDirError):
        demo.prepare_demo_dir(foreign)
    assert snapshot(foreign) == before


def test_kernel_cache_dir_does_not_choose_where_the_demo_writes(foreign, monkeypatch):
    monkeypatch.setenv("KERNEL_CACHE_DIR", str(foreign))
    monkeypatch.setenv("KERNEL_CACHE_SHARED_DIR", str(foreign))
    args = demo.parse_args([])
    assert Path(args.dir) == demo.DEFAULT_DIR == ROOT / ".kernel-cache" / "demo"
    env = demo.phase_env(Path("/tmp/demo-dir"), "sm_90", dict(os.environ))
    assert env["KERNEL_CACHE_DIR"] == "/tmp/demo-dir" and "KERNEL_CACHE_SHARED_DIR" not in env


@pytest.mark.slow
def test_demo_twice_with_kernel_cache_dir_at_a_foreign_dir_loses_nothing(tmp_path, foreign):
    """End to end (about 5 s a run): the demo, twice, with the user's caches set to their own
    directories; then --dir at the user's directory is refused with one line and exit 2."""
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "theirs").write_text("shared data")
    before, shared_before = snapshot(foreign), snapshot(shared)
    demo_dir = tmp_path / "demo"
    env = child_env(KERNEL_CACHE_DIR=str(foreign), KERNEL_CACHE_SHARED_DIR=str(shared))
    script = str(ROOT / "scripts" / "demo.py")
    for _ in range(2):
        proc = subprocess.run([sys.executable, script, "--dir", str(demo_dir)], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out = proc.stdout
        assert "KERNEL_CACHE_DIR and KERNEL_CACHE_SHARED_DIR not used" in out
        # emptied at the start: cold compiles every kernel (a compile worker's build may also be read from
        # memory), warm is served by the records on disk
        assert re.search(r"^total .* compiled 14\b.* disk 9 records$", out, re.M), out
        assert f"--dir {demo_dir.relative_to(tmp_path)} list" in out.strip().splitlines()[-1]
        assert snapshot(foreign) == before and snapshot(shared) == shared_before
        assert demo.is_demo_dir(demo_dir) and (demo_dir / "entries").is_dir()

    refused = subprocess.run([sys.executable, script, "--dir", str(foreign)], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "not a demo cache" in refused.stderr
    assert snapshot(foreign) == before
