"""A PNG's size read straight from its header, for the submit path's check.

Opening an image with Pillow to learn its size cost about as much as the rest of a digit submit's checks
together (a file object, a plugin lookup, a decoder's state). A PNG's size sits at a fixed place in its first
chunk. This reader makes the checks Pillow's open makes (every chunk CRC before the image data, a known bit
depth and colour type, filter method 0), accepts only what is plainly well formed, and answers ``None`` on any
doubt, so the caller falls back to Pillow, whose messages and corner cases stay the reference
(tests/unit/test_image_headers.py holds the two to the same answers, mutated files included). Written here rather
than taken from a library: header-only readers on PyPI (imagesize and others) skip those checks. JPEG stays
with Pillow: its open parses every segment before the scan (EXIF, ICC, Adobe, quantization tables), which a
reader of the frame header alone would not match.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# (bit depth, colour type) pairs a PNG may carry (the PNG specification's table, as Pillow's PNG reader).
_PNG_MODES = frozenset(
    {(1, 0), (2, 0), (4, 0), (8, 0), (16, 0), (8, 2), (16, 2), (1, 3), (2, 3), (4, 3), (8, 3)}
    | {(8, 4), (16, 4), (8, 6), (16, 6)}
)


class TooManyChunks(Exception):
    """A PNG with more chunks before its image data than anyone sends."""


def png_chunks(data: bytes) -> Iterator[tuple[bytes, int, int]]:
    """(type, offset of its data, length) of each chunk whose 8-byte header is all there, in order."""
    offset = len(PNG_SIGNATURE)
    while offset + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, offset)
        yield kind, offset + 8, length
        offset += 12 + length


def png_size(data: bytes, max_chunks: int) -> tuple[int, int] | None:
    """(width, height) of a well-formed PNG, every chunk before its image data CRC-checked; else ``None``.

    Raises TooManyChunks when more than ``max_chunks`` chunks come before the image data.
    """
    if not data.startswith(PNG_SIGNATURE):
        return None
    size: tuple[int, int] | None = None
    for index, (kind, start, length) in enumerate(png_chunks(data)):
        if kind == b"IDAT":
            return size
        end = start + length
        if end + 4 > len(data) or kind == b"IEND":
            return None
        (crc,) = struct.unpack_from(">I", data, end)
        if zlib.crc32(memoryview(data)[start - 4 : end]) != crc:
            return None
        if index == 0:
            if kind != b"IHDR" or length != 13:
                return None
            width, height, depth, colour, compression, filtering, interlace = struct.unpack_from(
                ">IIBBBBB", data, start
            )
            if (depth, colour) not in _PNG_MODES or compression or filtering or interlace > 1 or not width * height:
                return None
            size = (width, height)
        if index + 1 >= max_chunks:
            raise TooManyChunks
    return None
