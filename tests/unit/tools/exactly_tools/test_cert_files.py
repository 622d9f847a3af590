"""The dev tools' private keys (exactly_tools.certs) never exist with group or other
permission bits, not even for a moment between creating and chmod-ing them: each is
written to a 0600 file that takes its name only when complete (docs/design.md,
"Security")."""
from __future__ import annotations

import os
import stat
import sys

import pytest

from exactly_tools import certs
from exactly_tools.certs import CertificateAuthority


def _key_modes(directory) -> dict[str, int]:
    """Permission bits of every file under `directory` that holds a private key."""
    out = {}
    for root, _dirs, files in os.walk(directory):
        for f in files:
            path = os.path.join(root, f)
            try:
                with open(path, "rb") as fh:
                    is_key = b"PRIVATE KEY" in fh.read()
                mode = stat.S_IMODE(os.stat(path).st_mode)
            except FileNotFoundError:  # renamed meanwhile
                continue
            if is_key:
                out[os.path.relpath(path, directory)] = mode
    return out


@pytest.fixture
def open_umask():
    """umask 000: the modes must not depend on the caller's umask."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_keys_are_never_visible_to_group_or_other(tmp_path, open_umask):
    directory = tmp_path / "certs"
    exposed: list[tuple[str, str]] = []

    def check():
        if directory.exists():
            exposed.extend((name, oct(mode)) for name, mode in _key_modes(directory).items() if mode & 0o077)

    # Look at the directory before every line certs.py runs (so after every file
    # operation it made) and when each of its functions returns.
    def local(frame, event, arg):
        check()
        return local

    def tracer(frame, event, arg):
        return local if frame.f_code.co_filename == certs.__file__ else None

    sys.settrace(tracer)
    try:
        ca = CertificateAuthority.create(directory)
        ca.issue("pl-0", hosts=["127.0.0.1", "localhost"])
        ca.issue("alice", client=True)
        ca.issue("bob", client=True, key_password=b"s3cret")
        ca.issue("alice", client=True)  # issued again: the key is replaced, still private
    finally:
        sys.settrace(None)
    check()
    assert exposed == [], f"keys were readable by group/other while being written: {sorted(set(exposed))}"
    modes = _key_modes(directory)
    assert sorted(modes) == ["alice.key", "bob.key", "ca.key", "pl-0.key"]
    assert set(modes.values()) == {0o600}, {k: oct(v) for k, v in modes.items()}
    assert sorted(p.name for p in directory.iterdir() if p.name.startswith(".")) == []  # no temporary left
