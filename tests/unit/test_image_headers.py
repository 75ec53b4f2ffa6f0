"""The submit path reads a PNG's size from its header without Pillow, and agrees with Pillow on every file."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from inferq.shared.errors import InvalidInput, UnsupportedMedia
from inferq.shared.inputs import image as image_kind
from inferq.shared.inputs.image import IMAGE_FORMATS, MAX_PNG_CHUNKS, check_image, header_size
from inferq.shared.settings import Settings


def _pillow(data: bytes) -> tuple[str, tuple[int, int]] | None:
    try:
        with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as opened:
            return opened.format or "", opened.size
    except Exception:
        return None


def _png(mode: str, size: tuple[int, int] = (37, 21), **options: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format="PNG", **options)
    return buffer.getvalue()


def _pngs() -> list[bytes]:
    files = [_png(mode) for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16")]
    files += [_png("RGB", interlace=1), _png("L", (1, 1)), _png("RGB", (300, 2), optimize=True)]
    with_text = Image.new("RGB", (9, 7))
    buffer = io.BytesIO()
    info = PngInfo()
    info.add_text("Comment", "chunks before the image data")
    with_text.save(buffer, format="PNG", pnginfo=info, dpi=(72, 72))
    return [*files, buffer.getvalue()]


@pytest.mark.parametrize("data", _pngs(), ids=lambda data: str(len(data)))
def test_the_header_reader_gives_pillows_format_and_size(data: bytes) -> None:
    assert header_size(data) == _pillow(data)


def _mutations(data: bytes, rng: random.Random, count: int) -> list[bytes]:
    out = []
    for _ in range(count):
        mutated = bytearray(data)
        choice = rng.random()
        if choice < 0.6:  # flip bytes in the header and first chunks
            for _ in range(rng.randint(1, 3)):
                mutated[rng.randrange(min(len(mutated), 200))] = rng.randrange(256)
        elif choice < 0.8:
            del mutated[rng.randrange(len(mutated)) :]
        else:
            at = rng.randrange(min(len(mutated), 200))
            mutated[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        out.append(bytes(mutated))
    return out


def test_on_broken_pngs_the_reader_answers_only_what_pillow_answers() -> None:
    """Any size the reader gives, Pillow gives too; where it doubts, Pillow (the reference) decides."""
    rng = random.Random(11)
    accepted = doubted = 0
    for data in _pngs():
        for mutated in _mutations(data, rng, 400):
            header = header_size(mutated)
            if header is None:
                doubted += 1
                continue
            accepted += 1
            assert header == _pillow(mutated), mutated[:64]
    # Both sides of the comparison were exercised: flips in pixel data or ancillary text pass, header damage not.
    assert accepted > 500 and doubted > 500, (accepted, doubted)


def test_a_png_is_checked_without_opening_it_in_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pillow(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow opened a well-formed PNG")

    monkeypatch.setattr(image_kind.Image, "open", no_pillow)
    assert check_image(_png("L", (8, 8)), Settings()) == "PNG"


def test_what_the_reader_doubts_still_gets_pillows_answer() -> None:
    settings = Settings()
    broken = bytearray(_png("RGB"))
    broken[20] ^= 0xFF  # inside IHDR: its CRC no longer matches
    with pytest.raises(UnsupportedMedia, match="not a decodable image"):
        check_image(bytes(broken), settings)
    jpeg = io.BytesIO()
    Image.new("RGB", (5, 4)).save(jpeg, format="JPEG")
    assert header_size(jpeg.getvalue()) is None
    assert check_image(jpeg.getvalue(), settings) == "JPEG"


def test_pixel_limit_and_chunk_limit_hold_on_the_fast_path() -> None:
    with pytest.raises(InvalidInput, match="pixels; the limit is 100"):
        check_image(_png("L", (11, 10)), Settings(max_image_pixels=100))
    assert check_image(_png("L", (10, 10)), Settings(max_image_pixels=100)) == "PNG"
    data = _png("L", (4, 4))
    ihdr_end = 8 + 25
    text = b"tEXt" + b"a\x00b"
    chunk = struct.pack(">I", 3) + text + struct.pack(">I", zlib.crc32(text))
    padded = data[:ihdr_end] + chunk * (MAX_PNG_CHUNKS + 1) + data[ihdr_end:]
    with pytest.raises(InvalidInput, match="more than 10000 chunks"):
        check_image(padded, Settings())
