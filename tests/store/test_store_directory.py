"""The embedded store's directory must be the master's own: a real master refuses, in one line
naming the directory, its mode, its owner and the fix, a directory others or its group can
write (whoever can write a directory can rename, replace or delete the files in it), and one
another user owns; it makes its default directory private."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.master_process import MasterProcess

from chunkmaster.master.readiness import MasterNotReady, wait_ready

NOBODY = pwd.getpwnam("nobody").pw_uid


def refused(store: Path) -> str:
    """The one line a master started on `store` exits with (it must not serve)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKMASTER_")}
    ready = store.parent.parent / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "chunkmaster", "master", "--store", str(store), "--port", "0",
         "--ready-file", str(ready)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        wait_ready(ready, proc, 60, log=lambda: "")
        served = True
    except MasterNotReady:
        served = False
    finally:
        proc.kill()
        _, stderr = proc.communicate(timeout=30)
    assert not served, f"the master served on {store}:\n{stderr}"
    assert proc.returncode == 1, stderr
    last = stderr.splitlines()[-1]
    assert last.startswith("chunkmaster: error: store directory "), stderr
    assert not store.exists()  # refused before the store's file is made
    return last


@pytest.mark.parametrize(
    ("mode", "who"),
    [
        pytest.param(mode, who, id=f"{mode:04o}")
        for mode, who in [
            (0o777, "others"),
            (0o775, "its group"),
            (0o1777, "others"),
            (0o1770, "its group"),
        ]
    ],
)
def test_a_store_directory_others_or_its_group_can_write_is_refused(
    tmp_path: Path, mode: int, who: str
) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    d.chmod(mode)
    line = refused(d / "state.db")
    assert f"store directory {d} (mode {mode:04o}, owner " in line
    assert f"can be written by {who}" in line
    assert line.endswith(f": chmod 700 {d}, or choose another --store")
    if mode & 0o1000:  # sticky: nothing can be renamed, but the store's files can be made first
        assert "could make the store's files (-wal, -shm, .witness)" in line
    else:
        assert "could rename, replace or delete the store's files" in line


def test_a_store_directory_another_user_owns_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: to give a directory to another user")
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, -1)
    line = refused(d / "state.db")
    assert (
        f"store directory {d} (mode 0700, owner nobody (uid {NOBODY})) belongs to another user"
        in line
    )
    assert "choose another --store" in line


def test_a_private_store_directory_serves_and_the_default_one_is_made_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    master = MasterProcess(["--job", "private"]).start()
    try:
        d = tmp_path / "state" / "chunkmaster"
        assert (d / "private.db").exists()
        assert d.stat().st_mode & 0o777 == 0o700
    finally:
        master.kill()


def test_a_volume_root_lets_the_masters_own_group_write_is_accepted(tmp_path: Path) -> None:
    """Kubernetes' fsGroup makes a volume's root root:GROUP, mode 2775; with runAsGroup GROUP
    the group is the pod's own. The same directory with another group, or a user's own one
    the group can write (they can chmod it), is refused."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to give a directory to another group")
    from chunkmaster.store.directory import unsafe_directory

    d = tmp_path / "volume"
    d.mkdir()
    os.chown(d, 0, 10001)
    d.chmod(0o2775)
    assert unsafe_directory(d, d.stat(), uid=10001, gid=10001) is None
    assert "can be written by its group (gid 10001)" in str(
        unsafe_directory(d, d.stat(), uid=10001, gid=20002)
    )
    os.chown(d, 10001, 10001)
    assert "can be written by its group" in str(unsafe_directory(d, d.stat(), 10001, 10001))
    d.chmod(0o2755)
    assert unsafe_directory(d, d.stat(), uid=10001, gid=10001) is None
