"""The model repository: one folder per model under ``models_dir``, each with a ``config.json``.

A model may hold versions, as a Triton user would lay them out: numbered sub-folders (``1/``, ``2/``…), each with
its own weights and, optionally, a ``config.json`` of fields that override the model's for that version. A folder
without numbered sub-folders is version 1, its weights beside its config; so is one whose weights are beside its
config while it has no ``1/`` (``folder_versions``): a new version is one new folder. Each version is served
apart, under its *served name* (``served_name``): the model's name for version 1 (so every existing queue, metric
and worker keeps its name), ``<model>@<version>`` for the others. The repository is keyed by served names.

This module reads configs only; it never imports torch (the API uses it too).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from inferq.shared.errors import ConfigError

# Re-exported: handlers and tests name the input classes from here.
from inferq.shared.inputs import ImageInput as ImageInput
from inferq.shared.inputs import Input
from inferq.shared.inputs import JsonInput as JsonInput
from inferq.shared.inputs import TensorInput as TensorInput
from inferq.shared.inputs import TextInput as TextInput
from inferq.shared.keys import MODEL_NAME_RE
from inferq.shared.keys import served_name as served_name
from inferq.shared.keys import split_served as split_served

BUILTIN_HANDLERS = ("image_classifier", "image_embedding", "tensor", "text_classifier", "text_embedding")
# How the weights are stored; a config without "format" keeps the original TorchScript loading.
Format = Literal["export", "safetensors", "huggingface", "onnx", "torchscript"]


# A version sub-folder's name: a positive number, as Triton names them.
VERSION_RE = re.compile(r"^[1-9][0-9]{0,8}$")


class Rollback(BaseModel):
    """When a version of a model with several is rolled back by the system itself: its share set to zero once more
    than ``max_failure_rate`` of its last ``window`` jobs failed (judged from ``min_jobs`` on)."""

    model_config = ConfigDict(extra="forbid")
    max_failure_rate: float = Field(default=0.1, gt=0, lt=1)
    window: int = Field(default=100, ge=10, le=10_000)
    min_jobs: int = Field(default=50, ge=1, le=10_000)


# What a rollout's numbers may be, checked before anything is stored (and again when a stored one is read): a version
# as its folder is named, a share or a step in percent, and a ramp's step between a second and a day. A number past
# these (an interval of 5e-324 s, an infinite share) has no meaning, and the arithmetic of the routing would fail on it.
MAX_VERSION = 999_999_999
Percent = Annotated[float, Field(ge=0, le=100, allow_inf_nan=False)]
MIN_STEP_S = 1.0
MAX_STEP_S = 86_400.0
# Steps of a ramp, versions in a traffic map: far more than any rollout has, few enough to read on every submit.
MAX_ENTRIES = 100


class Ramp(BaseModel):
    """A version's share of unpinned submits stepped up over time, from when it first served: ``steps`` percent, one
    step every ``interval_s`` (the last step holds); the other versions share the rest as they would without it."""

    model_config = ConfigDict(extra="forbid")
    version: int = Field(ge=1, le=MAX_VERSION)
    # Percent, 0 to 100, one per step.
    steps: list[Percent] = Field(min_length=1, max_length=MAX_ENTRIES)
    interval_s: float = Field(default=60.0, ge=MIN_STEP_S, le=MAX_STEP_S, allow_inf_nan=False)

    def share(self, since_s: float) -> float:
        """The ramped version's share (0 to 1) ``since_s`` seconds after it first served."""
        return self.steps[min(int(max(since_s, 0.0) // self.interval_s), len(self.steps) - 1)] / 100.0


class Rollout(BaseModel):
    """How submits that name no version are shared between a model's versions (the model's own config.json only)."""

    model_config = ConfigDict(extra="forbid")
    # null: no automatic rollback.
    rollback: Rollback | None = Rollback()
    ramp: Ramp | None = None
    # Percent of unpinned submits per version; versions not listed get none. Absent: the highest version that has a
    # live worker takes them all (the next one down while it has none), as Triton's "latest" policy.
    traffic: dict[int, float] | None = None

    @field_validator("traffic")
    @classmethod
    def _shares(cls, traffic: dict[int, float] | None) -> dict[int, float] | None:
        if traffic is None:
            return None
        if len(traffic) > MAX_ENTRIES:
            raise ValueError(f"traffic names at most {MAX_ENTRIES} versions")
        versions_ok = all(1 <= v <= MAX_VERSION for v in traffic)
        shares_ok = all(0 <= s <= 100 for s in traffic.values())  # False for NaN too
        if not versions_ok or not shares_ok or sum(traffic.values()) <= 0:
            raise ValueError("traffic maps versions (1, 2, ...) to percents from 0 to 100, some share > 0")
        return traffic


class ModelConfig(BaseModel):
    """One model version's config: its model's ``config.json`` with the version folder's over it; ``name``,
    ``version`` and ``path`` (the folder its weights are in) come from the folders."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())
    name: str = ""
    version: int = 1
    path: Path = Path()
    rollout: Rollout | None = None
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
    # An image model's layout: "auto" times both at the batch ceiling on the CPU and keeps the faster
    # (workers/running.py choose_layout).
    memory_format: Literal["auto", "contiguous", "channels_last"] = "auto"
    # An exported graph on the CPU: batch norms folded into their convolutions and convolutions run with their ReLU
    # as one oneDNN call. "auto" times both at the batch ceiling and keeps the faster; "on" keeps the rewrite
    # whenever its outputs match (workers/running.py choose_layout).
    fuse: Literal["auto", "on", "off"] = "auto"
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

    @property
    def served(self) -> str:
        return served_name(self.name, self.version)

    @property
    def rollback(self) -> Rollback | None:
        """When this version is rolled back (``Rollout.rollback``; the defaults without a rollout)."""
        return self.rollout.rollback if self.rollout is not None else Rollback()


def version_folders(folder: Path) -> dict[int, Path]:
    """A model folder's version sub-folders by number; empty for a model without versions (its version 1 is the
    folder itself)."""
    return {int(sub.name): sub for sub in sorted(folder.iterdir()) if sub.is_dir() and VERSION_RE.match(sub.name)}


def folder_versions(folder: Path) -> list[int | None]:
    """The versions a model folder holds, as ``load_model_config`` takes them: each numbered sub-folder, and the
    folder itself (None) as version 1 when it has no ``1/`` but holds the weights its config names, so a version 2
    is added beside the weights that serve today with one new folder, and retired by removing them. A folder
    without numbered sub-folders is version 1 whatever it holds (its missing weights are the worker's error)."""
    numbered: list[int | None] = list(version_folders(folder))
    if not numbered:
        return [None]
    if 1 not in numbered and _own_weights(folder):
        return [None, *numbered]
    return numbered


def _own_weights(folder: Path) -> bool:
    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        # Unreadable (a typo, a half-written file): which weights it names is unknown, so version 1 is kept in the
        # listing, as invalid with the config's error, rather than read as removed (its worker would be drained).
        return True
    weights = raw.get("weights", "model.pt") if isinstance(raw, dict) else None
    return isinstance(weights, str) and bool(weights) and (folder / weights).exists()


def load_model_config(folder: Path, version: int | None = None) -> ModelConfig:
    """Read and check one model folder's config: of its version ``version`` (a numbered sub-folder, its config.json
    over the model's), or of the folder itself (version 1 of a model without versions)."""
    name = folder.name
    if not MODEL_NAME_RE.match(name):
        raise ConfigError(f"model folder name {name!r} must match {MODEL_NAME_RE.pattern}")
    config_file = folder / "config.json"
    path = folder if version is None else folder / str(version)
    try:
        raw = json.loads(config_file.read_text())
        if not isinstance(raw, dict):
            raise ValueError("the config is not a JSON object")
        raw.pop("version", None)
        if version is not None and (path / "config.json").is_file():
            config_file = path / "config.json"
            override = json.loads(config_file.read_text())
            if not isinstance(override, dict):
                raise ValueError("the config is not a JSON object")
            if "rollout" in override:
                raise ValueError("rollout is the model's, in its own config.json, not a version's")
            raw |= {k: v for k, v in override.items() if k != "version"}
        config = ModelConfig.model_validate({**raw, "name": name, "version": version or 1, "path": path})
    except ValidationError as exc:
        raise ConfigError(f"{config_file}: {one_line(exc)}") from None
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


def one_line(exc: ValidationError) -> str:
    """Pydantic's report as one line a person can act on: where, what, and the value given."""
    parts = []
    for error in exc.errors(include_url=False):
        where = ".".join(str(p) for p in error["loc"]) or "config"
        given = f" (got {error['input']!r})" if error["type"] not in ("missing",) and "input" in error else ""
        parts.append(f"{where}: {error['msg']}{given}"[:300])
    return "; ".join(parts)


def weights_sha256(config: ModelConfig) -> str:
    """The SHA-256 of a version's weights: the file's bytes; for a folder (Hugging Face's save_pretrained), every
    file's path and bytes in path order. Read once per worker start, never on a request."""
    digest = hashlib.sha256()
    path = config.weights_path
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(file.relative_to(path).as_posix().encode() + b"\0")
        with file.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


class ModelRepository(dict[str, ModelConfig]):
    """The model versions that loaded, by served name (``served_name``); ``invalid`` maps each folder (or version,
    by served name) whose config did not to its error. A version in both serves its last good config
    (``keep_last_good``)."""

    def __init__(self, configs: dict[str, ModelConfig], invalid: dict[str, str]) -> None:
        super().__init__(configs)
        self.invalid = invalid

    def models(self) -> list[str]:
        """The models' names, each once."""
        return sorted({config.name for config in self.values()})

    def versions(self, model: str) -> dict[int, ModelConfig]:
        """A model's versions that loaded, by number (empty for an unknown model)."""
        return {c.version: c for c in sorted(self.values(), key=lambda c: c.version) if c.name == model}


def keep_last_good(fresh: ModelRepository, before: Mapping[str, ModelConfig]) -> tuple[ModelRepository, list[str]]:
    """``fresh``, with each version whose config is invalid now but loaded ``before`` kept as it was, and those kept.

    A typo in a serving model's config.json must not take it offline: its last good config serves (and its worker
    with it) until the file is fixed, while ``invalid`` says what is wrong. The API's repository and ``inferq up``'s
    workers follow this one rule."""
    kept = sorted(name for name in fresh.invalid if name in before and name not in fresh)
    if not kept:
        return fresh, []
    return ModelRepository({**fresh, **{name: before[name] for name in kept}}, fresh.invalid), kept


def repository_signature(models_dir: Path) -> tuple[tuple[str, int, int], ...]:
    """What changes when a model, a version or a config is added, changed or removed: each config.json's path, mtime
    and size, and each model and version folder (a few stat calls per model; no weights are read)."""
    if not models_dir.is_dir():
        return ()
    seen: list[tuple[str, int, int]] = []
    for folder in sorted(models_dir.iterdir()):
        config = folder / "config.json"
        if not config.is_file():
            continue
        for path in [config, *(v / "config.json" for v in version_folders(folder).values())]:
            try:
                stat = path.stat()
                seen.append((str(path.relative_to(models_dir)), stat.st_mtime_ns, stat.st_size))
            except OSError:
                seen.append((str(path.relative_to(models_dir)), 0, -1))  # a version folder without its own config
        seen.append((f"{folder.name} serves its own weights", int(None in folder_versions(folder)), 0))
    return tuple(seen)


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
        for version in folder_versions(folder):
            served = served_name(folder.name, version or 1)
            try:
                config = load_model_config(folder, version)
            except ConfigError as exc:
                invalid[served] = exc.message
                continue
            if config.redis is not None and config.redis not in redis_shards:
                known = ", ".join(sorted(redis_shards)) or "none"
                where = folder / "config.json"
                invalid[served] = f"{where}: redis: {config.redis!r} is not in INFERQ_REDIS_SHARDS (it has: {known})"
                continue
            configs[served] = config
    for name in {c.name for c in configs.values()}:
        placed = {c.redis for c in configs.values() if c.name == name}
        if len(placed) > 1:  # a model's versions share its Redis: a job's ID leads to one place
            for served in [s for s, c in configs.items() if c.name == name]:
                invalid[served] = (
                    f"{models_dir / name}: its versions must use one Redis (redis: {sorted(map(str, placed))})"
                )
                del configs[served]
    return ModelRepository(configs, invalid)
