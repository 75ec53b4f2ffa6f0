"""Exact rewrites of an exported graph for inference on the CPU, done once at load (workers/running.py choose_layout).

A ``torch.export`` program's module is an FX graph of ATen ops that runs op by op. Two rewrites, both exact up to
float rounding:

- ``conv2d`` then an inference ``batch_norm``: the norm's scale and shift are folded into the convolution's weight
  and bias (``torch.nn.utils.fusion.fuse_conv_bn_weights``), so the norm costs nothing at run time;
- ``conv2d`` (then ``relu``): oneDNN's convolution, with the ReLU as its post-op when one follows
  (``mkldnn._convolution_pointwise``, the op TorchInductor emits for CPU convolutions): one call and one pass over the
  activations where there were two, without a compiler at load;
- and its weight reordered once, at load, into oneDNN's blocked format (``mkldnn._reorder_convolution_weight``, as
  TorchInductor's freezing does), where a plain weight is reordered again at every call: at batch 1 that reorder
  was a third of the forward.

A ResNet-18-sized CNN on 2 cores, channels-last, best of alternated rounds: at batch 8, 155 ms as exported, 149 ms with
the norms folded, 134 ms with the convolutions fused too; at batch 1, 21 ms fused and 14 ms with the weights
prepacked. Only an FX ``GraphModule`` is rewritten (export's module); the caller checks the rewritten graph's
outputs against the original's before it keeps it.

A prepacked weight is an opaque oneDNN tensor: it has no storage to copy or save, so it is held as a plain attribute
of the module, not a buffer (``Module.to`` and ``state_dict`` leave it alone), and the rewritten module cannot be
deep-copied. It is packed for the input shape export recorded (a dynamic batch at its example size); any other
shape still runs, reordering as a plain weight would.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.nn.utils.fusion import fuse_conv_bn_weights

_CONV = torch.ops.aten.conv2d.default
_BATCH_NORM = torch.ops.aten.batch_norm.default
_RELU = torch.ops.aten.relu.default
_FOLDED = "_inferq_folded_"
_PACKED = "_inferq_packed_"


@dataclass
class Fused:
    """A rewritten copy of a graph module, and what was rewritten in it."""

    module: fx.GraphModule
    folded_norms: int
    fused_convolutions: int
    packed_weights: int = 0

    def describe(self) -> str:
        packed = f", {self.packed_weights} weights prepacked" if self.packed_weights else ""
        return f"{self.folded_norms} batch norms folded, {self.fused_convolutions} convolutions fused{packed}"


def onednn_convolutions() -> bool:
    """Whether this torch build has oneDNN's fused convolution (every x86-64 and arm64 CPU wheel does)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_convolution_pointwise")


def fused(module: fx.GraphModule) -> Fused | None:
    """A copy of ``module`` with the rewrites done; None when there was nothing to rewrite. ``module`` is untouched."""
    with warnings.catch_warnings():  # copying export's pytree specs trips torch's own LeafSpec deprecation
        warnings.simplefilter("ignore", FutureWarning)
        out = copy.deepcopy(module)
    folded = fold_batch_norms(out)
    convolutions = fuse_convolutions(out) if onednn_convolutions() else 0
    if not folded and not convolutions:
        return None
    packed = prepack_weights(out)  # the convolutions fuse_convolutions made
    out.graph.eliminate_dead_code()
    out.delete_all_unused_submodules()
    used = {n.target for n in out.graph.nodes if n.op == "get_attr"}  # a folded weight now packed is read by none
    for name in [n for n, _ in out.named_parameters() if n.startswith(_FOLDED) and n not in used]:
        delattr(out, name)
    out.graph.lint()
    out.recompile()
    return Fused(out, folded, convolutions, packed)


def _tensor(module: fx.GraphModule, node: Any) -> torch.Tensor | None:
    """The parameter or buffer a ``get_attr`` node reads; None for a None argument."""
    if node is None:
        return None
    if not (isinstance(node, fx.Node) and node.op == "get_attr" and isinstance(node.target, str)):
        raise _NotFoldable
    value = module.get_parameter(node.target) if _is_parameter(module, node.target) else module.get_buffer(node.target)
    return value.detach()


def _constant(module: fx.GraphModule, node: Any) -> torch.Tensor:
    value = _tensor(module, node)
    if value is None:
        raise _NotFoldable
    return value


def _is_parameter(module: fx.GraphModule, target: str) -> bool:
    owner, _, name = target.rpartition(".")
    return name in module.get_submodule(owner)._parameters


class _NotFoldable(Exception):
    """An argument is not a constant of the module (an input, or computed): the pair stays as it is."""


def _conv_args(node: fx.Node) -> list[Any]:
    """conv2d's seven arguments with its defaults filled in: input, weight, bias, stride, padding, dilation, groups."""
    defaults: list[Any] = [None, None, None, [1, 1], [0, 0], [1, 1], 1]
    args = [*node.args, *defaults[len(node.args) :]]
    for index, name in enumerate(("input", "weight", "bias", "stride", "padding", "dilation", "groups")):
        if name in node.kwargs:
            args[index] = node.kwargs[name]
    return args


