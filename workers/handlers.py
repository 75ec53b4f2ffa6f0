"""Model handlers: a request's bytes -> an item, items -> a batch -> outputs, each output -> JSON."""

from __future__ import annotations

import inspect
import json
import math
import struct
import sys
import warnings
from collections.abc import Mapping
from io import BytesIO
from typing import Any

import numpy as np
import orjson
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from inferq.shared.errors import ConfigError, InvalidInput, UnsupportedMedia
from inferq.shared.inputs.image import IMAGE_FORMATS, ShorterSide, check_png_chunks
from inferq.shared.models import ImageInput, ModelConfig, TensorInput
from inferq.workers.collation import move_batch, pad_sequences, split, stack, to_device
from inferq.workers.formats import DTYPES, import_object, load_model

__all__ = ["Handler", "finite_list", "load_handler", "move_batch", "pad_sequences", "resolve_device"]

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000

# What Pillow raises on corrupt or hostile files besides its own exception classes.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error)


class Handler:
    """How one model turns request payloads into results; the worker drives it.

    Lifecycle, as the worker calls it (one process, the model stays loaded):

    1. ``__init__(config, device)``: once per model; cheap, no weights yet.
    2. ``load()``: once. The default loads ``config.weights`` in ``config.format`` (export,
       safetensors, huggingface, onnx, torchscript) onto ``self.device`` in ``config.dtype``
       into ``self.model``. Errors here stop the worker at start with one readable line.
    3. ``preprocess(payload, content_type)``: per item, on the CPU. Returns ANY object: a tensor,
       a dict of tensors, token ids, a string. Raise ``InvalidInput`` (or ``UnsupportedMedia``)
       with a short message the client can read; it fails that item only.
    4. ``collate(items)``: per batch. Returns the batch in whatever form ``predict`` takes, on the
       device. The default stacks tensors and dicts of same-shape tensors (floating ones cast to
       the config's dtype) and passes anything else as a list; variable-length items call
       ``pad_sequences`` (right padding, a pad value per key, 0 for attention masks).
    5. ``predict(batch)``: per batch, under ``torch.inference_mode()``. The default calls
       ``self.model(batch)``, or ``self.model(**batch)`` for a dict.
    6. ``uncollate(outputs, n)``: one output per item; outputs may differ in size from item to
       item. The default splits tensors and dicts of tensors along the first axis (floats back to
       float32 on the CPU) and passes lists through. A count other than ``n`` fails the batch.
    7. ``postprocess(output)``: per item, returns JSON-able data; floats must be finite (use
       ``finite_list``), since results are stored as strict JSON.

    A batch that cannot be collated never runs at batch size 1: the worker isolates an item that
    cannot be collated even alone, and runs the rest in groups of the same shape (and warns).
    Out of memory in ``predict`` halves the batch and lowers the model's batch ceiling.

    A user handler is named in ``config.json`` as ``"handler": "my_pkg.handlers:Detector"``
    (``my_pkg`` must be importable by the worker). Here, outputs differ in size per item::

        import json
        from typing import Any

        import torch

        from inferq.shared.errors import InvalidInput
        from inferq.workers.handlers import Handler, finite_list, pad_sequences


        class Detector(Handler):
            # {"inputs": [x, ...]} in; every value over the threshold out.

            def load(self) -> None:
                self.model = lambda batch: [row[row > 0.5] for row in batch]  # anything callable works

            def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
                try:
                    return torch.tensor(json.loads(payload)["inputs"], dtype=torch.float32)
                except (ValueError, KeyError, TypeError) as exc:
                    raise InvalidInput(f'expected {{"inputs": [<number>, ...]}}: {exc}') from exc

            def collate(self, items: list[torch.Tensor]) -> torch.Tensor:
                return pad_sequences(items, pad_value=0.0)  # items differ in length

            def postprocess(self, output: torch.Tensor) -> dict[str, Any]:
                return {"boxes": finite_list(output)}  # a list of any length per item
    """

    # The transformers class a Hugging Face folder is loaded with, for this handler.
    auto_class = "AutoModel"
    # Modules of that class this handler never runs: a checkpoint may lack their weights (any other missing
    # weight refuses the folder, since transformers would fill it at random).
    unused_weights: frozenset[str] = frozenset()

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.dtype = DTYPES[config.dtype]
        self.model: Any = None

    def load(self) -> None:
        """Load the weights once onto the device."""
        self.model = load_model(self.config, self.device, self.auto_class, self.unused_weights)

    def preprocess(self, payload: bytes, content_type: str) -> Any:
        """One payload -> one item, on the CPU."""
        raise NotImplementedError

    def collate(self, items: list[Any]) -> Any:
        """Items -> the batch ``predict`` takes, on the device."""
        return to_device(stack(items), self.device, self.dtype)

    def predict(self, batch: Any) -> Any:
        """The batch -> the model's outputs for every item."""
        outputs = self.model(**batch) if isinstance(batch, dict) else self.model(batch)
        return primary_output(outputs)

    def uncollate(self, outputs: Any, n: int) -> list[Any]:
        """The batch's outputs -> one output per item."""
        return split(outputs, n)

    def postprocess(self, output: Any) -> Any:
        """One item's output -> a JSON-able object."""
        return {"output": finite_list(output)}

    def item_length(self, item: Any) -> int | None:
        """Tokens (or steps) an item takes, for ``max_batch_tokens``; None: not a sequence model."""
        return None

    def warmup_payload(self) -> tuple[bytes, str] | None:
        """A valid request payload and content type for warm-up runs and the check that the model batches; or None."""
        return None

    def run(self, payloads: list[tuple[bytes, str]]) -> list[Any]:
        """The whole lifecycle for a few payloads, without the worker's isolation: warm-up, scripts, peers."""
        items = [self.preprocess(payload, content_type) for payload, content_type in payloads]
        with torch.inference_mode():
            outputs = self.uncollate(self.predict(self.collate(items)), len(items))
        return [self.postprocess(output) for output in outputs]


