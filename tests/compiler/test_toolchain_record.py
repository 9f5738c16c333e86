"""The toolchain fingerprint on a fresh node: Triton's build key from the hashes its installer
recorded (the distribution's RECORD), never weaker than hashing the bytes: another byte is another
fingerprint, a file the RECORD cannot vouch for is hashed, and the real Triton's key is the very text
`triton_key()` returns, without reading libtriton."""

from __future__ import annotations

import base64
import builtins
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from compiler import make_spec, toolchain
from compiler import triton_compat as tc
from compiler.examples import add_kernel

FILES = {"__init__.py": b"VERSION = '1.0'\n", "compiler/compiler.py": b"def compile(): pass\n" * 20,
         "_C/libfake.so": bytes(range(256)) * 64}


def _record_row(rel: str, data: bytes) -> str:
    b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{rel},sha256={b64},{len(data)}"


def install(site: Path, files: dict[str, bytes] = FILES, *, record: dict[str, bytes] | None = None,
            dist: str = "fakepkg-1.0", mtime: int = 1_700_000_000) -> Path:
    """A distribution as an installer leaves it: site/fakepkg/... and site/<dist>.dist-info with
    METADATA and a RECORD of `record`'s hashes (the files' own by default), written last."""
    pkg = site / "fakepkg"
    for rel, data in files.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_bytes(data)
        os.utime(pkg / rel, ns=(mtime * 10**9, mtime * 10**9))
    info = site / f"{dist}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.split('-')[0]}\nVersion: 1.0\n")
    rows = [_record_row(f"fakepkg/{rel}", data) for rel, data in (record or files).items()]
    (info / "RECORD").write_text("\n".join([*rows, f"{info.name}/RECORD,,"]) + "\n")
    os.utime(info / "RECORD", ns=((mtime + 10) * 10**9, (mtime + 10) * 10**9))
    return pkg


def fingerprint(pkg: Path) -> tuple[str, list[str]]:
    """The fake package's build key as the toolchain composes Triton's: every file's sha256, through
    InstalledHashes; with the files it had to hash."""
    hashes = toolchain.InstalledHashes(str(pkg))
    key = "-".join(hashes.sha256(str(pkg / rel)) for rel in FILES)
    return key, [os.path.relpath(p, pkg) for p in hashes.hashed]


def bytes_key(pkg: Path) -> str:
    return "-".join(hashlib.sha256((pkg / rel).read_bytes()).hexdigest() for rel in FILES)


def flipped(data: bytes, at: int = 1000) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1:]


def test_a_copy_with_one_byte_changed_in_its_library_gets_another_fingerprint(tmp_path):
    a = install(tmp_path / "a")
    b = install(tmp_path / "b", {**FILES, "_C/libfake.so": flipped(FILES["_C/libfake.so"])})
    (key_a, hashed_a), (key_b, hashed_b) = fingerprint(a), fingerprint(b)
    assert hashed_a == hashed_b == []  # both served by their RECORD: no byte read
    assert key_a != key_b
    assert key_a == bytes_key(a) and key_b == bytes_key(b)  # the very text hashing the bytes gives


def test_a_file_edited_in_place_after_install_is_hashed(tmp_path):
    """The RECORD is stale for a file written after it (a newer mtime), even at the recorded size."""
    pkg = install(tmp_path / "site")
    lib = pkg / "_C" / "libfake.so"
    lib.write_bytes(flipped(FILES["_C/libfake.so"]))  # same size, mtime now: after the RECORD
    key, hashed = fingerprint(pkg)
    assert hashed == ["_C/libfake.so"] and key == bytes_key(pkg) != fingerprint(install(tmp_path / "clean"))[0]


def test_a_record_whose_size_disagrees_with_the_file_falls_back_to_hashing(tmp_path):
    lib = FILES["_C/libfake.so"]
    pkg = install(tmp_path / "site", {**FILES, "_C/libfake.so": lib + b"\0"}, record=FILES)
    key, hashed = fingerprint(pkg)
    assert hashed == ["_C/libfake.so"] and key == bytes_key(pkg)


