"""MappedFileQueue: an ordered run of equal-size MappedFiles that reads as one long log.

    {directory}/00000000000000000000
    {directory}/00000000001073741824   start offset = previous start + file size

Offsets are global (file start + position). The queue finds the file for any offset,
rolls to a new file, truncates everything past an offset (zeroing the cut-off tail so it
can never be read as valid later) and drops whole files from the front for retention.
With ``preallocate`` a background thread creates the next file while the writer still
fills the current one, so a roll does not stall the writer, brings in the first pages of
each file it creates, and, asked by a writer (``populate_ahead``), keeps a bounded window
of pages ahead of it: in the page cache for replication, which writes megabytes at a time
with ``pwrite`` (``MappedFile.populate``), and faulted in writable for puts, which copy
into the mapping (``MappedFile.populate_for_write``). Brought in there, a page costs a
fraction of what the writer pays to fault it in itself, and on another core. The window
is bounded so that a slow writer does not pay for a whole segment up front.
"""

from __future__ import annotations

import logging
import os
import threading

from .errors import StoreError, invariant
from .mapped_file import MappedFile, file_name, parse_file_name, reserve

log = logging.getLogger(__name__)

POPULATE_AHEAD_BYTES = 64 * 1024 * 1024   # pages kept in ahead of a writer that asks for it
# ahead of a writer through the mapping the pages are faulted in writable, which dirties
# them (a flush of what was written leaves them alone: MappedFile.flush_range); smaller, as
# dirty pages the kernel's own writeback may still write out if they wait long
POPULATE_AHEAD_WRITE_BYTES = 16 * 1024 * 1024
POPULATE_SLICE_BYTES = 8 * 1024 * 1024    # population goes in slices: a stop or a newer request is seen between them