def primary_output(outputs: Any) -> Any:
    """A Hugging Face ModelOutput's logits (or embedding), so built-in handlers see a tensor."""
    # transformers' ModelOutput is a dict with to_tuple(); checked by shape so torch-only models need no transformers.
    if isinstance(outputs, Mapping) and hasattr(outputs, "to_tuple"):
        for name in ("logits", "pooler_output"):
            value = getattr(outputs, name, None)
            if value is not None:
                return value
        hidden = getattr(outputs, "last_hidden_state", None)
        if hidden is not None:
            return hidden[:, 0]  # the first token's state: CLS for encoders
    return outputs


def finite_list(value: Any) -> Any:
    """A tensor (or dict or list of them) as nested Python lists, with NaN and infinities as None."""
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.float32 and value.device.type == "cpu":
            return _finite(value.tolist())  # what the general case gives, without three tensor calls
        return _finite(value.detach().float().cpu().tolist() if value.is_floating_point() else value.cpu().tolist())
    if isinstance(value, Mapping):
        return {str(key): finite_list(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite_list(item) for item in value]
    return _finite(value)


def _finite(value: Any) -> Any:
    if isinstance(value, list):
        try:
            if all(map(math.isfinite, value)):
                return value  # a row of finite numbers, checked in C: nothing to replace
        except (TypeError, OverflowError):  # nested lists, None, text; an int past a float's range
            pass
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _score(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


# Where Pillow's getexif() finds an orientation, for the formats read here (IMAGE_FORMATS): EXIF (JPEG, WEBP, a
# PNG's eXIf chunk), ImageMagick's raw profile in PNG text, and XMP. An image with none of them is upright, and
# exif_transpose (which parses them all, then copies or leaves the image) is skipped: 11.7% of a digit drain's
# main thread in a py-spy profile.
_ORIENTATION_SOURCES = frozenset({"exif", "Raw profile type exif", "XML:com.adobe.xmp", "xmp"})


class ImageClassifier(Handler):
    """An image in, class probabilities out."""

    def __init__(
        self, config: ModelConfig, device: torch.device, *, max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    ) -> None:
        super().__init__(config, device)
        if not isinstance(config.input, ImageInput):
            raise ConfigError(f"model {config.name!r}: handler {config.handler!r} needs an image input")
        self.input: ImageInput = config.input
        self.max_image_pixels = max_image_pixels
        channels = 1 if self.input.mode == "L" else 3
        stats = {"mean": self.input.mean, "std": self.input.std}
        for key, values in stats.items():
            if len(values) not in (1, channels):
                raise ConfigError(f"model {config.name!r}: input.{key} needs 1 or {channels} values")
        if any(s == 0 for s in self.input.std):
            raise ConfigError(f"model {config.name!r}: input.std must not contain 0")
        # (pixel / 255 - mean) / std as one multiply and one add, per channel, in the tensor's channel-first shape.
        mean = np.broadcast_to(np.asarray(self.input.mean, dtype=np.float64), (channels,))
        std = np.broadcast_to(np.asarray(self.input.std, dtype=np.float64), (channels,))
        self._scale = (1.0 / (255.0 * std)).astype(np.float32).reshape(channels, 1, 1)
        self._shift = (-mean / std).astype(np.float32).reshape(channels, 1, 1)

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        pixels = self.pixels(payload, content_type)
        out = np.empty(pixels.shape, dtype=np.float32)
        self.normalise_into(pixels, out)
        return torch.from_numpy(out)

    @property
    def pixel_shape(self) -> tuple[int, int, int]:
        """What ``pixels`` gives every image: channels, height, width."""
        height, width = self.input.size
        return (1 if self.input.mode == "L" else 3, height, width)

    def pixels(self, payload: bytes, content_type: str) -> np.ndarray:
        """The image decoded and resized: uint8, channel-first (a view of Pillow's pixels, height x width x
        channels). The worker normalises these straight into the batch (``workers.buffers``)."""
        pixels = np.asarray(resized(self._decode(payload), self.input, self.max_image_pixels))
        return pixels[np.newaxis] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)

    def normalise_into(self, pixels: np.ndarray, out: np.ndarray) -> None:
        """(pixel / 255 - mean) / std into ``out`` (float32, channel-first; a row of a batch, or an array of its own).
        Two passes, written once: scaled, then shifted. The same in numpy for an 8x8 digit (a torch op's dispatch
        costs more than its work there) and for a 224x224 image."""
        np.multiply(pixels, self._scale, out=out)
        out += self._shift

    def warmup_payload(self) -> tuple[bytes, str] | None:
        height, width = self.input.size
        buffer = BytesIO()
        Image.new(self.input.mode, (width, height), 128 if self.input.mode == "L" else (128, 128, 128)).save(
            buffer, format="PNG"
        )
        return buffer.getvalue(), "image/png"

    def _decode(self, payload: bytes) -> Image.Image:
        try:
            # Pillow only warns between its own limit and twice that; make it an error here.
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                check_png_chunks(payload)
                image: Image.Image = Image.open(BytesIO(payload), formats=IMAGE_FORMATS)
                # The size comes from the header: refuse before any pixel data is decoded.
                width, height = image.size
                limit = self.max_image_pixels
                if width * height > limit:
                    raise InvalidInput(f"image is too large: {width}x{height} pixels, over the limit of {limit}")
                image.load()  # the pixels, and (a PNG's eXIf may follow them) every key an orientation is read from
                if not _ORIENTATION_SOURCES.isdisjoint(image.info):
                    ImageOps.exif_transpose(image, in_place=True)  # not in place, an upright image is copied
                if image.mode == "P" and "transparency" in image.info:
                    image = image.convert("RGBA")  # P -> RGB with transparency warns otherwise
                # Converting to its own mode would be a copy.
                return image.convert(self.input.mode) if image.mode != self.input.mode else image
        except UnidentifiedImageError as exc:
            raise UnsupportedMedia("could not decode image: not a supported image format") from exc
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise InvalidInput("image is too large to decode safely") from exc
        except _DECODE_ERRORS as exc:
            raise InvalidInput(f"could not decode image: {exc}") from exc

    def postprocess(self, row: torch.Tensor) -> dict[str, Any]:
        probs = torch.softmax(row.detach().float().cpu().flatten(), dim=0)
        k = min(self.config.top_k, probs.numel())
        values, indices = torch.topk(probs, k)
        labels = self.config.labels
        top = [
            {"label": labels[i] if labels is not None and i < len(labels) else str(i), "score": _score(p)}
            for p, i in zip(values.tolist(), indices.tolist(), strict=True)
        ]
        return {"label": top[0]["label"], "score": top[0]["score"], "top_k": top}


_FILTERS = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
    "lanczos": Image.Resampling.LANCZOS,
}


