"""Model handlers: turn one request's bytes into a tensor, run a batch, turn each output row into JSON."""

from __future__ import annotations

import importlib
import inspect
import json
import math
import struct
import warnings
from io import BytesIO
from typing import Any

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError

from shared.errors import ConfigError, InvalidInput, UnsupportedMedia
from shared.models import ImageInput, ModelConfig, TensorInput

DEFAULT_MAX_IMAGE_PIXELS = 40_000_000

# What Pillow raises on corrupt or hostile files besides its own exception classes.
_DECODE_ERRORS = (OSError, ValueError, SyntaxError, EOFError, IndexError, struct.error)


class Handler:
    """How one model turns request payloads into results; the worker drives it.

    Lifecycle, as the worker calls it:

    1. ``__init__(config, device)``: once per model; cheap, no weights yet.
    2. ``load()``: once, loads the weights onto ``self.device`` into ``self.model``. The
       default loads TorchScript from ``config.weights_path`` and puts it in eval mode.
    3. ``preprocess(payload, content_type)``: per request. Returns ONE item as a CPU tensor
       without a batch axis, so that items can be stacked. Raises ``InvalidInput`` (or
       ``UnsupportedMedia``) with a short message the client can read; anything else is
       treated as a bug in the handler.
    4. ``predict(batch)``: per batch. ``batch`` is the stacked items, already on the device;
       it runs under ``torch.inference_mode()`` and returns one output row per input.
    5. ``postprocess(row)``: per item. One output row becomes a JSON-able object; floats
       must be finite (use ``finite_list``), since results are stored as strict JSON.

    A user handler is named in ``config.json`` as ``"handler": "my_pkg.handlers:Doubler"``
    (``my_pkg`` must be importable by the worker)::

        import json
        from typing import Any

        import torch

        from shared.errors import InvalidInput
        from workers.handlers import Handler, finite_list


        class Doubler(Handler):
            def load(self) -> None:
                self.model = lambda batch: batch * 2  # no weights: anything callable works

            def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
                try:
                    return torch.tensor(float(json.loads(payload)["x"]))
                except (ValueError, KeyError, TypeError) as exc:
                    raise InvalidInput(f'expected {{"x": <number>}}: {exc}') from exc

            def postprocess(self, row: torch.Tensor) -> dict[str, Any]:
                return {"doubled": finite_list(row)}
    """

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        self.config = config
        self.device = device
        self.model: Any = None

    def load(self) -> None:
        """Load the TorchScript weights once onto the device."""
        path = self.config.weights_path
        if not path.is_file():
            raise ConfigError(f"model {self.config.name!r}: weights file {path} does not exist")
        self.model = torch.jit.load(str(path), map_location=self.device).eval()

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        """One payload -> one CPU tensor without a batch axis."""
        raise NotImplementedError

    def predict(self, batch: torch.Tensor) -> torch.Tensor:
        """A stacked batch on the device -> one output row per input."""
        with torch.inference_mode():
            return self.model(batch)

    def postprocess(self, row: torch.Tensor) -> Any:
        """One output row -> a JSON-able object."""
        return {"output": finite_list(row)}


def finite_list(row: torch.Tensor) -> Any:
    """A tensor as nested Python lists (or a scalar), with NaN and infinities as None."""
    return _finite(row.detach().cpu().tolist())


def _finite(value: Any) -> Any:
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _score(value: float) -> float | None:
    return round(value, 6) if math.isfinite(value) else None


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
        self._mean = torch.tensor(self.input.mean, dtype=torch.float32).view(-1, 1, 1)
        self._std = torch.tensor(self.input.std, dtype=torch.float32).view(-1, 1, 1)

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        image = self._decode(payload)
        height, width = self.input.size
        image = image.resize((width, height), Image.Resampling.BOX)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0)
        pixels = pixels.unsqueeze(0) if pixels.ndim == 2 else pixels.permute(2, 0, 1)
        return ((pixels - self._mean) / self._std).contiguous()

    def _decode(self, payload: bytes) -> Image.Image:
        try:
            # Pillow only warns between its own limit and twice that; make it an error here.
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                image: Image.Image = Image.open(BytesIO(payload))
                # The size comes from the header: refuse before any pixel data is decoded.
                width, height = image.size
                limit = self.max_image_pixels
                if width * height > limit:
                    raise InvalidInput(f"image is too large: {width}x{height} pixels, over the limit of {limit}")
                image = ImageOps.exif_transpose(image)
                if image.mode == "P" and "transparency" in image.info:
                    image = image.convert("RGBA")  # P -> RGB with transparency warns otherwise
                return image.convert(self.input.mode)
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


class ImageEmbedding(ImageClassifier):
    """An image in, an L2-normalized embedding vector out."""

    def postprocess(self, row: torch.Tensor) -> dict[str, Any]:
        vector = torch.nn.functional.normalize(row.detach().float().cpu().flatten(), dim=0)
        return {"embedding": finite_list(vector), "dim": vector.numel()}


_DTYPES = {"float32": torch.float32, "float64": torch.float64, "int64": torch.int64}
_INT64_RANGE = (-(2**63), 2**63 - 1)


class TensorHandler(Handler):
    """A JSON array ``{"inputs": [...]}`` in, the raw output row out."""

    def __init__(self, config: ModelConfig, device: torch.device) -> None:
        super().__init__(config, device)
        if not isinstance(config.input, TensorInput):
            raise ConfigError(f"model {config.name!r}: handler {config.handler!r} needs a tensor input")
        self.input: TensorInput = config.input

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        media_type = content_type.split(";")[0].strip().lower()
        if media_type and media_type != "application/json" and not media_type.endswith("+json"):
            raise UnsupportedMedia(f"expected application/json, got {media_type}")
        try:
            # parse_constant rejects the NaN/Infinity literals Python's json accepts by default.
            body = json.loads(payload, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise InvalidInput(f"body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict) or "inputs" not in body:
            raise InvalidInput('expected a JSON object {"inputs": <array>}')
        integer = self.input.dtype == "int64"
        _check_array(body["inputs"], tuple(self.input.shape), integer, "inputs")
        tensor = torch.tensor(body["inputs"], dtype=_DTYPES[self.input.dtype])
        # 1e39 is a finite JSON number but overflows float32.
        if not integer and not bool(torch.isfinite(tensor).all()):
            raise InvalidInput(f"inputs must be finite {self.input.dtype} numbers")
        return tensor


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")


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


BUILTINS: dict[str, type[Handler]] = {
    "image_classifier": ImageClassifier,
    "image_embedding": ImageEmbedding,
    "tensor": TensorHandler,
}


def load_handler(config: ModelConfig, device: torch.device, **kwargs: Any) -> Handler:
    """The handler a config names, built-in or ``package.module:ClassName``; weights not loaded yet."""
    cls = BUILTINS.get(config.handler) or _import_handler(config.handler)
    # The worker passes the same options to every model; each handler takes only those it declares.
    params = inspect.signature(cls).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        kwargs = {key: value for key, value in kwargs.items() if key in params}
    return cls(config, device, **kwargs)


def _import_handler(spec: str) -> type[Handler]:
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"handler {spec!r} must be a built-in name or 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"handler {spec!r}: cannot import {module_name}: {exc}") from exc
    cls = getattr(module, class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Handler)):
        raise ConfigError(f"handler {spec!r} is not a subclass of workers.handlers.Handler")
    return cls


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


def move_batch(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Put a CPU batch on the device; pinned memory lets the copy to a GPU overlap other work."""
    if device.type != "cuda" or batch.device == device:
        return batch
    return batch.pin_memory().to(device, non_blocking=True)
