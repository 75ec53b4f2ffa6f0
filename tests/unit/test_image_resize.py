"""How an image is brought to its model's size: squashed (the default), or torchvision's Resize of the shorter side
then CenterCrop, equal to the arithmetic of torchvision's own functional code, written out here (torchvision itself is
not a dependency: these are its ``resize`` with an int size and ``center_crop`` on a PIL image, as of 0.2x)."""

from __future__ import annotations

from io import BytesIO
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps
from pydantic import ValidationError

from inferq.shared.errors import InvalidInput
from inferq.shared.inputs.image import ImageInput
from inferq.shared.models import ModelConfig
from inferq.workers.handlers import ImageClassifier

CPU = torch.device("cpu")
PIL_FILTERS = {"nearest": Image.NEAREST, "bilinear": Image.BILINEAR, "bicubic": Image.BICUBIC, "box": Image.BOX}


def tv_resize(img: Image.Image, size: int, interpolation: int) -> Image.Image:
    """torchvision.transforms.functional.resize(img, size) for an int size on a PIL image."""
    w, h = img.size
    # _compute_resized_output_size: the shorter side to size, the longer one int(size * long / short).
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = size, int(size * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if [h, w] == [new_h, new_w]:
        return img
    return img.resize((new_w, new_h), interpolation)  # F_pil.resize: img.resize(tuple(size[::-1]), interpolation)


def tv_center_crop(img: Image.Image, output_size: tuple[int, int]) -> Image.Image:
    """torchvision.transforms.functional.center_crop(img, [crop_height, crop_width]) on a PIL image."""
    crop_height, crop_width = output_size
    image_width, image_height = img.size
    if crop_width > image_width or crop_height > image_height:
        padding_ltrb = [
            (crop_width - image_width) // 2 if crop_width > image_width else 0,
            (crop_height - image_height) // 2 if crop_height > image_height else 0,
            (crop_width - image_width + 1) // 2 if crop_width > image_width else 0,
            (crop_height - image_height + 1) // 2 if crop_height > image_height else 0,
        ]
        img = ImageOps.expand(img, border=tuple(padding_ltrb), fill=0)  # F_pil.pad, padding_mode="constant"
        image_width, image_height = img.size
        if crop_width == image_width and crop_height == image_height:
            return img
    crop_top = int(round((image_height - crop_height) / 2.0))
    crop_left = int(round((image_width - crop_width) / 2.0))
    return img.crop((crop_left, crop_top, crop_left + crop_width, crop_top + crop_height))  # F_pil.crop


def tv_to_tensor_normalized(img: Image.Image, mean: list[float], std: list[float]) -> torch.Tensor:
    """ToTensor (uint8 HWC to CHW floats in [0, 1]) then Normalize(mean, std)."""
    pixels = torch.from_numpy(np.array(img, dtype=np.float64))
    pixels = (pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)) / 255.0
    return ((pixels - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)).float()


def _photo(width: int, height: int, mode: str, seed: int) -> Image.Image:
    """Noise with a gradient: every filter and every offset shows in it."""
    rng = np.random.default_rng(seed)
    shape = (height, width, 3) if mode == "RGB" else (height, width)
    noise = rng.integers(0, 256, shape).astype(np.float64)
    ramp = np.linspace(0, 255, width)[np.newaxis, :]
    ramp = ramp[..., np.newaxis] if mode == "RGB" else ramp
    return Image.fromarray(((noise + ramp) / 2).astype(np.uint8), mode)


def _png(image: Image.Image) -> bytes:
    out = BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _handler(tmp_path: Path, **image: Any) -> ImageClassifier:
    config = ModelConfig.model_validate({"name": "m", "path": tmp_path, "input": {"kind": "image", **image}})
    return ImageClassifier(config, CPU)


