"""A PNG's or a plain JPEG's size read straight from its header, for the submit path's check.

Opening an image with Pillow to learn its size cost about as much as the rest of a digit submit's checks
together (a file object, a plugin lookup, a decoder's state). A PNG's size sits at a fixed place in its first
chunk. This reader makes the checks Pillow's open makes (every chunk CRC before the image data, a known bit
depth and colour type, filter method 0), accepts only what is plainly well formed, and answers ``None`` on any
doubt, so the caller falls back to Pillow, whose messages and corner cases stay the reference
(tests/unit/test_image_headers.py holds the two to the same answers, mutated files included). Written here rather
than taken from a library: header-only readers on PyPI (imagesize and others) skip those checks.

A JPEG's open in Pillow parses every segment before the scan (EXIF, ICC, Adobe, quantization tables): about
130 us of a 34 KB JPEG's submit, and of each bulk line (issue 46). The JPEG reader takes only the plainest file,
the one encoders write with no metadata: segments one after another from SOI to SOS, only JFIF's APP0 (as long
as Pillow reads it), quantization tables as Pillow reads them, Huffman tables, restart intervals and one
baseline, extended or progressive frame of 8 bits with 1 or 3 components. Anything else (EXIF, ICC, comments,
padding, junk between segments, a second frame, CMYK) is a doubt: Pillow decides, as for a doubtful PNG.
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


JPEG_SIGNATURE = b"\xff\xd8\xff"
_JPEG_FRAMES = frozenset({0xC0, 0xC1, 0xC2})  # baseline, extended and progressive Huffman frames, 8 bits
_JPEG_PLAIN = frozenset({0xC4, 0xDD})  # Huffman tables, restart interval: Pillow skips over their contents
_JPEG_JFIF = 0xE0
_JPEG_TABLES = 0xDB
_JPEG_SCAN = 0xDA


def jpeg_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) of a plain JPEG (the module's docstring says which), read as Pillow's open reads it up to
    its scan; else ``None``."""
    if not data.startswith(JPEG_SIGNATURE):
        return None
    offset, size = 2, None
    while offset + 4 <= len(data):
        if data[offset] != 0xFF:
            return None
        marker = data[offset + 1]
        (length,) = struct.unpack_from(">H", data, offset + 2)
        start, end = offset + 4, offset + 2 + length
        if length < 2 or end > len(data):
            return None
        if marker == _JPEG_SCAN:
            return size
        if marker in _JPEG_FRAMES:
            if size is not None or length < 8:
                return None
            bits, height, width, layers = struct.unpack_from(">BHHB", data, start)
            if bits != 8 or layers not in (1, 3) or not width or not height:
                return None
            size = (width, height)
        elif marker == _JPEG_TABLES:
            if not _quantization_tables(data[start:end]):
                return None
        elif marker == _JPEG_JFIF:
            if data.startswith(b"JFIF", start) and length - 2 < 7:
                return None  # Pillow reads the JFIF version at offset 5
        elif marker not in _JPEG_PLAIN:
            return None
        offset = end
    return None


def _quantization_tables(segment: bytes) -> bool:
    """Whether a DQT segment holds whole tables, as Pillow's reader requires (64 entries of 1 or 2 bytes each)."""
    at = 0
    while at < len(segment):
        at += 1 + (1 if segment[at] // 16 == 0 else 2) * 64
        if at > len(segment):
            return False
    return True
