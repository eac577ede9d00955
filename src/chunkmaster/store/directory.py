"""The store's directory and file lock: a directory only the master may write, and one master
per store file, however its path is spelled (the lock is an exclusive flock on its inode)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import stat
import threading
from pathlib import Path

from chunkmaster.store.base import StoreInUseError

# Stores this process holds, by (st_dev, st_ino): a second attempt from the same process must
# not open (and then close) a descriptor of a held file, which would drop SQLite's own locks.
_held: set[tuple[int, int]] = set()
_held_lock = threading.Lock()


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def unsafe_directory(
    directory: Path, st: os.stat_result, uid: int | None = None, gid: int | None = None
) -> str | None:
    """Why `directory` (whose stat is `st`) may not hold a store for the user `uid` with the
    group `gid` (default: this process's effective ones), or None if it may.

    Refused: a directory another user owns (root aside), and one others or its group can
    write, sticky bit or not: a sticky bit keeps others from renaming the store's files but
    not from making its `-wal`, `-shm` or `.witness` file before the master does. Accepted
    as group-writable: a directory root owns whose group is the master's own, for a master
    not running as root, which is what Kubernetes makes of a volume with fsGroup (and
    runAsGroup) 10001: there the group is the pod's. (A directory of the master's own user
    it can make private itself.)"""
    uid = os.geteuid() if uid is None else uid
    gid = os.getegid() if gid is None else gid
    mode = stat.S_IMODE(st.st_mode)
    what = f"store directory {directory} (mode {mode:04o}, owner {_user(st.st_uid)})"
    if st.st_uid not in (uid, 0):
        return (
            f"{what} belongs to another user, who could rename, replace or delete the "
            f"store's files: choose another --store, in a directory {_user(uid)} owns"
        )
    platform_group = uid != 0 and st.st_uid == 0 and st.st_gid == gid  # a volume for a group
    if mode & 0o002 or (mode & 0o020 and not platform_group):
        who = "others" if mode & 0o002 else f"its group (gid {st.st_gid})"
        could = "rename, replace or delete the store's files"
        if mode & stat.S_ISVTX:  # they cannot rename what is not theirs, but can make it first
            could = "make the store's files (-wal, -shm, .witness) before the master does"
        return (
            f"{what} can be written by {who}, who could {could}: chmod 700 {directory}, "
            "or choose another --store"
        )
    return None


def folder_problem(path: Path) -> str | None:
    """Why a store file at `path` could not be made or written beside (SQLite adds its journal
    files next to it), in words naming the folder at fault; None if nothing is known to be
    wrong. The OS's own word for a folder that is a file is "File exists"."""
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent  # the store makes the missing folders: its nearest one counts
    if not folder.is_dir():
        return f"{folder} is a file, not a directory"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"the directory {folder} is not writable by this user"
    return None


def _flock_holder(st: os.stat_result) -> str:
    """The pid holding a flock on this inode, from /proc/locks (Linux); "unknown" elsewhere."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"; queued waiters carry "->"
        if len(parts) < 6 or parts[1] != "FLOCK" or "->" in parts:
            continue
        try:
            major, minor, ino = parts[5].split(":")
            if (int(major, 16), int(minor, 16), int(ino)) == (
                os.major(st.st_dev),
                os.minor(st.st_dev),
                st.st_ino,
            ):
                return parts[4]
        except ValueError:
            continue
    return "unknown"


class FileLock:
    """An exclusive flock on the inode of the file at `path` (made if missing), held until
    `release`; StoreInUseError if another process or this one holds it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None

    def take(self) -> None:
        while True:
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(self.path)
                with _held_lock:
                    if (st.st_dev, st.st_ino) in _held:
                        raise self._in_use("this process")
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _flock_holder(os.fstat(fd))
                os.close(fd)
                raise self._in_use(f"pid {holder}") from None
            # Between open and flock the name may have been moved aside by a master that held
            # the lock: then this descriptor is not the store any more; start over.
            mine = os.fstat(fd)
            try:
                now = os.stat(self.path)
            except FileNotFoundError:
                now = None
            if now is not None and (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino):
                with _held_lock:
                    _held.add((mine.st_dev, mine.st_ino))
                self._fd, self._key = fd, (mine.st_dev, mine.st_ino)
                return
            os.close(fd)

    def _in_use(self, holder: str) -> StoreInUseError:
        return StoreInUseError(
            f"store {self.path} is in use by another master ({holder}); two masters must "
            "never share one journal (the lock is on the file itself, whatever path names it)"
        )

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._key is not None:
            with _held_lock:
                _held.discard(self._key)
            self._key = None