def _pair(value: Sequence[int] | int) -> list[int]:
    values = [value] if isinstance(value, int) else list(value)
    return values * 2 if len(values) == 1 else values


def fold_batch_norms(module: fx.GraphModule) -> int:
    """Fold each inference batch norm that is its convolution's only user into that convolution; how many were."""
    folded = 0
    for norm in list(module.graph.nodes):
        if norm.op != "call_function" or norm.target is not _BATCH_NORM or norm.kwargs:
            continue
        conv = norm.args[0]
        if not (isinstance(conv, fx.Node) and conv.target is _CONV and len(conv.users) == 1):
            continue
        _, norm_weight, norm_bias, mean, var, training, _momentum, eps, *_ = norm.args
        if training or mean is None or var is None:
            continue
        args = _conv_args(conv)
        try:
            weight, bias = fuse_conv_bn_weights(
                _constant(module, args[1]),
                _tensor(module, args[2]),
                _constant(module, mean),
                _constant(module, var),
                eps,
                _tensor(module, norm_weight),
                _tensor(module, norm_bias),
            )
        except _NotFoldable:
            continue
        names = []
        for kind, value in (("weight", weight), ("bias", bias)):
            name = f"{_FOLDED}{folded}_{kind}"
            module.register_parameter(name, nn.Parameter(value.detach().clone(), requires_grad=False))
            names.append(name)
        with module.graph.inserting_before(conv):
            args[1], args[2] = (module.graph.get_attr(name) for name in names)
        conv.args, conv.kwargs = tuple(args), {}
        norm.replace_all_uses_with(conv)
        module.graph.erase_node(norm)
        folded += 1
    return folded


def fuse_convolutions(module: fx.GraphModule) -> int:
    """Run each float ``conv2d`` as oneDNN's convolution, with the ReLU that is its only user as the post-op."""
    fused_count = 0
    for conv in list(module.graph.nodes):
        if conv.op != "call_function" or conv.target is not _CONV:
            continue
        x, weight, bias, stride, padding, dilation, groups = _conv_args(conv)
        if not (isinstance(weight, fx.Node) and weight.op == "get_attr"):
            continue  # a weight computed in the graph: left to aten
        users = list(conv.users)
        relu = users[0] if len(users) == 1 and users[0].target is _RELU and not users[0].kwargs else None
        args = (x, weight, bias, _pair(padding), _pair(stride), _pair(dilation), groups, "relu" if relu else "none")
        last = relu or conv
        with module.graph.inserting_after(last):
            replacement = module.graph.call_function(torch.ops.mkldnn._convolution_pointwise.default, (*args, [], ""))
        if "val" in last.meta:  # the shape export recorded, which the next convolution's weight is packed for
            replacement.meta["val"] = last.meta["val"]
        last.replace_all_uses_with(replacement)
        if relu is not None:
            module.graph.erase_node(relu)
        module.graph.erase_node(conv)
        fused_count += 1
    return fused_count


def _shape(node: Any) -> list[int] | None:
    """The shape export recorded for ``node``'s output, a symbolic size at its example value; None if unknown."""
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(value, torch.Tensor):
        return None
    sizes = []
    for size in value.shape:
        hint = size if isinstance(size, int) else getattr(getattr(size, "node", None), "hint", None)
        if not isinstance(hint, int):
            return None
        sizes.append(hint)
    return sizes


def prepack_weights(module: fx.GraphModule) -> int:
    """Reorder each oneDNN convolution's float32 weight into oneDNN's blocked format once; how many were.

    The format suits the input shape export recorded for that convolution; one it did not record is left plain.
    """
    packed = 0
    for conv in list(module.graph.nodes):
        if conv.op != "call_function" or conv.target is not torch.ops.mkldnn._convolution_pointwise.default:
            continue
        x, weight_node, bias, padding, stride, dilation, groups, *rest = conv.args
        shape = _shape(x)
        if shape is None or len(shape) != 4:
            continue
        try:
            weight = _constant(module, weight_node)
        except _NotFoldable:
            continue
        if weight.dtype != torch.float32 or weight.is_mkldnn:
            continue
        reordered = torch.ops.mkldnn._reorder_convolution_weight(weight, padding, stride, dilation, groups, shape)
        name = f"{_PACKED}{packed}"
        setattr(module, name, reordered)  # not a buffer: an opaque tensor has no storage for Module.to to convert
        with warnings.catch_warnings():  # FX warns of a get_attr that reads no parameter, buffer or submodule
            warnings.simplefilter("ignore", UserWarning)
            with module.graph.inserting_before(conv):
                node = module.graph.get_attr(name)
        conv.args = (x, node, bias, padding, stride, dilation, groups, *rest)
        packed += 1
    return packed
