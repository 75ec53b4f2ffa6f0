"""Turning per-item inputs into one batch and a batch's outputs back into per-item outputs.

The defaults a ``Handler`` uses, and the helpers a handler's own ``collate``/``uncollate`` can call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch


class CountMismatch(RuntimeError):
    """A handler's outputs do not line up one-to-one with the batch's inputs."""


def stack(items: list[Any]) -> Any:
    """Tensors -> one tensor; dicts of tensors -> a dict of stacked tensors; anything else -> the list."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.stack(items)
    if isinstance(first, Mapping) and all(isinstance(v, torch.Tensor) for v in first.values()):
        if any(not isinstance(item, Mapping) or item.keys() != first.keys() for item in items):
            raise ValueError("items have different keys")
        return {key: torch.stack([item[key] for item in items]) for key in first}
    return list(items)


def pad_sequences(items: list[Any], pad_value: float | Mapping[str, float] = 0) -> Any:
    """Right-pad 1-D (or N-D, along the first axis) tensors, or dicts of them, to the longest item.

    ``pad_value`` may give one value per key (``{"input_ids": tokenizer.pad_token_id}``); keys not
    named are padded with 0, which is what an attention mask needs.
    """
    first = items[0]
    if isinstance(first, torch.Tensor):
        return _pad([*items], float(pad_value) if not isinstance(pad_value, Mapping) else 0.0)
    if not isinstance(first, Mapping):
        raise TypeError(f"pad_sequences takes tensors or dicts of tensors, not {type(first).__name__}")
    values = pad_value if isinstance(pad_value, Mapping) else {}
    default = 0.0 if isinstance(pad_value, Mapping) else float(pad_value)
    return {key: _pad([item[key] for item in items], float(values.get(key, default))) for key in first}


def _pad(tensors: list[torch.Tensor], value: float) -> torch.Tensor:
    # pad_sequence right-pads along the first axis; padding_side exists only in newer torch.
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)


def to_device(batch: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move tensors (alone, in dicts, lists or tuples) to the device; floating ones take ``dtype``."""
    if isinstance(batch, torch.Tensor):
        if dtype is not None and batch.is_floating_point() and batch.dtype != dtype:
            batch = batch.to(dtype)
        return move_batch(batch, device)
    if isinstance(batch, Mapping):
        return {key: to_device(value, device, dtype) for key, value in batch.items()}
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(value, device, dtype) for value in batch)
    return batch


def move_batch(batch: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Put a CPU tensor on the device; pinned memory lets the copy to a GPU overlap other work."""
    if device.type != "cuda" or batch.device == device:
        return batch
    return batch.pin_memory().to(device, non_blocking=True)


def record_stream(batch: Any, stream: Any) -> None:
    """Tell CUDA's allocator that ``stream`` uses the batch's device tensors (made on another stream)."""
    if isinstance(batch, torch.Tensor):
        if batch.is_cuda:
            batch.record_stream(stream)
    elif isinstance(batch, Mapping):
        for value in batch.values():
            record_stream(value, stream)
    elif isinstance(batch, list | tuple):
        for value in batch:
            record_stream(value, stream)


def split(outputs: Any, n: int) -> list[Any]:
    """One output per item: tensors and dicts of tensors split along the first axis, lists as they are.

    Floating outputs come back to the CPU as float32, so half-precision models postprocess as usual.
    """
    if isinstance(outputs, torch.Tensor):
        _check_count(outputs.shape[0] if outputs.ndim else 1, n)
        return list(_to_cpu(outputs).unbind(0))
    if isinstance(outputs, Mapping):
        parts = {key: split(value, n) for key, value in outputs.items() if value is not None}
        return [{key: value[i] for key, value in parts.items()} for i in range(n)]
    if isinstance(outputs, list | tuple):
        _check_count(len(outputs), n)
        return [_to_cpu(o) if isinstance(o, torch.Tensor) else o for o in outputs]
    raise CountMismatch(f"cannot split a {type(outputs).__name__} into {n} outputs; override uncollate")


def _check_count(got: int, n: int) -> None:
    if got != n:
        raise CountMismatch(f"the model returned {got} outputs for {n} inputs")


def _to_cpu(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    if tensor.is_floating_point() and tensor.dtype != torch.float32:
        tensor = tensor.float()
    return tensor.cpu()


def signature(item: Any) -> Any:
    """What must match for items to stack: shapes and dtypes (of every value, for dicts)."""
    if isinstance(item, torch.Tensor):
        return (tuple(item.shape), item.dtype)
    if isinstance(item, Mapping):
        return tuple(sorted((str(k), signature(v)) for k, v in item.items()))
    return type(item).__name__