def resized(image: Image.Image, spec: ImageInput, max_pixels: int) -> Image.Image:
    """``image`` brought to ``spec.size`` as ``spec.resize`` says: squashed, or torchvision's Resize of the shorter
    side and CenterCrop, with their arithmetic (torchvision.transforms.functional's ``resize`` and ``center_crop``
    on a PIL image, which call Pillow's ``resize`` and ``crop`` as here)."""
    height, width = spec.size
    how = spec.resize
    resample = _FILTERS[how.interpolation]
    if not isinstance(how, ShorterSide):
        # Pillow's resize to the same size is a copy.
        return image.resize((width, height), resample) if image.size != (width, height) else image
    w, h = image.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = how.shorter_side, int(how.shorter_side * long / short)  # truncated, as torchvision does
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    if new_w * new_h > max_pixels:
        raise InvalidInput(
            f"image is {w}x{h}: its shorter side scaled to {how.shorter_side} makes it {new_w}x{new_h} pixels, over"
            f" the limit of {max_pixels}"
        )
    if (new_w, new_h) != (w, h):  # torchvision leaves an image of the asked size alone
        image = image.resize((new_w, new_h), resample)
    # A side at least the crop's is cut at its centre offset rounded as Python rounds (half to even); a shorter one
    # is padded with black, (crop - side) // 2 before it, as torchvision pads: Pillow's crop past the edge is black.
    left = int(round((new_w - width) / 2.0)) if new_w >= width else -((width - new_w) // 2)
    top = int(round((new_h - height) / 2.0)) if new_h >= height else -((height - new_h) // 2)
    if (left, top, new_w, new_h) == (0, 0, width, height):
        return image
    return image.crop((left, top, left + width, top + height))


class ImageEmbedding(ImageClassifier):
    """An image in, an L2-normalized embedding vector out."""

    def postprocess(self, row: torch.Tensor) -> dict[str, Any]:
        vector = torch.nn.functional.normalize(row.detach().float().cpu().flatten(), dim=0)
        return {"embedding": finite_list(vector), "dim": vector.numel()}


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
_NP_DTYPES = {"float32": np.float32, "float64": np.float64, "int64": np.int64}
_INT64_RANGE = (-(2**63), 2**63 - 1)
# The largest magnitude each dtype holds (int64: its range, a value past it takes the slow path's error).
_LARGEST = {"float32": float(torch.finfo(torch.float32).max), "float64": sys.float_info.max, "int64": 2**63 - 1}


class TensorHandler(Handler):
    """A JSON array ``{"inputs": [...]}`` in, the raw output row out."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if not isinstance(config.input, TensorInput):
            raise ConfigError(f"model {config.name!r}: handler {config.handler!r} needs a tensor input")
        self.input: TensorInput = config.input

    def warmup_payload(self) -> tuple[bytes, str] | None:
        zeros: Any = 0
        for size in reversed(self.input.shape):
            zeros = [zeros] * size
        return json.dumps({"inputs": zeros}).encode(), "application/json"

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        media_type = content_type.split(";")[0].strip().lower()
        if media_type and media_type != "application/json" and not media_type.endswith("+json"):
            raise UnsupportedMedia(f"expected application/json, got {media_type}")
        try:
            body = orjson.loads(payload)  # strict JSON: no NaN/Infinity literals; a tenth of json's time here
        except orjson.JSONDecodeError:
            try:  # what orjson refuses that JSON allows (integers past 64 bits) gets the stdlib's parse and message
                # parse_constant rejects the NaN/Infinity literals Python's json accepts by default.
                body = json.loads(payload, parse_constant=_reject_constant)
            except (ValueError, RecursionError) as exc:
                raise InvalidInput(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict) or "inputs" not in body:
            raise InvalidInput('expected a JSON object {"inputs": <array>}')
        integer = self.input.dtype == "int64"
        shape = tuple(self.input.shape)
        if _well_formed(body["inputs"], shape, integer, _LARGEST[self.input.dtype]):
            # Every value fits the dtype: the tensor is finite, no check of it needed (the common case). Through
            # NumPy: a third of torch.tensor's time for a small list, the same values.
            return torch.from_numpy(np.array(body["inputs"], dtype=_NP_DTYPES[self.input.dtype]))
        _check_array(body["inputs"], shape, integer, "inputs")
        tensor = torch.tensor(body["inputs"], dtype=_DTYPES[self.input.dtype])
        # 1e39 is a finite JSON number but overflows float32.
        if not integer and not bool(torch.isfinite(tensor).all()):
            raise InvalidInput(f"inputs must be finite {self.input.dtype} numbers")
        return tensor


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


_INTEGER, _NUMBER = frozenset((int,)), frozenset((int, float))


def _well_formed(value: Any, shape: tuple[int, ...], integer: bool, largest: float) -> bool:
    """A quick yes for a nested list of exactly ``shape`` whose numbers all fit the dtype; no: ask _check_array.

    A no is not an error: _check_array and the tensor's own check then say what is wrong, if anything.
    """
    if not shape:
        return False
    rows = [value]
    for size in shape[:-1]:
        if any(type(row) is not list or len(row) != size for row in rows):
            return False
        rows = [item for row in rows for item in row]
    last = shape[-1]
    numbers = _INTEGER if integer else _NUMBER  # type() is exact: bool, a subclass of int, is refused
    for row in rows:
        # The types of a row gathered in C (a generator over the row was a tenth of a no-op worker's time).
        if type(row) is not list or len(row) != last or not numbers.issuperset(map(type, row)):
            return False
        # An infinity (JSON's 1e999) is larger than any limit; NaN never gets here (JSON refuses it).
        if row and (max(row) > largest or min(row) < -largest):
            return False
    return True


def _check_array(value: Any, shape: tuple[int, ...], integer: bool, where: str) -> None:
    """Check a nested list's shape and element types against the config, with a readable path."""
    if shape:
        if not isinstance(value, list) or len(value) != shape[0]:
            got = f"length {len(value)}" if isinstance(value, list) else type(value).__name__
            raise InvalidInput(f"{where}: expected an array of length {shape[0]}, got {got}")
        for i, item in enumerate(value):
            _check_array(item, shape[1:], integer, f"{where}[{i}]")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidInput(f"{where}: expected a number, got {type(value).__name__}")
    elif integer and not (isinstance(value, int) and _INT64_RANGE[0] <= value <= _INT64_RANGE[1]):
        raise InvalidInput(f"{where}: expected an int64 integer, got {value!r}")
    elif not integer and isinstance(value, float) and not math.isfinite(value):
        raise InvalidInput(f"{where}: expected a finite number, got {value!r}")


# Built-in handlers by config name; text handlers live in workers.text (they need transformers).
BUILTINS: dict[str, str] = {
    "image_classifier": "inferq.workers.handlers:ImageClassifier",
    "image_embedding": "inferq.workers.handlers:ImageEmbedding",
    "tensor": "inferq.workers.handlers:TensorHandler",
    "text_classifier": "inferq.workers.text:TextClassifier",
    "text_embedding": "inferq.workers.text:TextEmbedding",
}


def load_handler(config: ModelConfig, device: torch.device, **kwargs: Any) -> Handler:
    """The handler a config names, built-in or ``package.module:ClassName``; weights not loaded yet."""
    spec = BUILTINS.get(config.handler, config.handler)
    cls = import_object(spec, f"model {config.name!r}: handler")
    if not (isinstance(cls, type) and issubclass(cls, Handler)):
        raise ConfigError(
            f"model {config.name!r}: handler {spec!r} is not a subclass of inferq.workers.handlers.Handler"
        )
    # The worker passes the same options to every model; each handler takes only those it declares.
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {key: value for key, value in kwargs.items() if key in params}
    return cls(config, device, **kwargs)


def resolve_device(spec: str) -> torch.device:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` -> a device this machine has."""
    spec = spec.strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(spec)
    except RuntimeError as exc:
        raise ConfigError(f"unknown device {spec!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        raise ConfigError(f"unsupported device {spec!r}: use auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ConfigError(f"device {spec!r} requested but CUDA is not available")
    index = device.index or 0
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device {spec!r} requested but only {torch.cuda.device_count()} GPU(s) exist")
    return torch.device("cuda", index)
