"""MappedFile: one fixed-size file mapped into memory, named by its 20-digit start offset.

    {directory}/{start_offset:020d}      size fixed per queue (CommitLog segment, ConsumeQueue file)

Space is reserved with ``posix_fallocate`` when the file is created, so a full disk is an
error at creation time (nothing written) rather than a SIGBUS in the middle of a message.
Writes go into the mapping; ``flush`` is ``os.fdatasync`` on the file's descriptor, which
releases the GIL (``mmap.flush`` does not).
"""

from __future__ import annotations

import errno
import mmap
import os

from .errors import DiskFullError, StoreError

NAME_DIGITS = 20


def file_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


def parse_file_name(name: str) -> int | None:
    """Start offset from a file name, None if the name is not 20 digits."""
    if len(name) == NAME_DIGITS and name.isdigit():
        return int(name)
    return None


class MappedFile:
    """A fixed-size mapped file. Positions are relative to the file; offsets are global."""

    __slots__ = ("path", "start_offset", "size", "fd", "mm", "_closed")

    def __init__(self, path: str, start_offset: int, size: int, *, create: bool) -> None:
        self.path = path
        self.start_offset = start_offset
        self.size = size
        self._closed = False
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        self.fd = os.open(path, flags, 0o644)
        try:
            if create:
                _reserve(self.fd, size, path)
            actual = os.fstat(self.fd).st_size
            if actual != size:
                raise StoreError(f"{path}: size {actual} bytes, expected {size}; "
                                 "the file was truncated or belongs to a store with other settings")
            self.mm = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            if create:
                _unlink_quietly(path)
            raise

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def populate(self) -> None:
        """Bring the file's pages in ahead of the writer, so appends fault less.

        Read-ahead only (MADV_WILLNEED): a write-populate would dirty every page of the
        segment at once, and the flusher would then write a whole segment of zeros back
        while the writer stalls on pages under writeback.
        """
        self.mm.madvise(mmap.MADV_WILLNEED)

    def flush(self) -> None:
        """Make everything written so far durable."""
        if not self._closed:
            os.fdatasync(self.fd)

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


def _reserve(fd: int, size: int, path: str) -> None:
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
