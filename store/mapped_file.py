"""MappedFile: one fixed-size file mapped into memory, named by its 20-digit start offset.

    {directory}/{start_offset:020d}      size fixed per queue (CommitLog segment, ConsumeQueue file)

Space is reserved with ``posix_fallocate`` when the file is created, so a full disk is an
error at creation time (nothing written) rather than a SIGBUS in the middle of a message.
Writes go into the mapping, or, for large runs of bytes (replication), through ``write``
(``os.pwrite`` into the same page cache the mapping shows); ``flush`` is ``os.fdatasync`` on
the file's descriptor, ``flush_range`` an ``msync`` of part of it (through ctypes). All of
them release the GIL (``mmap.flush`` and slice assignment do not).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import mmap
import os

from .errors import DiskFullError, StoreError, invariant

NAME_DIGITS = 20
# ``populate`` asks for read-ahead in steps the kernel takes whole: it cuts each request at
# max(read_ahead_kb, max_sectors_kb) of the device's queue. Every step is a system call that
# drops and retakes the GIL, so the steps are as large as the device allows (128 KiB, the
# kernel's default read-ahead, when the device is unknown), up to a bound.
POPULATE_STEP_BYTES_MIN = 128 * 1024
POPULATE_STEP_BYTES_MAX = 8 * 1024 * 1024
# ``write`` populates first only above this: for a replicated frame of a few records the
# fadvise cost more than the copy (the preallocator keeps the pages ahead of a writer in)
WRITE_POPULATE_BYTES_MIN = 64 * 1024
WRITE_MAPPED_BYTES_MAX = 16 * 1024   # a write this small goes through the mapping (see MappedFile.write)
# madvise(MADV_POPULATE_WRITE), Linux >= 5.14: fault pages in writable as a write would.
# Called through ctypes, which releases the GIL (mmap.madvise holds it).
MADV_POPULATE_WRITE = 23
MS_SYNC = 4   # msync(2): write the range back and wait (Linux's value)


def file_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """Start offset from a file name, None if the name is not 20 digits."""
    if len(name) == NAME_DIGITS and name.isdigit():
        return int(name)
    return None


class MappedFile:
    """A fixed-size mapped file. Positions are relative to the file; offsets are global."""

    __slots__ = ("path", "start_offset", "size", "fd", "mm", "_closed", "_populate_step_bytes", "_address",
                 "_fault_around")

    def __init__(self, path: str, start_offset: int, size: int, *, create: bool, fault_around: bool = True) -> None:
        """``fault_around=False``: a page fault brings in its own page only (``MADV_RANDOM``).

        For a file written from empty, a page at a time, through the mapping (a
        ConsumeQueue's): the kernel otherwise answers the first fault on the file with a
        read-around of up to the device's read-ahead (8 MiB here, the whole 6 MB file), a
        zeroed page cache page for each: 1.4-2 ms for that one fault on this machine kind
        (a new queue's first message, on the node's loop or a slave's follow thread), and
        3-4 µs a page without it."""
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self._closed = False
        self._fault_around = fault_around
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                reserve(self.fd, size, path)
            actual = os.fstat(self.fd).st_size
            if actual != size:
                raise StoreError(f"{path}: size {actual} bytes, expected {size}; "
                                 "the file was truncated or belongs to a store with other settings")
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            if not fault_around:
                self.mm.madvise(mmap.MADV_RANDOM)
            self._populate_step_bytes = _read_ahead_bytes(os.fstat(self.fd).st_dev)
            exported = ctypes.c_char.from_buffer(self.mm)
            self._address = ctypes.addressof(exported)
            del exported   # an exported buffer would keep mm.close() from unmapping
        except BaseException:
            os.close(self.fd)
            if create:
                _unlink_quietly(path)
            raise

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def write(self, position: int, data, *, populate: bool = True) -> None:
        """Copy ``data`` (bytes-like) into the file at ``position``: ``populate`` (unless told
        not to), then ``os.pwrite``.

        For megabytes at a time (replication) this beats assigning through the mapping: the
        GIL is released while the kernel copies, so the event loop keeps receiving, and the
        pages are brought in by read-ahead and then filled, where a write through the
        mapping takes a fault per 4 KiB page and a pwrite into pages not yet cached
        allocates them one by one (measured here: ~1.5 GB/s against ~0.4 GB/s into a fresh
        segment). The mapping shares the page cache, so readers of ``mm`` see the bytes as
        soon as this returns.

        A write of at most ``WRITE_MAPPED_BYTES_MAX`` (a slave's frame of one-at-a-time puts)
        is assigned through the mapping instead, as the master's own appends are: no system
        call, its page faulted in at most once a few writes (a slave's append 3.4 -> 2.3 us).
        """
        view = memoryview(data).cast("B")
        if position < 0 or position + len(view) > self.size:   # the message only when it is needed
            invariant(False, f"{self.path}: write of {len(view)} bytes at {position} is outside the file")
        if len(view) <= WRITE_MAPPED_BYTES_MAX:
            self.mm[position:position + len(view)] = view
            return
        if populate and len(view) > WRITE_POPULATE_BYTES_MIN:  # a small write's fadvise cost more
            self.populate(position, position + len(view))
        while view:
            written = os.pwrite(self.fd, view, position)
            view = view[written:]
            position += written

    def populate(self, start: int = 0, end: int | None = None) -> None:
        """Bring the pages of [start, end) (default: the whole file) into the page cache.

        Read-ahead only (POSIX_FADV_WILLNEED, in steps the kernel takes whole): over the
        reserved, never-written extents of a fresh file it fills pages with zeros without
        disk I/O, and they stay clean. A write-populate would dirty every page, and the
        flusher would then write a whole segment of zeros back while the writer stalls on
        pages under writeback. Pages already cached cost a look-up.
        """
        end = self.size if end is None else end
        if self._closed or not hasattr(os, "posix_fadvise"):
            return
        step = self._populate_step_bytes
        for step_start in range(start, end, step):
            os.posix_fadvise(self.fd, step_start, min(step, end - step_start), os.POSIX_FADV_WILLNEED)

    @property
    def read_ahead_bytes(self) -> int:
        """How much the kernel reads around a fault on this file, at most (``populate``'s step)."""
        return self._populate_step_bytes

    def populate_for_write(self, start: int, end: int, *, page_by_page: bool = False) -> bool:
        """Fault the pages of [start, end) in writable, as the writer's copy into the mapping
        would page by page (about 5 us a 4 KiB page here, a third of a 1 KiB put's budget):
        done ahead of the writer on another thread, which ``madvise`` lets run without the
        GIL. The bytes are not touched. False where the kernel lacks MADV_POPULATE_WRITE.

        The pages become dirty: a whole-file ``flush`` would write this window's zeros back
        and leave its pages write-protected again (clean), so a writer flushes what it wrote
        with ``flush_range``.

        ``page_by_page``: ``MADV_RANDOM`` first, which stays, over the range and a read-ahead's
        length past it, where a writer that outruns the window faults (_Preallocator asks
        this for a window smaller than ``read_ahead_bytes``). Otherwise the first fault on
        a page not yet cached answers with a read-around of up to the read-ahead (8 MiB
        here), every page of it zeroed in that one fault, which the kernel does not preempt:
        16-20 ms of CPU where fresh memory costs a host fault a page (this VM). A slave's
        512 KiB window did that at the same moment on both slaves of a group and held both
        vCPUs while a one-at-a-time send waited 20 ms (docs/sync-performance.md, stop 35).
        Page by page a window costs more in all (about 3x in a probe) but brings in only
        what was asked for, and the kernel can switch tasks between its pages. Larger
        windows (a master's puts) keep the read-around, cheaper a page."""
        if self._closed or _madvise is None:
            return _madvise is not None
        start -= start % mmap.PAGESIZE
        end = min(end, self.size)
        if start >= end:
            return True
        if page_by_page:
            _madvise(self._address + start, min(self.size, end + self._populate_step_bytes) - start, mmap.MADV_RANDOM)
        if _madvise(self._address + start, end - start, MADV_POPULATE_WRITE) != 0:
            code = ctypes.get_errno()
            # EINVAL: an older kernel; anything else (ENOMEM: unmapped under us) only ends this window
            return code != errno.EINVAL
        return True

    def release(self, start: int, end: int) -> None:
        """Let the page cache go of the whole pages inside [start, end), which must be on
        disk already (flushed): this process's mapping stops pointing at them
        (``MADV_DONTNEED``; a later read faults them back in from the disk) and the kernel
        drops them (``POSIX_FADV_DONTNEED``). A page that is dirty again, or that another
        process maps, stays. A read that faults them back in gets the kernel's read-around
        again (``MADV_NORMAL``: a small write window leaves ``MADV_RANDOM`` behind it, see
        ``populate_for_write``), unless the file was mapped without fault-around. The calls
        release the GIL."""
        start += -start % mmap.PAGESIZE
        end -= end % mmap.PAGESIZE
        if self._closed or start >= end:
            return
        if _madvise is not None:
            _madvise(self._address + start, end - start, mmap.MADV_DONTNEED)
            if self._fault_around:
                _madvise(self._address + start, end - start, mmap.MADV_NORMAL)
        try:
            os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_DONTNEED)
        except OSError:   # closed under us (retention, a cut): nothing of this file to keep
            pass

    def flush(self) -> None:
        """Make everything written so far durable."""
        if not self._closed:
            os.fdatasync(self.fd)

    def flush_range(self, start: int, end: int) -> None:
        """Make the bytes of [start, end) durable, and only those: ``msync(MS_SYNC)`` over
        that part of the mapping, which Linux runs as an fdatasync of that range of the file
        (``vfs_fsync_range``), however the bytes were written (mapping or ``pwrite``).

        Why not ``flush``: an fdatasync writes back every dirty page of the file, and a page
        written back is write-protected again, so the writer's next copy into it faults.
        Ahead of a writer the preallocator faults pages in writable (``populate_for_write``);
        each flush (every 500 ms by default) undid that for the whole window, and every new
        page of the log faulted all the same (a put of 1 KiB: 0.28-0.33 minor faults on the
        master and on each slave, 0.04-0.11 with this), its zeros written to the disk first."""
        if self._closed:
            return
        start -= start % mmap.PAGESIZE
        end = min(end, self.size)
        if start >= end:
            return
        if _msync is None:
            os.fdatasync(self.fd)
            return
        if _msync(self._address + start, end - start, MS_SYNC) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), self.path)

    def zero(self, start: int, end: int | None = None) -> None:
        """Overwrite [start, end) with zeros, in bounded chunks. Holes and reserved-but-
        unwritten extents are skipped (SEEK_DATA), and chunks already zero are only read,
        so cutting a mostly empty 1 GiB segment neither reads nor dirties every page."""
        end = self.size if end is None else end
        chunk = 1 << 20
        zeros = bytes(chunk)
        for region_start, region_end in self._data_regions(start, end):
            position = region_start
            while position < region_end:
                step = min(chunk, region_end - position)
                if self.mm[position:position + step] != zeros[:step]:
                    self.mm[position:position + step] = zeros[:step]
                position += step

    def _data_regions(self, start: int, end: int):
        """[start, end) split into the regions that may hold data."""
        position = start
        while position < end:
            try:
                data_at = os.lseek(self.fd, position, os.SEEK_DATA)
                hole_at = os.lseek(self.fd, data_at, os.SEEK_HOLE)
            except OSError as error:
                if error.errno == errno.ENXIO:  # no data past position
                    return
                yield position, end  # no SEEK_DATA here: treat everything as data
                return
            if data_at >= end:
                return
            yield data_at, min(hole_at, end)
            position = hole_at

    def close(self) -> None:
        """Release the descriptor. The mapping itself goes when the last reader drops it."""
        if not self._closed:
            self._closed = True
            os.close(self.fd)

    def destroy(self) -> None:
        """Close and unlink. Readers still holding the mapping keep valid bytes."""
        self.close()
        _unlink_quietly(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, start={self.start_offset}, size={self.size})"


@functools.lru_cache(maxsize=64)
def _read_ahead_bytes(device: int) -> int:
    """The largest read-ahead request the kernel takes whole for files on ``device``, within
    [POPULATE_STEP_BYTES_MIN, POPULATE_STEP_BYTES_MAX]: max(read_ahead_kb, max_sectors_kb)
    of the block queue of the device, or of the disk when the device is a partition."""
    base = f"/sys/dev/block/{os.major(device)}:{os.minor(device)}"
    for queue in (f"{base}/queue", f"{base}/../queue"):
        try:
            kib = max(_read_int(f"{queue}/read_ahead_kb"), _read_int(f"{queue}/max_sectors_kb"))
        except (OSError, ValueError):
            continue
        return min(POPULATE_STEP_BYTES_MAX, max(POPULATE_STEP_BYTES_MIN, kib * 1024))
    return POPULATE_STEP_BYTES_MIN  # not a block device (tmpfs, overlay, ...): the kernel's default


def _read_int(path: str) -> int:
    with open(path, encoding="ascii") as handle:
        return int(handle.read())


def reserve(fd: int, size: int, path: str) -> None:
    """Reserve the first ``size`` bytes of the file on disk (``posix_fallocate``), growing it
    to ``size``; DiskFullError when the disk has no room. Nothing mapped may touch a page
    that is not reserved: a write there on a full disk is a SIGBUS, not an error."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as error:
        if error.errno in (errno.EOPNOTSUPP, errno.EINVAL):
            os.ftruncate(fd, size)  # file systems without fallocate: sparse file
            return
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no room on disk for {path} ({size} bytes): free space or "
                                "lower retention (file_reserved_hours, disk_max_used_ratio)") from error
        raise


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _load_libc(name: str):
    """libc's ``madvise`` or ``msync`` (address, length, flags), or None where there is none."""
    try:
        function = getattr(ctypes.CDLL(None, use_errno=True), name)
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    function.restype = ctypes.c_int
    return function


_madvise = _load_libc("madvise")
_msync = _load_libc("msync")
