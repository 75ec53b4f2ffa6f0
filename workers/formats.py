"""Loading a model's weights in the format its config names; every failure is one readable ConfigError.

export       a ``torch.export`` program (``torch.export.save``, ``.pt2``) with a dynamic batch axis
safetensors  a ``.safetensors`` file plus ``"module": "pkg.mod:factory"`` that builds the ``nn.Module``
huggingface  a ``save_pretrained`` folder, loaded with ``transformers`` from that folder only
onnx         an ONNX graph run by ``onnxruntime`` (the ``onnx`` extra)
torchscript  ``torch.jit.save`` output; deprecated upstream, kept for existing users
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from inferq.shared.errors import ConfigError
from inferq.shared.models import ModelConfig

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# How many of a checkpoint's missing weights a start-up error names.
_MISSING_SHOWN = 6


def load_model(
    config: ModelConfig,
    device: torch.device,
    auto_class: str = "AutoModel",
    unused_weights: frozenset[str] = frozenset(),
) -> Any:
    """The model a config names, on ``device`` in the config's dtype, ready for inference.

    ``auto_class`` is the ``transformers`` class a handler wants for Hugging Face folders; ``unused_weights`` names
    its modules that the handler never runs (``pooler``), which a checkpoint may lack.
    """
    where = f"model {config.name!r}"
    path = config.weights_path
    if config.format == "huggingface":
        if not path.is_dir():
            raise ConfigError(f"{where}: weights folder {path} does not exist (the output of save_pretrained)")
    elif not path.is_file():
        raise ConfigError(f"{where}: weights file {path} does not exist")
    try:
        if config.format == "huggingface":
            model = _huggingface(config, path, auto_class, unused_weights)
        else:
            model = _LOADERS[config.format](config, path, device)
    except ConfigError:
        raise
    except Exception as exc:  # torch, onnxruntime and transformers raise many kinds for a bad file
        raise ConfigError(f"{where}: cannot load {path} as {config.format}: {_first_line(exc)}") from exc
    if config.format != "onnx":
        model = _place(model, device, DTYPES[config.dtype])
    if config.compile:
        model = torch.compile(model)
    return model


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0][:300]}" if lines else type(exc).__name__


def _place(model: Any, device: torch.device, dtype: torch.dtype) -> Any:
    if isinstance(model, torch.nn.Module):
        model = model.to(device)
        if dtype != torch.float32:
            model = model.to(dtype)
    return model


def save_export(module: torch.nn.Module, example: Any, path: Path | str) -> None:
    """Write ``module`` as a ``torch.export`` program whose first axis (the batch) is dynamic: format "export".

    ``example`` is one batch as ``predict`` passes it: a tensor, a tuple of tensors, or a dict of
    named tensors (a tokenizer's output, for instance).
    """
    batch = torch.export.Dim("batch", min=1, max=65_536)
    module = module.eval()
    if isinstance(example, Mapping):
        args: tuple[Any, ...] = ()
        kwargs = dict(example)
        dynamic: Any = {name: {0: batch} for name in kwargs}
    else:
        args = example if isinstance(example, tuple) else (example,)
        kwargs = {}
        dynamic = tuple({0: batch} for _ in args)
    with torch.no_grad():
        program = torch.export.export(module, args, kwargs, dynamic_shapes=dynamic)
    torch.export.save(program, str(path))


def _export(config: ModelConfig, path: Path, device: torch.device) -> Any:
    # .module() is a GraphModule already traced in eval mode; it refuses .eval().
    return torch.export.load(str(path)).module()


def _torchscript(config: ModelConfig, path: Path, device: torch.device) -> Any:
    return torch.jit.load(str(path), map_location=device).eval()


def _safetensors(config: ModelConfig, path: Path, device: torch.device) -> Any:
    from safetensors.torch import load_file

    assert config.module is not None  # load_model_config insists on it for this format
    factory = import_object(config.module, f"model {config.name!r}: module")
    module = factory()
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(f"model {config.name!r}: {config.module} returned {type(module).__name__}, not an nn.Module")
    state = load_file(str(path), device="cpu")
    try:
        module.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        raise ConfigError(
            f"model {config.name!r}: the weights in {path} do not fit {config.module}: {_mismatch(exc)}"
        ) from exc
    return module.eval()


def _mismatch(exc: RuntimeError) -> str:
    # load_state_dict lists missing keys, unexpected keys and size mismatches on separate lines.
    text = " ".join(line.strip() for line in str(exc).splitlines()[1:] if line.strip())
    return text[:400] or str(exc)[:400]


def _huggingface(config: ModelConfig, path: Path, auto_class: str, unused_weights: frozenset[str]) -> Any:
    import transformers

    transformers.utils.logging.disable_progress_bar()  # a worker's log is not a terminal
    cls = getattr(transformers, auto_class)
    # local_files_only: a folder is all we read; the hub is never asked, even for a missing file.
    model, info = cls.from_pretrained(
        str(path), local_files_only=True, dtype=DTYPES[config.dtype], output_loading_info=True
    )
    # transformers initialises what the checkpoint lacks at random (a classifier's head, say) and only warns:
    # such a model answers differently at every start.
    missing = sorted(key for key in info["missing_keys"] if not unused_weights & set(key.split(".")))
    if missing:
        shown = ", ".join(missing[:_MISSING_SHOWN]) + (
            f" and {len(missing) - _MISSING_SHOWN} more" if len(missing) > _MISSING_SHOWN else ""
        )
        raise ConfigError(
            f"model {config.name!r}: {path} has no weights for {shown}: {auto_class} would fill them at random, "
            "differently at every start; save the trained model there (save_pretrained), or serve the checkpoint "
            "with a handler that does not need them"
        )
    return model.eval()


def _onnx(config: ModelConfig, path: Path, device: torch.device) -> Any:
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            f"model {config.name!r}: format 'onnx' needs onnxruntime: pip install 'inferq[onnx]'"
        ) from None
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.type == "cuda":
        providers.insert(0, ("CUDAExecutionProvider", {"device_id": device.index or 0}))
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers are noise in a worker's log
    session = onnxruntime.InferenceSession(str(path), sess_options=options, providers=providers)
    return OnnxModel(session)


class OnnxModel:
    """An onnxruntime session called like a torch model: a tensor or named tensors in, tensors out."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        feeds = dict(zip(self.input_names, args, strict=False))
        feeds.update(kwargs)
        if len(args) == 1 and isinstance(args[0], Mapping):
            feeds = dict(args[0])
        unknown = set(feeds) - set(self.input_names)
        if unknown:
            raise ValueError(f"the ONNX graph has no input(s) {sorted(unknown)}; it takes {self.input_names}")
        arrays = {name: value.detach().cpu().numpy() for name, value in feeds.items()}
        outputs = [torch.from_numpy(o) for o in self.session.run(None, arrays)]
        return outputs[0] if len(outputs) == 1 else dict(zip(self.output_names, outputs, strict=True))


_LOADERS: dict[str, Callable[[ModelConfig, Path, torch.device], Any]] = {
    "export": _export,
    "torchscript": _torchscript,
    "safetensors": _safetensors,
    "onnx": _onnx,
}


def import_object(spec: str, what: str) -> Any:
    """``package.module:name`` -> the object, or a ConfigError that says which part is wrong."""
    module_name, _, name = spec.partition(":")
    if not module_name or not name:
        raise ConfigError(f"{what} {spec!r} must be 'package.module:name'")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # a user's module can fail to import in any way
        raise ConfigError(f"{what} {spec!r}: cannot import {module_name}: {_first_line(exc)}") from exc
    found = getattr(module, name, None)
    if found is None:
        raise ConfigError(f"{what} {spec!r}: {module_name} has no {name!r}")
    return found


def load_tokenizer(config: ModelConfig) -> Any:
    """The tokenizer saved beside the model: the Hugging Face folder, or the config's ``tokenizer`` path."""
    from transformers import AutoTokenizer

    folder = config.path / config.tokenizer if config.tokenizer else config.weights_path
    if not folder.exists():
        raise ConfigError(f"model {config.name!r}: tokenizer {folder} does not exist")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:
        raise ConfigError(f"model {config.name!r}: cannot load the tokenizer in {folder}: {_first_line(exc)}") from exc
    # Without its files, transformers still builds the tokenizer config.json names, with only its special
    # tokens: every word becomes the unknown token, and every text the same input.
    special = set(tokenizer.all_special_tokens)
    if set(tokenizer.get_vocab()) <= special:
        raise ConfigError(
            f"model {config.name!r}: the tokenizer in {folder} knows no words, only its {len(special)} special tokens "
            "(are its files missing? save_pretrained writes tokenizer.json or vocab.txt): every text would read as "
            "unknown words and get the same result; save the model's tokenizer there (tokenizer.save_pretrained) "
            'or name its folder in the config\'s "tokenizer"'
        )
    return tokenizer
