"""The model repository: one folder per model under ``models_dir``, each with a ``config.json``.

This module reads configs only; it never imports torch (the API uses it too).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from inferq.shared.errors import ConfigError

# Re-exported: handlers and tests name the input classes from here.
from inferq.shared.inputs import ImageInput as ImageInput
from inferq.shared.inputs import Input
from inferq.shared.inputs import JsonInput as JsonInput
from inferq.shared.inputs import TensorInput as TensorInput
from inferq.shared.inputs import TextInput as TextInput
from inferq.shared.keys import MODEL_NAME_RE

BUILTIN_HANDLERS = ("image_classifier", "image_embedding", "tensor", "text_classifier", "text_embedding")
# How the weights are stored; a config without "format" keeps the original TorchScript loading.
Format = Literal["export", "safetensors", "huggingface", "onnx", "torchscript"]


class ModelConfig(BaseModel):
    """One model's ``config.json``; ``name`` and ``path`` come from its folder."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    name: str = ""
    path: Path = Path()
    description: str = ""
    # A built-in handler name, or "package.module:ClassName" for a user's own handler.
    handler: str = "image_classifier"
    format: Format = "torchscript"
    # A file (or, for "huggingface", a folder written by save_pretrained) inside the model's folder.
    weights: str = "model.pt"
    # "package.module:factory" building the nn.Module that a safetensors file's weights fit.
    module: str | None = None
    # Text handlers: the tokenizer's folder (save_pretrained output) when it is not the weights folder.
    tokenizer: str | None = None
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    compile: bool = False
    # Run one batch at start so the first client's job does not pay for lazy initialisation.
    warmup: bool = False
    input: Input
    labels: list[str] | None = None
    top_k: int = Field(default=5, ge=1)
    max_batch: int = Field(default=32, ge=1, le=4096)
    # Sequence models: split a popped batch into sub-batches of similar length, each at most this
    # many tokens once padded, so one long text does not make many short ones pay for its padding.
    max_batch_tokens: int | None = Field(default=None, ge=1)
    retries: int | None = Field(default=None, ge=0, le=10)
    max_queue_length: int | None = Field(default=None, ge=1)
    device: str = "auto"
    # The Redis deployment that carries this model's queues and jobs: a name of INFERQ_REDIS_SHARDS (shared/shards.py);
    # absent, INFERQ_REDIS_URL's.
    redis: str | None = Field(default=None, pattern=r"^[a-z][a-z0-9]{0,15}$")

    @property
    def weights_path(self) -> Path:
        return self.path / self.weights


def load_model_config(folder: Path) -> ModelConfig:
    """Read and check one model folder's config."""
    name = folder.name
    if not MODEL_NAME_RE.match(name):
        raise ConfigError(f"model folder name {name!r} must match {MODEL_NAME_RE.pattern}")
    config_file = folder / "config.json"
    try:
        raw = json.loads(config_file.read_text())
        config = ModelConfig.model_validate({**raw, "name": name, "path": folder})
    except ValidationError as exc:
        raise ConfigError(f"{config_file}: {_one_line(exc)}") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{config_file}: {exc}") from None
    if config.handler not in BUILTIN_HANDLERS and ":" not in config.handler:
        raise ConfigError(
            f"{config_file}: handler must be one of {BUILTIN_HANDLERS} or 'module:Class', got {config.handler!r}"
        )
    if config.format == "safetensors" and not config.module:
        raise ConfigError(f'{config_file}: format \'safetensors\' needs "module": "package.module:factory"')
    if config.module and config.format != "safetensors":
        raise ConfigError(f"{config_file}: \"module\" applies only to format 'safetensors'")
    if config.format == "onnx" and (config.compile or config.dtype != "float32"):
        raise ConfigError(f'{config_file}: "compile" and "dtype" apply to torch formats; ONNX graphs fix their own')
    return config


def _one_line(exc: ValidationError) -> str:
    """Pydantic's report as one line a person can act on: where, what, and the value given."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "config"
        given = f" (got {error['input']!r})" if error["type"] not in ("missing",) and "input" in error else ""
        parts.append(f"{where}: {error['msg']}{given}"[:300])
    return "; ".join(parts)


class ModelRepository(dict[str, ModelConfig]):
    """The models that loaded, by name; ``invalid`` maps each folder whose config did not to its error."""

    def __init__(self, configs: dict[str, ModelConfig], invalid: dict[str, str]) -> None:
        super().__init__(configs)
        self.invalid = invalid


def load_model_configs(models_dir: Path, redis_shards: Collection[str] = ()) -> ModelRepository:
    """Every model in the repository, by name; a config that fails its checks is left out, with its error.

    One broken folder must not stop every other model: callers report ``invalid`` and serve the rest. A model
    placed on a Redis that ``redis_shards`` (INFERQ_REDIS_SHARDS's names) does not define is invalid too.
    """
    if not models_dir.is_dir():
        raise ConfigError(f"models directory {models_dir} does not exist")
    configs: dict[str, ModelConfig] = {}
    invalid: dict[str, str] = {}
    for folder in sorted(models_dir.iterdir()):
        if not (folder / "config.json").is_file():
            continue
        try:
            config = load_model_config(folder)
        except ConfigError as exc:
            invalid[folder.name] = exc.message
            continue
        if config.redis is not None and config.redis not in redis_shards:
            known = ", ".join(sorted(redis_shards)) or "none"
            where = folder / "config.json"
            invalid[folder.name] = f"{where}: redis: {config.redis!r} is not in INFERQ_REDIS_SHARDS (it has: {known})"
            continue
        configs[folder.name] = config
    return ModelRepository(configs, invalid)
