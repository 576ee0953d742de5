"""One reused buffer for reading sockets, instead of a new ``bytes`` per read.

A plain ``asyncio.Protocol`` gets each read as a fresh ``bytes`` object that
asyncio allocates at 256 KiB and shrinks to what arrived. glibc serves an
allocation that large with ``mmap`` and returns it with ``munmap``, unless
an earlier free of that size has raised its threshold; on keep-alive
connections that never close, no such free comes, and every read costs
three system calls and fresh pages (docs/performance.md). A buffered
protocol reads into a buffer it owns instead.
"""

from __future__ import annotations

READ_SIZE = 64 * 1024  # bytes one read may bring; under glibc's mmap threshold


class ReadBuffer:
    """The buffer that every connection on one event loop reads into.

    Sharing it is safe because asyncio calls a protocol's ``get_buffer``,
    reads into the buffer and calls the same protocol's ``buffer_updated``
    in one callback, before any other connection's; ``take`` copies the
    bytes out before that callback ends. Never share one across loops."""

    def __init__(self, size: int = READ_SIZE) -> None:
        self.view = memoryview(bytearray(size))

    def take(self, nbytes: int) -> bytes:
        """The ``nbytes`` the last read brought, as bytes of their own."""
        return bytes(self.view[:nbytes])
