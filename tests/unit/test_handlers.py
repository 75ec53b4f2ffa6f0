"""Unit tests for workers.handlers and the digits demo model; no Redis."""

from __future__ import annotations

import json
import math
import struct
import sys
import zlib
from io import BytesIO
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, PngImagePlugin

from inferq.shared.errors import ConfigError, InvalidInput, UnsupportedMedia
from inferq.shared.models import ModelConfig, load_model_config
from inferq.workers.handlers import (
    Handler,
    ImageClassifier,
    ImageEmbedding,
    TensorHandler,
    load_handler,
    move_batch,
    resolve_device,
)
from tests.support.models import ROOT, train_script

DIGITS = ROOT / "models" / "digits"
CPU = torch.device("cpu")


train = train_script("digits")


@pytest.fixture(scope="module")
def split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return train.load_split()


@pytest.fixture(scope="module")
def digits() -> Handler:
    handler = load_handler(load_model_config(DIGITS), CPU)
    handler.load()
    return handler


def _png(width: int, height: int, mode: str = "L") -> bytes:
    out = BytesIO()
    Image.new(mode, (width, height), color=128 if mode == "L" else (10, 200, 30)).save(out, format="PNG")
    return out.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims the given size, with no real pixel data behind it."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _config(tmp_path: Path, **fields: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "m", "path": tmp_path, **fields})


# --- the digits model through ImageClassifier ---------------------------------------------------


def test_digits_config_matches_handler(digits: Handler) -> None:
    assert isinstance(digits, ImageClassifier)
    assert digits.config.top_k == 3
    assert digits.config.labels == [str(i) for i in range(10)]


def test_preprocess_reproduces_training_input(digits: Handler, split: tuple) -> None:
    _, _, test_x, _ = split
    for image in test_x[:20]:
        item = digits.preprocess(train.render_png(image), "image/png")
        assert item.shape == (1, 8, 8) and item.dtype == torch.float32 and item.device == CPU
        torch.testing.assert_close(item, train.to_input(image[None])[0], rtol=0, atol=1e-6)


def test_digits_held_out_accuracy(digits: Handler, split: tuple) -> None:
    _, _, test_x, test_y = split
    batch = torch.stack([digits.preprocess(train.render_png(image), "image/png") for image in test_x])
    results = [digits.postprocess(row) for row in digits.predict(batch)]
    accuracy = np.mean([result["label"] == str(label) for result, label in zip(results, test_y, strict=True)])
    assert accuracy >= 0.95
    first = results[0]
    assert set(first) == {"label", "score", "top_k"}
    assert len(first["top_k"]) == 3
    assert first["top_k"][0] == {"label": first["label"], "score": first["score"]}
    scores = [entry["score"] for entry in first["top_k"]]
    assert scores == sorted(scores, reverse=True) and all(isinstance(s, float) for s in scores)
    json.dumps(results, allow_nan=False)


def test_batch_prediction_equals_per_item(digits: Handler, split: tuple) -> None:
    _, _, test_x, _ = split
    items = [digits.preprocess(train.render_png(image), "image/png") for image in test_x[:16]]
    batched = digits.predict(torch.stack(items))
    assert batched.shape == (16, 10)
    for item, row in zip(items, batched, strict=True):
        single = digits.predict(item.unsqueeze(0))[0]
        torch.testing.assert_close(row, single, rtol=1e-4, atol=1e-5)
        assert digits.postprocess(row)["label"] == digits.postprocess(single)["label"]


def test_render_png_upscales_with_nearest_neighbour(split: tuple) -> None:
    image = split[2][0]
    decoded = np.asarray(Image.open(BytesIO(train.render_png(image, scale=3))))
    assert decoded.shape == (24, 24)
    np.testing.assert_array_equal(decoded[::3, ::3], image)


def test_classifier_postprocess_replaces_non_finite(digits: Handler) -> None:
    result = digits.postprocess(torch.tensor([float("nan")] + [0.0] * 9))
    json.dumps(result, allow_nan=False)
    assert result["score"] is None


