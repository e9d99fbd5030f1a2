"""Plans shared by the ranks of one job on one host, through shared memory (``/dev/shm``).

Control plane at scale (issue 33, docs/elastic.md): a plan is due on every rank at the same
step boundary, and each rank reading it there — from the scheduler, or from rank 0's store once
rank 0 has read it — put N round trips, and a wait on rank 0's own read, between the agreement
and the switch. Instead one rank per host, the host's *leader*, long-polls the board, reads each
plan as soon as it is published (while the agreement still carries its version to the ranks,
a step or two) and leaves its bytes here; at the boundary every rank of the host finds it in
memory. Plans are immutable per version, so a copy is never stale; a rank that finds none
(its host's leader slow or gone) reads the store or the board as before.

The leader is whoever holds the directory's lock (``flock``, never blocking): the kernel drops
it when that process ends, and another rank of the host takes over at its next try. Trust: a
plan file is unpickled, so the directory is this user's own, mode 0700, or it is not used.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading

KEEP_VERSIONS = 2  # the newest plans kept; older ones are deleted as new ones come


def default_root() -> str:
    """``/dev/shm`` (memory) where the host has it, else the temporary directory."""
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class HostShare:
    """One job's plans on this host: ``put`` by the leader, ``get`` by every rank."""

    def __init__(self, job_id: str, root: str | None = None) -> None:
        if not job_id:
            raise ValueError(f"job_id={job_id!r}: must be non-empty")
        # Any job id makes one safe file name; the digest keeps two ids that read alike apart.
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_", job_id)[:64]
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
        self.path = os.path.join(root or default_root(), f"malleable-{os.getuid()}-{readable}-{digest}")
        self._lock_fd: int | None = None

    @property
    def leading(self) -> bool:
        return self._lock_fd is not None

    def _trusted(self, create: bool) -> bool:
        """Whether the directory exists (made if ``create``) and only this user can write in it."""
        if create:
            with contextlib.suppress(FileExistsError):
                os.mkdir(self.path, 0o700)
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077

    def usable(self) -> bool:
        """Whether this host can share plans here at all (the directory made, and private)."""
        try:
            return self._trusted(create=True)
        except OSError:
            return False

    def lead(self) -> bool:
        """Become the host's leader if none is; whether this share leads now."""
        if self._lock_fd is not None:
            return True
        try:
            if not self._trusted(create=True):
                return False
            fd = os.open(os.path.join(self.path, "leader"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def resign(self, remove: bool = True) -> None:
        """Stop leading; ``remove``: delete the host's copies too (the rank leaves the job).

        A rank of the job still on the host then reads the store or the board until one of
        them leads again and the directory is made anew."""
        fd, self._lock_fd = self._lock_fd, None
        if fd is None:
            return
        if remove and self._trusted(create=False):
            shutil.rmtree(self.path, ignore_errors=True)
        os.close(fd)

    def put(self, version: int, data: bytes) -> bool:
        """Leave plan ``version``'s bytes for the host's ranks (atomically); False if it could not."""
        try:
            if not self._trusted(create=True):
                return False
            tmp = os.path.join(self.path, f".plan-{version}.{os.getpid()}.{threading.get_ident()}")
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, os.path.join(self.path, f"plan-{version}"))
            for name in os.listdir(self.path):
                if name.startswith("plan-") and name[5:].isdigit() and int(name[5:]) <= version - KEEP_VERSIONS:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self.path, name))
        except OSError:
            return False
        return True

    def get(self, version: int) -> bytes | None:
        """Plan ``version``'s bytes if this host has them (None: read them elsewhere)."""
        if not self._trusted(create=False):
            return None
        try:
            fd = os.open(os.path.join(self.path, f"plan-{version}"), os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read()
