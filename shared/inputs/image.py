"""The ``image`` input kind: an uploaded image, checked by reading only its header."""

from __future__ import annotations

import io
import warnings
from typing import Annotated, Any, Literal

from PIL import Image, UnidentifiedImageError
from pydantic import BaseModel, ConfigDict, Field

from inferq.shared.errors import InvalidInput, UnsupportedMedia
from inferq.shared.inputs.base import InputKind, Payload
from inferq.shared.inputs.headers import PNG_SIGNATURE, TooManyChunks, jpeg_size, png_chunks, png_size
from inferq.shared.settings import Settings

# Pillow's resampling filters by name, as torchvision's InterpolationMode names them (lower case).
Interpolation = Literal["nearest", "bilinear", "bicubic", "box", "hamming", "lanczos"]


class Squash(BaseModel):
    """Every image scaled to ``size`` as it is: its aspect ratio not kept, nothing cropped (the default)."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["squash"] = "squash"
    interpolation: Interpolation = "box"


class ShorterSide(BaseModel):
    """torchvision's ``Resize(shorter_side)`` then ``CenterCrop(size)``, as ImageNet models are evaluated: the shorter
    side scaled to ``shorter_side`` with the aspect ratio kept, then the centre ``size`` cut out (a side shorter than
    the crop padded with black, as torchvision pads)."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["shorter_side"] = "shorter_side"
    shorter_side: int = Field(ge=1, le=16_384)
    interpolation: Interpolation = "bilinear"


class ImageInput(BaseModel):
    """How an uploaded image becomes the model's input tensor."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["image"] = "image"
    mode: Literal["L", "RGB"] = "RGB"
    size: tuple[int, int] = (224, 224)  # (height, width)
    # How an image of another size is brought to ``size``.
    resize: Annotated[Squash | ShorterSide, Field(discriminator="method")] = Field(default_factory=Squash)
    # Pixels are scaled to [0, 1], then normalized per channel.
    mean: list[float] = Field(default_factory=lambda: [0.0])
    std: list[float] = Field(default_factory=lambda: [1.0])


# The formats docs/models.md names; Pillow's other decoders (dozens, some rarely exercised) are never opened.
IMAGE_FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
# Real PNGs carry a handful of chunks before their pixels; Pillow walks every one of them to find the size.
MAX_PNG_CHUNKS = 10_000


def check_png_chunks(data: bytes) -> None:
    """Refuse a PNG padded with thousands of chunks before its image data, before Pillow parses them all."""
    if not data.startswith(PNG_SIGNATURE):
        return
    for index, (kind, _, _) in enumerate(png_chunks(data)):
        if kind in (b"IDAT", b"IEND"):
            return
        if index + 1 >= MAX_PNG_CHUNKS:
            raise _too_many_chunks()
    # truncated: Pillow says what is wrong


def _too_many_chunks() -> InvalidInput:
    return InvalidInput(f"the PNG has more than {MAX_PNG_CHUNKS} chunks before its image data")


def header_size(data: bytes) -> tuple[str, tuple[int, int]] | None:
    """The format and size of a plainly well-formed PNG or JPEG, read without Pillow; ``None`` for anything else."""
    try:
        png = png_size(data, MAX_PNG_CHUNKS)
    except TooManyChunks:
        raise _too_many_chunks() from None
    if png is not None:
        return "PNG", png
    jpeg = jpeg_size(data)
    return ("JPEG", jpeg) if jpeg is not None else None


def check_image(data: bytes, settings: Settings) -> str:
    """Read only the image header: its format, or a 415/422."""
    if not data:
        raise InvalidInput("the image is empty")
    header = header_size(data)
    if header is not None:
        fmt, (width, height) = header
    else:
        fmt, (width, height) = _pillow_header(data, settings)
    if width * height > settings.max_image_pixels:
        raise InvalidInput(
            f"the image is {width}x{height} = {width * height} pixels; the limit is {settings.max_image_pixels}"
        )
    return fmt


def _pillow_header(data: bytes, settings: Settings) -> tuple[str, tuple[int, int]]:
    """What Pillow's open finds: the reference for every format, and for any PNG the header reader doubts."""
    check_png_chunks(data)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=IMAGE_FORMATS) as image:
                width, height = image.size
                fmt = image.format or "unknown"
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise InvalidInput(f"the image has too many pixels (limit {settings.max_image_pixels})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise UnsupportedMedia("the upload is not a decodable image (PNG, JPEG, WebP, GIF or BMP)") from None
    return fmt, (width, height)


def from_bytes(spec: ImageInput, data: bytes, content_type: str, model: str, settings: Settings) -> Payload:
    """The image as uploaded, once its header reads as an image."""
    check_image(data, settings)
    return Payload(data, content_type.split(";")[0].strip().lower() or "application/octet-stream")


# Raw bodies the API reads as an image; a multipart "file" part may carry the same.
MEDIA_TYPES = ("image/*", "application/octet-stream")


def openapi(spec: ImageInput) -> dict[str, dict[str, Any]]:
    # Non-empty bytes ("the image is empty" otherwise); that they decode is more than a JSON Schema can say.
    image = {"type": "string", "format": "binary", "minLength": 1}
    return {media_type: dict(image) for media_type in ("multipart/form-data", *MEDIA_TYPES)}


KIND = InputKind(
    name="image",
    config=ImageInput,
    takes="an image: multipart/form-data with a 'file' field, or an image/* body",
    openapi=openapi,
    from_bytes=from_bytes,
    media_types=MEDIA_TYPES,
    multipart=True,
)