def test_top_k_is_capped_and_labels_default_to_indices(tmp_path: Path) -> None:
    config = _config(tmp_path, handler="image_classifier", input={"kind": "image", "mode": "L"}, top_k=5)
    result = ImageClassifier(config, CPU).postprocess(torch.tensor([0.0, 3.0, 1.0]))
    assert result["label"] == "1"
    assert [entry["label"] for entry in result["top_k"]] == ["1", "2", "0"]
    assert math.isclose(sum(entry["score"] for entry in result["top_k"]), 1.0, abs_tol=1e-5)


# --- hostile and broken images ------------------------------------------------------------------


def test_non_image_payload_is_unsupported_media(digits: Handler) -> None:
    with pytest.raises(UnsupportedMedia, match="could not decode image"):
        digits.preprocess(b"this is not an image", "image/png")


def test_truncated_png_is_invalid_input(digits: Handler) -> None:
    payload = _png(64, 64)
    with pytest.raises(InvalidInput, match="could not decode image: image file is truncated"):
        digits.preprocess(payload[: len(payload) // 2], "image/png")


def test_huge_declared_dimensions_are_refused(digits: Handler) -> None:
    # Over Pillow's own hard limit (an error) and over its warning limit (made an error).
    for side in (100_000, 10_000):
        with pytest.raises(InvalidInput, match="too large") as info:
            digits.preprocess(_png_header_only(side, side), "image/png")
        assert len(info.value.message) < 300


def test_pixel_limit_is_checked_before_decoding(tmp_path: Path) -> None:
    config = _config(tmp_path, input={"kind": "image", "mode": "L", "size": [8, 8]})
    handler = ImageClassifier(config, CPU, max_image_pixels=1_000)
    assert handler.preprocess(_png(10, 10), "image/png").shape == (1, 8, 8)
    # The header says 5000x5000 but there is no pixel data: a decode would fail differently.
    with pytest.raises(InvalidInput, match="over the limit of 1000"):
        handler.preprocess(_png_header_only(5_000, 5_000), "image/png")


def test_rgb_conversion_and_per_channel_normalization(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        input={
            "kind": "image",
            "mode": "RGB",
            "size": [4, 6],
            "mean": [0.0, 0.5, 1.0],
            "std": [1.0, 0.5, 2.0],
        },
    )
    item = ImageClassifier(config, CPU).preprocess(_png(12, 8, "RGB"), "image/png")
    assert item.shape == (3, 4, 6)
    expected = torch.tensor([10 / 255, (200 / 255 - 0.5) / 0.5, (30 / 255 - 1.0) / 2.0])
    torch.testing.assert_close(item[:, 0, 0], expected)


def test_every_pixel_is_normalized_per_channel_into_a_channel_first_float_tensor(tmp_path: Path) -> None:
    config = _config(
        tmp_path,
        input={"kind": "image", "mode": "RGB", "size": [5, 7], "mean": [0.2, 0.4, 0.6], "std": [0.3, 0.2, 0.1]},
    )
    pixels = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    out = BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    item = ImageClassifier(config, CPU).preprocess(out.getvalue(), "image/png")
    assert item.shape == (3, 5, 7) and item.dtype == torch.float32 and item.is_contiguous()
    reference = (torch.from_numpy(pixels).permute(2, 0, 1) / 255.0 - torch.tensor([0.2, 0.4, 0.6]).view(3, 1, 1)) / (
        torch.tensor([0.3, 0.2, 0.1]).view(3, 1, 1)
    )
    torch.testing.assert_close(item, reference.float(), rtol=0, atol=1e-5)


@pytest.mark.parametrize(("fmt", "options"), [("JPEG", {"quality": 100}), ("PNG", {}), ("WEBP", {"lossless": True})])
def test_an_exif_rotated_photo_is_turned_upright(tmp_path: Path, fmt: str, options: dict) -> None:
    """A phone's photo stores its pixels sideways and says so in EXIF (orientation 6: rotate 90 degrees clockwise)."""
    config = _config(tmp_path, input={"kind": "image", "mode": "L", "size": [16, 8]})
    stored = np.zeros((8, 16), dtype=np.uint8)  # stored 16 wide, 8 high: the left half white
    stored[:, :8] = 255
    exif = Image.Exif()
    exif[0x0112] = 6
    out = BytesIO()
    Image.fromarray(stored).save(out, format=fmt, exif=exif.tobytes(), **options)
    item = ImageClassifier(config, CPU).preprocess(out.getvalue(), f"image/{fmt.lower()}")
    assert item.shape == (1, 16, 8)  # upright: 8 wide, 16 high
    # Rotated clockwise, the stored left half is the upright top half.
    assert item[0, :7].mean() > 0.9 and item[0, 9:].mean() < 0.1


def test_an_xmp_orientation_turns_a_png_upright(tmp_path: Path) -> None:
    config = _config(tmp_path, input={"kind": "image", "mode": "L", "size": [16, 8]})
    stored = np.zeros((8, 16), dtype=np.uint8)
    stored[:, :8] = 255
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", '<x:xmpmeta><rdf:Description tiff:Orientation="6"/></x:xmpmeta>')
    out = BytesIO()
    Image.fromarray(stored).save(out, format="PNG", pnginfo=info)
    item = ImageClassifier(config, CPU).preprocess(out.getvalue(), "image/png")
    assert item.shape == (1, 16, 8) and item[0, :7].mean() > 0.9


def test_a_palette_image_with_transparency_is_read_in_the_model_mode(tmp_path: Path) -> None:
    config = _config(tmp_path, input={"kind": "image", "mode": "RGB", "size": [2, 2]})
    image = Image.new("P", (2, 2), 1)
    image.putpalette([0, 0, 0, 255, 0, 0] + [0] * 762)
    out = BytesIO()
    image.save(out, format="PNG", transparency=0)
    item = ImageClassifier(config, CPU).preprocess(out.getvalue(), "image/png")
    torch.testing.assert_close(item[:, 0, 0], torch.tensor([1.0, 0.0, 0.0]))


def test_image_handler_needs_image_input(tmp_path: Path) -> None:
    config = _config(tmp_path, handler="image_classifier", input={"kind": "tensor", "shape": [4]})
    with pytest.raises(ConfigError):
        load_handler(config, CPU)


# --- ImageEmbedding -----------------------------------------------------------------------------


def test_image_embedding_is_unit_norm(tmp_path: Path, split: tuple) -> None:
    config = load_model_config(DIGITS).model_copy(update={"handler": "image_embedding"})
    handler = load_handler(config, CPU)
    assert isinstance(handler, ImageEmbedding)
    handler.load()
    item = handler.preprocess(train.render_png(split[2][0]), "image/png")
    result = handler.postprocess(handler.predict(item.unsqueeze(0))[0])
    assert result["dim"] == 10 == len(result["embedding"])
    assert math.isclose(math.fsum(v * v for v in result["embedding"]), 1.0, rel_tol=1e-5)


# --- TensorHandler ------------------------------------------------------------------------------


@pytest.fixture
def linear(tmp_path: Path) -> Handler:
    torch.manual_seed(0)
    torch.jit.script(torch.nn.Linear(4, 2)).save(str(tmp_path / "model.pt"))
    config = _config(tmp_path, handler="tensor", input={"kind": "tensor", "shape": [4]})
    handler = load_handler(config, CPU)
    handler.load()
    return handler


def test_tensor_handler_accepts_good_payload(linear: Handler) -> None:
    item = linear.preprocess(b'{"inputs": [1, 2.5, -3, 0]}', "application/json")
    assert item.dtype == torch.float32 and item.shape == (4,)
    result = linear.postprocess(linear.predict(torch.stack([item, item]))[0])
    assert len(result["output"]) == 2 and all(isinstance(v, float) for v in result["output"])
    assert linear.postprocess(torch.tensor([float("inf"), 1.0])) == {"output": [None, 1.0]}


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"inputs": [1, 2, 3]}', "length 4, got length 3"),
        (b'{"inputs": [[1, 2, 3, 4]]}', "length 4, got length 1"),
        (b'{"inputs": 5}', "got int"),
        (b'{"inputs": [1, 2, 3, "4"]}', r"inputs\[3\]: expected a number, got str"),
        (b'{"inputs": [1, 2, true, 4]}', r"inputs\[2\]: expected a number, got bool"),
        (b'{"inputs": [1, 2, null, 4]}', "got NoneType"),
        (b'{"inputs": [1, 2, NaN, 4]}', "NaN is not allowed"),
        (b'{"inputs": [1, 2, 1e400, 4]}', "finite"),
        (b'{"inputs": [1, 2, 1e39, 4]}', "finite"),
        (b'{"x": [1, 2, 3, 4]}', "inputs"),
        (b"[1, 2, 3, 4]", "inputs"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b"[" * 100_000, "not valid JSON"),
    ],
)
def test_tensor_handler_rejects_bad_payload(linear: Handler, payload: bytes, message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        linear.preprocess(payload, "application/json")


def test_tensor_handler_rejects_other_media_types(linear: Handler) -> None:
    with pytest.raises(UnsupportedMedia):
        linear.preprocess(b'{"inputs": [1, 2, 3, 4]}', "image/png")
    assert linear.preprocess(b'{"inputs": [1, 2, 3, 4]}', "application/json; charset=utf-8").shape == (4,)


def test_tensor_handler_int64(tmp_path: Path) -> None:
    config = _config(tmp_path, handler="tensor", input={"kind": "tensor", "shape": [2, 2], "dtype": "int64"})
    handler = load_handler(config, CPU)
    item = handler.preprocess(b'{"inputs": [[1, 2], [3, 4]]}', "application/json")
    assert item.dtype == torch.int64 and item.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(InvalidInput, match="int64"):
        handler.preprocess(b'{"inputs": [[1, 2.5], [3, 4]]}', "application/json")
    with pytest.raises(InvalidInput, match="int64"):
        handler.preprocess(b'{"inputs": [[1, 99999999999999999999], [3, 4]]}', "application/json")


def test_missing_weights_is_a_config_error(tmp_path: Path) -> None:
    config = _config(tmp_path, handler="tensor", input={"kind": "tensor", "shape": [4]})
    with pytest.raises(ConfigError, match="does not exist"):
        TensorHandler(config, CPU).load()


# --- user handlers ------------------------------------------------------------------------------

USER_MODULE = """
import torch

from inferq.workers.handlers import Handler


class Doubler(Handler):
    def __init__(self, config, device, *, factor=2.0):
        super().__init__(config, device)
        self.factor = factor

    def load(self):
        self.model = lambda batch: batch * self.factor

    def preprocess(self, payload, content_type):
        return torch.tensor([float(payload)])


class NotAHandler:
    pass
"""


def test_user_handler_is_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inferq_test_user_handlers.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "inferq_test_user_handlers", raising=False)
    config = _config(tmp_path, handler="inferq_test_user_handlers:Doubler", input={"kind": "tensor", "shape": [1]})
    # Options a handler does not declare are dropped; declared ones are passed.
    handler = load_handler(config, CPU, factor=3.0, max_image_pixels=10)
    assert isinstance(handler, Handler) and type(handler).__name__ == "Doubler"
    handler.load()
    out = handler.predict(torch.stack([handler.preprocess(b"2", "text/plain")]))
    assert handler.postprocess(out[0]) == {"output": [6.0]}

    refusals = {
        "inferq_test_user_handlers:NotAHandler": "is not a subclass of inferq.workers.handlers.Handler",
        "inferq_test_user_handlers:Missing": "inferq_test_user_handlers has no 'Missing'",
    }
    for spec, message in refusals.items():
        with pytest.raises(ConfigError, match=f"^model 'm': handler .*{message}"):
            load_handler(config.model_copy(update={"handler": spec}), CPU)
    with pytest.raises(ConfigError, match="cannot import"):
        load_handler(config.model_copy(update={"handler": "inferq_no_such_module:X"}), CPU)
    monkeypatch.delitem(sys.modules, "inferq_test_user_handlers", raising=False)


# --- devices ------------------------------------------------------------------------------------


def test_resolve_device() -> None:
    assert resolve_device("cpu") == CPU
    assert resolve_device("auto") == (torch.device("cuda:0") if torch.cuda.is_available() else CPU)
    for bad in ("tpu-ish", "mps"):
        with pytest.raises(ConfigError):
            resolve_device(bad)
    if not torch.cuda.is_available():
        for spec in ("cuda", "cuda:1"):
            with pytest.raises(ConfigError, match="CUDA is not available"):
                resolve_device(spec)


def test_move_batch_on_cpu_is_a_no_op() -> None:
    batch = torch.zeros(2, 3)
    assert move_batch(batch, CPU) is batch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_move_batch_to_cuda() -> None:
    device = resolve_device("cuda")
    moved = move_batch(torch.arange(6.0).view(2, 3), device)
    assert moved.device == device and moved.cpu().tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