class _Preallocator:
    """Creates the next file of a queue ahead of need and populates pages, on one daemon thread.

    The writer and this thread never both create the same file: ``take`` waits while the
    thread is creating the wanted offset, and the thread skips an offset already taken. A
    created file is handed out at once and its first window populated afterwards, so a
    writer that reaches it early writes alongside the population. A window ahead of the
    writer (``populate_ahead``) goes before the next file. A file may be closed (cut,
    reset, retention) while it is populated: that population stops.
    """

    def __init__(self, queue: "MappedFileQueue") -> None:
        self._queue = queue
        self._condition = threading.Condition()
        self._wanted: int | None = None
        self._working: int | None = None
        self._populate: tuple[MappedFile, int, int, bool] | None = None   # file, [start, end) to bring in, for write
        # the last file populated, up to where, and whether for write (a window read ahead
        # for a catching-up replica holds clean pages: a writer through the mapping wants it again)
        self._populated: tuple[MappedFile | None, int, bool] = (None, 0, False)
        self._ready: dict[int, MappedFile] = {}
        self._taken: set[int] = set()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"preallocate:{queue.directory}", daemon=True)
        self._thread.start()

    def request(self, start_offset: int) -> None:
        with self._condition:
            if start_offset not in self._ready and start_offset != self._working:
                self._wanted = start_offset
                self._taken.discard(start_offset)
                self._condition.notify_all()

    def populate_ahead(self, mapped: MappedFile, position: int, for_write: bool, window: int | None = None) -> None:
        """Keep the window past ``position`` of ``mapped`` populated (cheap to call after
        every write: it only asks once half the window has been used up); ``window``: its
        size, when not the default for reads or writes."""
        window = window or (POPULATE_AHEAD_WRITE_BYTES if for_write else POPULATE_AHEAD_BYTES)
        end = min(mapped.size, position + window)
        with self._condition:
            done_file, done_to, done_for_write = self._populated
            done = done_file is mapped and (done_for_write or not for_write)
            if done and done_to >= min(mapped.size, position + window // 2):
                return
            start = max(position, done_to) if done else position
            if start < end:
                self._populate = (mapped, start, end, for_write)
                self._condition.notify_all()

    def take(self, start_offset: int) -> MappedFile | None:
        """The prepared file for ``start_offset``, or None: then the caller creates it."""
        with self._condition:
            while self._working == start_offset:
                self._condition.wait()
            if self._wanted == start_offset:
                self._wanted = None
            self._taken.add(start_offset)
            return self._ready.pop(start_offset, None)

    def _run(self) -> None:
        while True:
            with self._condition:
                while self._wanted is None and self._populate is None and not self._stopped:
                    self._condition.wait()
                if self._stopped:
                    return
                window, self._populate = self._populate, None
                if window is None:
                    wanted, self._wanted = self._wanted, None
                    self._working = wanted
            if window is not None:
                self._populate_range(*window)
            else:
                self._prepare(wanted)

    def _prepare(self, wanted: int) -> None:
        mapped = None
        try:
            mapped = self._queue.create_file(wanted)
        except BaseException as error:  # the writer creates the file itself and sees the error
            log.warning("preallocating %s failed: %s", file_name(wanted), error)
        with self._condition:
            self._working = None
            if mapped is not None:
                if self._stopped or wanted in self._taken:
                    mapped.destroy()
                    mapped = None
                else:
                    self._ready[wanted] = mapped
            self._condition.notify_all()
        if mapped is not None:
            self._populate_range(mapped, 0, min(mapped.size, POPULATE_SLICE_BYTES), False)

    def _populate_range(self, mapped: MappedFile, start: int, end: int, for_write: bool) -> None:
        # a window for write smaller than a fault's read-around goes page by page
        # (MappedFile.populate_for_write): a read-around would bring in more than asked, at once
        page_by_page = end - start < mapped.read_ahead_bytes
        for slice_start in range(start, end, POPULATE_SLICE_BYTES):
            slice_end = min(end, slice_start + POPULATE_SLICE_BYTES)
            with self._condition:
                if self._stopped or mapped.closed or self._populate is not None:
                    return  # a newer window replaces this one
            try:
                if not (for_write and mapped.populate_for_write(slice_start, slice_end, page_by_page=page_by_page)):
                    mapped.populate(slice_start, slice_end)
            except OSError as error:  # closed under us (EBADF): nothing to bring in any more
                log.debug("populating %s stopped: %s", mapped.path, error)
                return
            with self._condition:
                self._populated = (mapped, slice_end, for_write)

    def stop(self) -> None:
        with self._condition:
            self._stopped = True
            self._condition.notify_all()
        self._thread.join(timeout=30)
        with self._condition:
            ready, self._ready = list(self._ready.values()), {}
            self._populated = (None, 0, False)
        for mapped in ready:
            mapped.destroy()


class MappedFileQueue:
    """Equal-size mapped files in a directory, addressed by global offset."""

    def __init__(self, directory: str, file_size: int, *, preallocate: bool = False,
                 fault_around_created: bool = True) -> None:
        """``fault_around_created=False``: the files this queue creates are mapped with
        ``fault_around=False`` (``MappedFile``); files loaded from disk keep the kernel's
        read-around, which a reader catching up from cold pages wants."""
        self.directory = directory
        self.file_size = file_size
        self._fault_around_created = fault_around_created
        self.files: list[MappedFile] = []
        self._preallocator: _Preallocator | None = None
        self._preallocate = preallocate
        self.repairs: list[str] = []   # what ``load`` repaired, for reports and ``store verify``
        # (start offset, bytes it still held) of a truncated last file ``load`` extended with zeros
        self.extended_last: tuple[int, int] | None = None
        self.released_offset = 0   # ``release_before`` let the page cache go of the files below this

    # --- loading ------------------------------------------------------------------------
    def load(self) -> None:
        """Map every file in the directory, checking names, sizes and contiguity."""
        os.makedirs(self.directory, exist_ok=True)
        self.extended_last = None
        starts = []
        for name in os.listdir(self.directory):
            start = parse_file_name(name)
            if start is None:
                if not name.startswith("."):
                    log.warning("ignoring %s: not a 20-digit segment name", os.path.join(self.directory, name))
                continue
            starts.append(start)
        starts.sort()
        for start in starts:
            if start % self.file_size:
                raise StoreError(f"{os.path.join(self.directory, file_name(start))}: start offset is not a "
                                 f"multiple of the file size {self.file_size}; wrong segment size setting?")
        starts = self._drop_unwritten_past_a_short_file(self._drop_unwritten_past_a_gap(starts))
        if starts and not self._repair_last(os.path.join(self.directory, file_name(starts[-1]))):
            starts.pop()
        self.files = [MappedFile(os.path.join(self.directory, file_name(s)), s, self.file_size, create=False)
                      for s in starts]
        if self._preallocate:
            self._preallocator = _Preallocator(self)

    def _drop_unwritten_past_a_gap(self, starts: list[int]) -> list[int]:
        """Files past a gap that hold no data are deleted: a preallocation for a tail a
        replica cut had just removed, left by a crash (the writer fills files in order, so
        nothing past a gap was ever written). A file past a gap with data is an error."""
        for index in range(1, len(starts)):
            if starts[index] != starts[index - 1] + self.file_size:
                break
        else:
            return starts
        kept, beyond = starts[:index], starts[index:]
        self._delete_unwritten(beyond, "a gap", f"{self.directory}: gap between {file_name(kept[-1])} and "
                                                f"{file_name(beyond[0])}", "restore the missing file")
        return kept

    def _drop_unwritten_past_a_short_file(self, starts: list[int]) -> list[int]:
        """Files after a short one (cut off while it was created) that hold no data are
        deleted, so that the short one is the last and ``_repair_last`` takes it: a
        preallocation for a tail a replica cut had removed, which the next file's creation,
        cut off by a crash, made contiguous again (found by the crash-point test). A file
        with data past a short one is an error."""
        for index, start in enumerate(starts[:-1]):
            path = os.path.join(self.directory, file_name(start))
            size = os.path.getsize(path)
            if size < self.file_size:
                self._delete_unwritten(starts[index + 1:], "a short file",
                                       f"{path}: {size} bytes of {self.file_size}", "restore the file")
                return starts[:index + 1]
        return starts

    def _delete_unwritten(self, starts: list[int], past: str, problem: str, remedy: str) -> None:
        """Delete the files of ``starts``, which must hold no data (StoreError naming
        ``problem`` and ``remedy`` otherwise), each recorded as a repair past ``past``."""
        for start in starts:
            path = os.path.join(self.directory, file_name(start))
            if _holds_data(path, os.path.getsize(path)):
                raise StoreError(f"{problem}, and {file_name(start)} past it holds data; {remedy}")
        for start in starts:
            path = os.path.join(self.directory, file_name(start))
            log.warning("%s: past %s in %s and never written (a preallocation); deleted", path, past, self.directory)
            os.unlink(path)
            self.repairs.append(f"deleted unwritten file {path} past {past}")

    def _repair_last(self, path: str) -> bool:
        """What a crash while the last file was created leaves: False (the file is deleted)
        when it is short and holds no data (0 bytes, or a reservation cut off before any
        write), as RocketMQ deletes an empty last file; a short file that holds data is
        extended to its full size with the space reserved, the tail reading as zeros
        (unwritten space: recovery's scan ends there). A file of the right size is kept."""
        actual = os.path.getsize(path)
        if actual == self.file_size:
            return True
        if actual > self.file_size:
            raise StoreError(f"{path}: {actual} bytes, larger than the file size {self.file_size}; "
                             "the store was made with other settings (config/storeLayout.json)")
        if not _holds_data(path, actual):
            log.warning("%s: %d bytes of %d and no data, left by a crash while it was created; deleted",
                        path, actual, self.file_size)
            os.unlink(path)
            self.repairs.append(f"deleted empty last file {path} ({actual} bytes)")
            return False
        log.warning("%s: %d bytes of %d, truncated; extended with zeros (its data stays, the rest "
                    "reads as unwritten)", path, actual, self.file_size)
        fd = os.open(path, os.O_RDWR)
        try:
            reserve(fd, self.file_size, path)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.repairs.append(f"extended truncated last file {path} from {actual} bytes")
        self.extended_last = (parse_file_name(os.path.basename(path)), actual)
        return True

    def create_file(self, start_offset: int) -> MappedFile:
        invariant(start_offset % self.file_size == 0, f"unaligned file start {start_offset}")
        path = os.path.join(self.directory, file_name(start_offset))
        return MappedFile(path, start_offset, self.file_size, create=True, fault_around=self._fault_around_created)

    # --- addressing ---------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.files[0].start_offset if self.files else 0

    @property
    def last(self) -> MappedFile | None:
        return self.files[-1] if self.files else None

    def find(self, offset: int) -> MappedFile | None:
        """The file holding ``offset``, None if it is outside every file."""
        files = self.files  # one read: retention may replace the list concurrently
        if not files:
            return None
        index = (offset - files[0].start_offset) // self.file_size
        if 0 <= index < len(files):
            mapped = files[index]
            if mapped.start_offset <= offset < mapped.end_offset:
                return mapped
        return None

    def roll(self, start_offset: int) -> MappedFile:
        """Append the file starting at ``start_offset`` (taken from the preallocator if ready)."""
        last = self.last
        invariant(last is None or start_offset == last.end_offset, "roll must continue the last file")
        mapped = self._preallocator.take(start_offset) if self._preallocator else None
        if mapped is None:
            mapped = self.create_file(start_offset)
        self.files = self.files + [mapped]
        if self._preallocator:
            self._preallocator.request(start_offset + self.file_size)
        return mapped

    def populate_ahead(self, offset: int, *, for_write: bool = False, window: int | None = None) -> None:
        """Ask the preallocator to keep the pages past ``offset``, the writer's position,
        in the page cache (no-op without ``preallocate``): read ahead for a writer that
        uses ``MappedFile.write`` (replication), faulted in writable (``for_write``) for
        one that copies into the mapping (puts, a replica's small writes); ``window`` bytes
        of them, when not the default."""
        mapped = self.find(offset) if self._preallocator else None
        if mapped is not None:
            self._preallocator.populate_ahead(mapped, offset - mapped.start_offset, for_write, window)

    def request_ahead(self) -> None:
        """Ask the preallocator for the file after the last one."""
        if self._preallocator and self.files:
            self._preallocator.request(self.files[-1].end_offset)

    # --- cutting ------------------------------------------------------------------------
    def truncate(self, offset: int) -> None:
        """Drop everything at and past ``offset``: crash-safe in this order:

        1. zero the first bytes at ``offset`` and sync, so a scan stops there;
        2. delete later files, newest first;
        3. zero the rest of the file holding ``offset`` and sync.
        A crash between steps leaves a log whose scan still ends at ``offset``.
        """
        self.released_offset = min(self.released_offset, offset)
        holder = self.find(offset)
        if holder is not None:
            position = offset - holder.start_offset
            holder.zero(position, min(holder.size, position + 8))
            holder.flush()
        for mapped in reversed([m for m in self.files if m.start_offset > offset
                                or (m.start_offset == offset and holder is not m)]):
            mapped.destroy()
        self.files = [m for m in self.files if m.start_offset < offset or m is holder]
        if holder is not None:
            holder.zero(offset - holder.start_offset)
            holder.flush()
        if self._preallocator:
            # a file prepared for the old tail's next offset is the wrong one now
            stale = self._preallocator.take(self.files[-1].end_offset if self.files else 0)
            if stale is not None:
                stale.destroy()

    def delete_front(self, count: int) -> list[MappedFile]:
        """Drop the first ``count`` files (never the last one). Returns what was removed."""
        count = min(count, len(self.files) - 1)
        if count <= 0:
            return []
        removed, self.files = self.files[:count], self.files[count:]
        for mapped in removed:
            mapped.destroy()
        return removed

    def reset_to(self, start_offset: int) -> MappedFile:
        """Delete every file and start again with an empty file at ``start_offset``."""
        for mapped in reversed(self.files):
            mapped.destroy()
        self.files = []
        self.released_offset = start_offset
        mapped = self.create_file(start_offset)
        self.files = [mapped]
        return mapped

    def flush_range(self, start: int, end: int) -> None:
        """Make the bytes of [start, end) durable, and only those (``MappedFile.flush_range``:
        the pages ahead of the writer stay dirty and writable)."""
        for mapped in self.files:
            if mapped.end_offset > start and mapped.start_offset < end:
                mapped.flush_range(max(start, mapped.start_offset) - mapped.start_offset,
                                   min(end, mapped.end_offset) - mapped.start_offset)

    def release_before(self, offset: int) -> None:
        """Let the page cache go of everything below ``offset`` (on disk already: flushed),
        from where the last call stopped."""
        if offset > self.released_offset:
            self.release_range(self.released_offset, offset)
            self.released_offset = offset

    def release_range(self, start: int, end: int) -> None:
        """Let the page cache go of the whole pages of [start, end), flushed bytes
        (``MappedFile.release``)."""
        for mapped in self.files:
            low, high = max(start, mapped.start_offset), min(end, mapped.end_offset)
            if low < high:
                mapped.release(low - mapped.start_offset, high - mapped.start_offset)

    def close(self) -> None:
        if self._preallocator:
            self._preallocator.stop()
            self._preallocator = None
        for mapped in self.files:
            mapped.close()


def _holds_data(path: str, size: int) -> bool:
    """Whether any of the first ``size`` bytes of ``path`` is not zero (read in chunks)."""
    chunk = 1 << 20
    with open(path, "rb") as handle:
        while True:
            data = handle.read(chunk)
            if not data:
                return False
            if data.count(0) != len(data):
                return True
