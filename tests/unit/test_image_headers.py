"""The submit path reads a PNG's or a plain JPEG's size from its header without Pillow, and agrees with Pillow on
every file, mutated files included."""

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


def _jpeg(mode: str, size: tuple[int, int] = (37, 21), **options: object) -> bytes:
    buffer = io.BytesIO()
    pixels = Image.effect_noise(size, 40).convert(mode)
    pixels.save(buffer, format="JPEG", **options)
    return buffer.getvalue()


def _jpegs() -> list[bytes]:
    """JPEGs as encoders write them with no metadata: the reader answers each without Pillow."""
    files = [_jpeg("L"), _jpeg("RGB"), _jpeg("RGB", (224, 224), quality=90), _jpeg("RGB", (1, 1))]
    files += [_jpeg("RGB", progressive=True), _jpeg("RGB", optimize=True), _jpeg("RGB", subsampling=0)]
    files += [_jpeg("RGB", dpi=(300, 300)), _jpeg("L", (640, 3), quality=20), _jpeg("RGB", restart_marker_rows=1)]
    return files


@pytest.mark.parametrize("data", _pngs(), ids=lambda data: str(len(data)))
def test_the_header_reader_gives_pillows_format_and_size(data: bytes) -> None:
    assert header_size(data) == _pillow(data)


@pytest.mark.parametrize("data", _jpegs(), ids=lambda data: str(len(data)))
def test_a_plain_jpeg_is_read_without_pillow_as_pillow_reads_it(data: bytes) -> None:
    found = header_size(data)
    assert found is not None and found == _pillow(data)


def test_on_broken_jpegs_the_reader_answers_only_what_pillow_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a CRC a flipped byte of the frame header is a new size: Pillow reads the same one (its bomb check
    off here; ``check_image`` holds the pixel limit on both paths, the test below)."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    accepted, doubted = _against_pillow(_jpegs(), random.Random(12))
    assert accepted > 500 and doubted > 500, (accepted, doubted)


def _against_pillow(files: list[bytes], rng: random.Random) -> tuple[int, int]:
    """400 mutations of each file: every size the reader gives is Pillow's; (how many it gave, how many it doubted)."""
    accepted = doubted = 0
    for data in files:
        for mutated in _mutations(data, rng, 400):
            header = header_size(mutated)
            if header is None:
                doubted += 1
                continue
            accepted += 1
            assert header == _pillow(mutated), mutated[:64]
    return accepted, doubted


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
    accepted, doubted = _against_pillow(_pngs(), random.Random(11))
    # Both sides of the comparison were exercised: flips in pixel data or ancillary text pass, header damage not.
    assert accepted > 500 and doubted > 500, (accepted, doubted)


def test_a_png_is_checked_without_opening_it_in_pillow(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_pillow(*args: object, **kwargs: object) -> None:
        raise AssertionError("Pillow opened a well-formed PNG")

    monkeypatch.setattr(image_kind.Image, "open", no_pillow)
    assert check_image(_png("L", (8, 8)), Settings()) == "PNG"
    assert check_image(_jpeg("RGB", (224, 224)), Settings()) == "JPEG"


def test_what_the_reader_doubts_still_gets_pillows_answer() -> None:
    settings = Settings()
    broken = bytearray(_png("RGB"))
    broken[20] ^= 0xFF  # inside IHDR: its CRC no longer matches
    with pytest.raises(UnsupportedMedia, match="not a decodable image"):
        check_image(bytes(broken), settings)
    with_exif = _jpeg("RGB", (5, 4), exif=Image.Exif())  # EXIF: the JPEG reader leaves it to Pillow
    assert header_size(with_exif) is None
    assert check_image(with_exif, settings) == "JPEG"
    cut = _jpeg("L")[:30]  # cut before its frame header
    assert header_size(cut) is None
    with pytest.raises(UnsupportedMedia, match="not a decodable image"):
        check_image(cut, settings)


def test_pixel_limit_and_chunk_limit_hold_on_the_fast_path() -> None:
    with pytest.raises(InvalidInput, match="pixels; the limit is 100"):
        check_image(_png("L", (11, 10)), Settings(max_image_pixels=100))
    with pytest.raises(InvalidInput, match="pixels; the limit is 100"):
        check_image(_jpeg("L", (11, 10)), Settings(max_image_pixels=100))
    assert check_image(_png("L", (10, 10)), Settings(max_image_pixels=100)) == "PNG"
    data = _png("L", (4, 4))
    ihdr_end = 8 + 25
    text = b"tEXt" + b"a\x00b"
    chunk = struct.pack(">I", 3) + text + struct.pack(">I", zlib.crc32(text))
    padded = data[:ihdr_end] + chunk * (MAX_PNG_CHUNKS + 1) + data[ihdr_end:]
    with pytest.raises(InvalidInput, match="more than 10000 chunks"):
        check_image(padded, Settings())
