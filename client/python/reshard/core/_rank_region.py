"""A rank buffer mapped into the worker for zero-copy publish (Worker.buffers).

A RankRegion is one shared writable mapping (MAP_SHARED, from the writable
descriptor of WorkerFdRequest ACCESS_PUBLISH) of an unsealed rank buffer,
made with libc's mmap so that no descriptor stays open behind it (Python's
mmap.mmap keeps a dup of its descriptor, which would count as "open for
writing" and deny the agent its read lease). The arrays Worker.buffers hands
out view it and have it as their base: it is unmapped when the last goes.

Sealing (RankRegion.make_private) maps the same file MAP_PRIVATE|MAP_FIXED
read/write over the same address from a READ-ONLY descriptor (ACCESS_PUBLISHED_READ):
the arrays keep their addresses and values, no process has the file open
for writing any more, so the agent seals it in place under its read lease,
and what the worker writes afterwards goes to private copy-on-write pages
that never reach the sealed file.

Thread contract: a region is sealed once; publish/seal of one rank must not
race (as for Worker).
"""

import ctypes
import mmap
import os
import threading
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)
_PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE

# Every live region of this process, to recognise handed-out arrays by address.
_LIVE = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()

WRITABLE, PRIVATE, SEALED = "writable", "private", "sealed"


def _mmap(addr, size, flags, fd, what):
    got = _libc.mmap(addr, size, _PROT_RW, flags, fd, 0)
    if got is None or got == _MAP_FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap of {what}: {os.strerror(err)}")
    return got


class RankRegion:
    """The shared writable mapping of one unsealed rank buffer (see the module doc).

    Attributes: job_id, rank, generation, addr (None for an empty buffer),
    size, state (WRITABLE until make_private; PRIVATE after it; SEALED once
    SealShard returned), seal_error (why the SealShard after make_private
    failed, if it did).
    """

    def __init__(self, job_id, rank, generation, fd, size):
        """Maps `size` bytes of the writable descriptor `fd` shared (with
        MAP_POPULATE) and closes `fd`."""
        self.job_id, self.rank, self.generation, self.size = job_id, rank, generation, size
        self.state = WRITABLE
        self.seal_error = None
        self.addr = None
        try:
            if size:
                self.addr = _mmap(None, size, mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                  fd, self.describe())
        finally:
            os.close(fd)
        self._finalizer = weakref.finalize(self, _unmap, self.addr, size)
        with _LIVE_LOCK:
            _LIVE.add(self)

    def describe(self):
        return f"job \"{self.job_id}\" generation {self.generation} rank {self.rank}"

    @property
    def __array_interface__(self):
        # The whole buffer as bytes; arrays made from it keep it as their base.
        return {"version": 3, "shape": (self.size,), "typestr": "|u1",
                "data": (self.addr or 0, False)}

    def contains(self, addr):
        return self.addr is not None and self.addr <= addr < self.addr + self.size

    def make_private(self, read_only_fd):
        """Maps `read_only_fd` (the same file) MAP_PRIVATE|MAP_FIXED over the
        shared mapping and closes it: the one writable view of the file this
        process had is gone, the arrays keep their addresses and values.
        Each page is copied at its first write from here (copy-on-write).
        A failed MAP_FIXED (ENOMEM) raises OSError; the kernel may have
        unmapped the range by then, so the arrays must not be used after it."""
        try:
            if self.addr is not None:
                _mmap(self.addr, self.size, mmap.MAP_PRIVATE | _MAP_FIXED, read_only_fd,
                      self.describe())
        finally:
            os.close(read_only_fd)
        self.state = PRIVATE


def _unmap(addr, size):
    if addr is not None:
        _libc.munmap(addr, size)


def live():
    """Every live region of this process."""
    with _LIVE_LOCK:
        return list(_LIVE)


def find(addr, regions=None):
    """The region (of `regions`, default every live one) whose mapping holds
    `addr`, or None."""
    for r in live() if regions is None else regions:
        if r.contains(addr):
            return r
    return None