@pytest.mark.parametrize("how", ["no RECORD", "not listed", "another algorithm", "two RECORDs disagree",
                                 "a link in its place"])
def test_a_file_the_record_cannot_vouch_for_falls_back_to_hashing(tmp_path, how):
    lib = "_C/libfake.so"
    pkg = install(tmp_path / "site")
    record = tmp_path / "site" / "fakepkg-1.0.dist-info" / "RECORD"
    if how == "no RECORD":  # an editable or source install
        record.unlink()
    elif how == "not listed":
        record.write_text("".join(line + "\n" for line in record.read_text().splitlines() if lib not in line))
    elif how == "another algorithm":
        record.write_text(record.read_text().replace(f"{lib},sha256=", f"{lib},sha512="))
    elif how == "two RECORDs disagree":  # another distribution overwrote the file, or claims to have
        install(tmp_path / "site", record={**FILES, lib: flipped(FILES[lib])}, dist="otherpkg-2.0")
    else:  # the same size, an old mtime (the link's own is new, but lstat is not what an edit shows)
        other = tmp_path / "elsewhere.so"
        other.write_bytes(flipped(FILES[lib]))
        os.utime(other, ns=(10**18, 10**18))
        (pkg / lib).unlink()
        (pkg / lib).symlink_to(other)
        os.utime(pkg / lib, ns=(10**18, 10**18), follow_symlinks=False)
    key, hashed = fingerprint(pkg)
    assert key == bytes_key(pkg)
    assert lib in hashed and (how == "no RECORD") == (len(hashed) == len(FILES))


def test_two_records_that_agree_are_trusted(tmp_path):
    pkg = install(tmp_path / "site")
    install(tmp_path / "site", dist="otherpkg-2.0")
    assert fingerprint(pkg) == (bytes_key(pkg), [])


def test_the_shim_knows_the_installed_tritons_key():
    """Every stack's Triton gets the RECORD path: a Triton whose triton_key reads otherwise would
    silently hash libtriton again on every fresh node (correct, and slow): read its triton_key,
    teach `_triton_key_from` any difference, then add its digest."""
    assert tc.triton_key_source_digest() in tc.KNOWN_TRITON_KEYS


@pytest.fixture
def libtriton_reads(monkeypatch) -> list[str]:
    """Every open() of libtriton in this process (Triton's triton_key and our hashing both open it)."""
    reads: list[str] = []
    real_open = builtins.open
    lib = os.path.realpath(tc.LIBTRITON)

    def spying(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == lib:
            reads.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spying)
    return reads


def test_a_fresh_node_takes_the_real_tritons_key_from_its_record_without_reading_libtriton(tmp_path,
                                                                                          libtriton_reads):
    spec = make_spec(add_kernel, ["*fp32", "*fp32", 64, "*fp32"], {"BLOCK": 64}, target=90)
    toolchain.clear_process_memo()
    try:
        fresh = toolchain.installed_tools(spec.target, tmp_path / "fresh-node")  # no memo there
        assert libtriton_reads == []
        hashes = toolchain.InstalledHashes(tc.TRITON_DIR)
        assert hashes.recorded(tc.LIBTRITON) is not None  # the RECORD vouched for it
        toolchain.clear_process_memo()
        again = toolchain.installed_tools(spec.target, tmp_path / "another-node")
    finally:
        toolchain.clear_process_memo()
    assert fresh == again and libtriton_reads == []  # stable
    assert fresh["triton_build"] == tc.triton_build_key()  # Triton's own text: the same keys as today
    with open(tc.LIBTRITON, "rb") as f:
        assert hashes.recorded(tc.LIBTRITON) == hashlib.file_digest(f, "sha256").hexdigest()
    assert libtriton_reads  # (that read it: the spy sees a read)