# (width, height) of the upload, the shorter side, the crop (height, width): landscape and portrait; a long side
# truncated (256 * 300 / 199 = 385.9); centre offsets of 58.5 and 80.5, which Python rounds half to even (58, 80);
# an image already at the shorter side (not resized); one smaller than the crop on both sides, on one, and by odd
# amounts (padded).
CASES = [
    ((500, 375), 256, (224, 224)),
    ((375, 500), 256, (224, 224)),
    ((300, 199), 256, (224, 224)),
    ((257, 600), 256, (224, 160)),
    ((256, 256), 256, (224, 224)),
    ((100, 80), 64, (96, 96)),
    ((200, 60), 64, (96, 96)),
    ((99, 81), 64, (95, 97)),  # padded by odd amounts: 9 left and 10 right, 15 above and 16 below
]


@pytest.mark.parametrize(("upload", "shorter_side", "crop"), CASES)
@pytest.mark.parametrize("interpolation", ["bilinear", "bicubic", "nearest"])
def test_shorter_side_and_centre_crop_equal_torchvisions_transforms(
    tmp_path: Path, upload: tuple[int, int], shorter_side: int, crop: tuple[int, int], interpolation: str
) -> None:
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    handler = _handler(
        tmp_path,
        mode="RGB",
        size=list(crop),
        resize={"method": "shorter_side", "shorter_side": shorter_side, "interpolation": interpolation},
        mean=mean,
        std=std,
    )
    image = _photo(*upload, "RGB", seed=sum(upload))
    reference = tv_center_crop(tv_resize(image, shorter_side, PIL_FILTERS[interpolation]), crop)
    item = handler.preprocess(_png(image), "image/png")
    assert item.shape == (3, *crop)
    torch.testing.assert_close(item, tv_to_tensor_normalized(reference, mean, std), rtol=0, atol=1e-5)


def test_a_grey_model_crops_alike(tmp_path: Path) -> None:
    handler = _handler(tmp_path, mode="L", size=[28, 28], resize={"method": "shorter_side", "shorter_side": 32})
    image = _photo(45, 37, "L", seed=3)
    reference = tv_center_crop(tv_resize(image, 32, Image.BILINEAR), (28, 28))  # bilinear: torchvision's default
    item = handler.preprocess(_png(image), "image/png")
    torch.testing.assert_close(item, tv_to_tensor_normalized(reference, [0.0], [1.0]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("resize", [None, {"method": "squash"}, {"method": "squash", "interpolation": "bicubic"}])
def test_squash_scales_the_whole_image_to_the_size(tmp_path: Path, resize: dict[str, str] | None) -> None:
    """What every image model did before the choice existed, and still does by default: a box filter, no crop."""
    handler = _handler(tmp_path, mode="RGB", size=[24, 40], **({"resize": resize} if resize else {}))
    image = _photo(70, 33, "RGB", seed=5)
    interpolation = (resize or {}).get("interpolation", "box")
    reference = image.resize((40, 24), PIL_FILTERS[interpolation])
    item = handler.preprocess(_png(image), "image/png")
    torch.testing.assert_close(item, tv_to_tensor_normalized(reference, [0.0], [1.0]), rtol=0, atol=1e-5)


def test_a_shape_the_shorter_side_would_blow_up_is_refused(tmp_path: Path) -> None:
    handler = _handler(tmp_path, size=[224, 224], resize={"method": "shorter_side", "shorter_side": 256})
    handler.max_image_pixels = 1_000_000
    with pytest.raises(InvalidInput, match=r"image is 4000x2: its shorter side scaled to 256 makes it 512000x256"):
        handler.preprocess(_png(_photo(4000, 2, "RGB", seed=1)), "image/png")


def test_the_api_checks_the_resize_config() -> None:
    assert ImageInput().resize.model_dump() == {"method": "squash", "interpolation": "box"}
    chosen = ImageInput.model_validate({"resize": {"method": "shorter_side", "shorter_side": 256}})
    assert chosen.resize.model_dump() == {"method": "shorter_side", "shorter_side": 256, "interpolation": "bilinear"}
    for bad in (
        {"method": "crop"},
        {"method": "shorter_side"},
        {"method": "shorter_side", "shorter_side": 0},
        {"method": "shorter_side", "shorter_side": 256, "interpolation": "area"},
        {"method": "squash", "shorter_side": 256},
    ):
        with pytest.raises(ValidationError):
            ImageInput.model_validate({"resize": bad})
