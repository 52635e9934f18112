"""The pages ahead of a writer through the mapping: a window smaller than the kernel's
read-around is faulted in page by page (MappedFile.populate_for_write, _Preallocator)."""

from __future__ import annotations

import ctypes
import mmap
import time

import pytest

from store.mapped_file import MappedFile
from store.mapped_file_queue import MappedFileQueue

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
SIZE = 32 * 1024 * 1024
WINDOW = 256 * 1024


def _cached_pages(mapped: MappedFile, start: int, end: int) -> int:
    """How many pages of [start, end) are in the page cache (mincore over the mapping)."""
    pages = (end - start) // mmap.PAGESIZE
    vector = ctypes.create_string_buffer(pages)
    assert _libc.mincore(mapped._address + start, end - start, vector) == 0, ctypes.get_errno()
    return sum(byte & 1 for byte in vector.raw)


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of this process's mapping that holds ``address`` (/proc/self/smaps)."""
    inside = False
    with open("/proc/self/smaps", encoding="ascii") as smaps:
        for line in smaps:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                low, high = (int(part, 16) for part in head.split("-"))
                inside = low <= address < high
            elif inside and head == "VmFlags:":
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_window_page_by_page_brings_in_its_pages_and_no_more(tmp_path):
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, SIZE, create=True)
    try:
        assert mapped.populate_for_write(0, WINDOW, page_by_page=True) is True
        assert _cached_pages(mapped, 0, WINDOW) == WINDOW // mmap.PAGESIZE
        assert _cached_pages(mapped, WINDOW, SIZE) == 0   # no read-around past the window
        # MADV_RANDOM over the window and a read-ahead's length past it (a writer outrunning it)
        past = WINDOW + mapped.read_ahead_bytes
        assert "rr" in _vm_flags(mapped._address) and "rr" in _vm_flags(mapped._address + past - mmap.PAGESIZE)
        assert "rr" not in _vm_flags(mapped._address + past)
        mapped.mm[WINDOW - 5:WINDOW] = b"hello"
        assert mapped.mm[WINDOW - 6:WINDOW] == b"\0hello"
        mapped.flush()
        mapped.release(0, WINDOW)   # let go once flushed: read back with the read-around
        assert "rr" not in _vm_flags(mapped._address) and "rr" in _vm_flags(mapped._address + WINDOW)
        assert mapped.mm[WINDOW - 6:WINDOW] == b"\0hello"
    finally:
        mapped.close()


def test_a_file_mapped_without_fault_around_keeps_it_off_when_let_go(tmp_path):
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, SIZE, create=True, fault_around=False)
    try:
        mapped.mm[:5] = b"queue"
        mapped.flush()
        mapped.release(0, WINDOW)
        assert "rr" in _vm_flags(mapped._address)
    finally:
        mapped.close()


def test_a_window_all_at_once_takes_the_kernels_read_around(tmp_path):
    # what page by page avoids, where the device reads around a fault (8 MiB here)
    mapped = MappedFile(str(tmp_path / "00000000000000000000"), 0, SIZE, create=True)
    try:
        if mapped.read_ahead_bytes <= WINDOW:
            pytest.skip(f"the device reads ahead {mapped.read_ahead_bytes} bytes: no read-around past the window")
        assert mapped.populate_for_write(0, WINDOW) is True
        assert _cached_pages(mapped, 0, WINDOW) == WINDOW // mmap.PAGESIZE
        assert _cached_pages(mapped, WINDOW, SIZE) > 0
        assert "rr" not in _vm_flags(mapped._address)
    finally:
        mapped.close()


@pytest.mark.parametrize("window_pages", [64, 4096])
def test_the_preallocator_goes_page_by_page_below_the_read_around(tmp_path, monkeypatch, window_pages):
    calls = []
    real = MappedFile.populate_for_write

    def populate_for_write(self, start, end, **options):
        calls.append((start, end, options.get("page_by_page", False)))
        return real(self, start, end, **options)

    monkeypatch.setattr(MappedFile, "populate_for_write", populate_for_write)
    queue = MappedFileQueue(str(tmp_path), SIZE, preallocate=True)
    queue.load()
    mapped = queue.roll(0)
    try:
        window = window_pages * mmap.PAGESIZE
        queue.populate_ahead(0, for_write=True, window=window)
        deadline = time.monotonic() + 10
        while not calls or calls[-1][1] < window:
            assert time.monotonic() < deadline, calls
            time.sleep(0.005)
        assert {by_page for _, _, by_page in calls} == {window < mapped.read_ahead_bytes}
    finally:
        queue.close()
