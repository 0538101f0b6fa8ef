"""Arrays of unsigned integers as little-endian bytes, whatever the host's byte order.

Every binary layout of the router is little-endian: token ids as u32 (radix tree edges), chained
block hashes as u64 (summaries, send notices). On a little-endian host an array's buffer already
is that encoding, so packing is the one copy into ``bytes`` and unpacking the one copy out of them.
"""

from __future__ import annotations

import sys
from array import array


def pack_le(values: array) -> bytes:
    """``values`` (an ``array('I')``, ``array('Q')``, ...) as little-endian bytes; never modifies it."""
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def unpack_le(typecode: str, data: bytes | bytearray | memoryview) -> array:
    """Inverse of :func:`pack_le`: little-endian ``data`` as an ``array(typecode)``.

    ``len(data)`` must be a multiple of the item size (``ValueError`` otherwise): callers check it
    first to name what is malformed.
    """
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder != "little":
        values.byteswap()
    return values
