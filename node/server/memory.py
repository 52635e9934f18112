"""Giving freed memory back to the system (glibc's malloc, through ctypes).

A pull reply is megabytes. glibc serves an allocation that large from its own mmap and
unmaps it when freed, but its threshold for doing so grows (up to 32 MiB) each time such a
block is freed, after which blocks of that size come from the heap, where a freed one stays
in the process. A node that once answered large pulls for a client that did not read them
would then keep that memory after the connection closed. Fixing the threshold keeps large
blocks mapped and returned on free; ``trim`` hands back freed heap pages too, after a
connection that held many bytes closes. Elsewhere than glibc both do nothing.
"""

from __future__ import annotations

import ctypes
import logging

log = logging.getLogger(__name__)

M_MMAP_THRESHOLD = -3            # mallopt parameter (malloc.h)
# Above the 256 KiB a read takes from a socket (and the 1 MiB of a dispatch pass), so that
# the buffers of every request stay on the heap: at 256 KiB each read mapped and unmapped
# its buffer, and a single send's round trip rose from about 1.5x to 1.9x the echo floor
# (hastore bench produce, same sitting). Pull replies of megabytes are still mapped apart.
MMAP_THRESHOLD_BYTES = 1024 * 1024
_libc = None


def _glibc():
    global _libc
    if _libc is None:
        try:
            # the symbols already loaded in this process (libc among them): find_library would
            # run ldconfig in a subprocess on the first large reply
            library = ctypes.CDLL(None)
            library.mallopt  # noqa: B018 - only glibc has both
            library.malloc_trim
            _libc = library
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def return_large_buffers_to_the_system() -> bool:
    """Blocks of MMAP_THRESHOLD_BYTES and more are mapped on their own and unmapped on free,
    whatever was freed before (call once, at process start). False when not glibc."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def trim() -> None:
    """Hand free heap pages back to the system (cheap when there is little to give back)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
