"""The graph rewrites a worker tries at load (workers/fusion.py): what they rewrite, what they leave, and that the
rewritten graph answers as the exported one does; and the runner's ``fuse`` setting. No Redis."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import fx, nn

from inferq.shared.models import load_model_config
from inferq.workers import fusion
from inferq.workers.formats import save_export
from inferq.workers.running import load_runner
from tests.support.builders import cnn_in_every_format, gray_png, small_cnn_probs

pytestmark = pytest.mark.skipif(not fusion.onednn_convolutions(), reason="this torch build has no oneDNN convolutions")


class Patterns(nn.Module):
    """Every case the rewrites meet: conv -> bn -> relu, a residual add, a conv with two users, a norm without a
    conv before it, a conv without bias, a stride and a single-int padding."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.stem_bn = nn.BatchNorm2d(8)
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.a_bn = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, stride=2, padding=1)  # two users: never folded into one of them
        self.b_bn = nn.BatchNorm2d(8)
        self.lone_bn = nn.BatchNorm2d(3)  # no convolution before it: stays
        self.head = nn.Linear(8, 5)
        for norm in (self.stem_bn, self.a_bn, self.b_bn, self.lone_bn):  # stats a trained model has
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.5, 2.0)
            norm.weight.data.uniform_(0.5, 1.5)
            norm.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.lone_bn(x)
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = torch.relu(self.a_bn(self.a(x)) + x)  # residual
        y = self.b(x)
        x = torch.relu(self.b_bn(y)) + y.mean()
        return self.head(x.mean(dim=(2, 3)))


def _exported(tmp_path: Path, module: nn.Module, example: torch.Tensor) -> fx.GraphModule:
    path = tmp_path / "model.pt2"
    save_export(module.eval(), example, path)
    return torch.export.load(str(path)).module()


def _targets(module: fx.GraphModule) -> list[Any]:
    return [node.target for node in module.graph.nodes if node.op == "call_function"]


def test_norms_fold_into_their_convolutions_and_convolutions_fuse_with_their_relu(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded = _exported(tmp_path, Patterns(), torch.zeros(2, 3, 16, 16))
    rewritten = fusion.fused(loaded)
    assert rewritten is not None
    assert (rewritten.folded_norms, rewritten.fused_convolutions) == (2, 3)  # not b's (two users), not lone_bn
    targets = _targets(rewritten.module)
    assert targets.count(torch.ops.aten.batch_norm.default) == 2  # lone_bn's and b_bn's
    assert torch.ops.aten.conv2d.default not in targets
    assert targets.count(torch.ops.mkldnn._convolution_pointwise.default) == 3
    # Each fused convolution reads its weight reordered once, in oneDNN's blocked format, and nothing else reads
    # the plain one: the folded weights it was packed from are gone, the packed ones are no parameter or buffer.
    assert rewritten.packed_weights == 3
    module = rewritten.module
    weights = [n.args[1] for n in module.graph.nodes if n.target is torch.ops.mkldnn._convolution_pointwise.default]
    assert all(getattr(module, w.target).is_mkldnn for w in weights)
    names = [name for name, _ in module.named_parameters()]
    assert not [name for name in names if name.startswith("_inferq_folded_") and name.endswith("weight")]
    assert not any(t.is_mkldnn for t in module.state_dict().values())
    x = torch.randn(4, 3, 16, 16)
    with torch.inference_mode():
        torch.testing.assert_close(rewritten.module(x), loaded(x), rtol=1e-4, atol=1e-5)
        laid = x.contiguous(memory_format=torch.channels_last)
        rewritten.module.to(memory_format=torch.channels_last)
        torch.testing.assert_close(rewritten.module(laid), loaded(x), rtol=1e-4, atol=1e-5)


def test_the_loaded_graph_is_left_untouched(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded = _exported(tmp_path, Patterns(), torch.zeros(2, 3, 16, 16))
    before = _targets(loaded)
    state = {k: v.clone() for k, v in loaded.state_dict().items()}
    assert fusion.fused(loaded) is not None
    assert _targets(loaded) == before
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())


def test_a_graph_without_convolutions_is_not_rewritten(tmp_path: Path) -> None:
    loaded = _exported(tmp_path, nn.Sequential(nn.Linear(4, 4), nn.ReLU()), torch.zeros(2, 4))
    assert fusion.fused(loaded) is None


def test_the_rewritten_graph_keeps_the_dynamic_batch_axis(tmp_path: Path) -> None:
    torch.manual_seed(0)
    loaded = _exported(tmp_path, Patterns(), torch.zeros(2, 3, 16, 16))
    rewritten = fusion.fused(loaded)
    assert rewritten is not None
    with torch.inference_mode():
        for batch in (1, 3, 17):
            x = torch.randn(batch, 3, 16, 16)
            torch.testing.assert_close(rewritten.module(x), loaded(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("fuse", ["on", "off", "auto"])
def test_the_worker_answers_as_the_model_does_fused_or_not(tmp_path: Path, fuse: str) -> None:
    folder = cnn_in_every_format(tmp_path)["export"]
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "fuse": fuse}))
    runner = load_runner(load_model_config(folder), torch.device("cpu"), 8)
    if fuse == "on":
        assert runner.fused == "0 batch norms folded, 1 convolutions fused, 1 weights prepacked"
        assert isinstance(runner.handler.model, fx.GraphModule)
        assert torch.ops.mkldnn._convolution_pointwise.default in _targets(runner.handler.model)
    elif fuse == "off":
        assert runner.fused == ""
        assert torch.ops.aten.conv2d.default in _targets(runner.handler.model)
    image = gray_png(3)
    (answer,) = runner.handler.run([(image, "image/png")])
    expected = small_cnn_probs(runner.handler, image)  # the model as built, not as loaded
    assert answer["score"] == pytest.approx(max(expected.values()), abs=1e-5)


def test_a_model_in_other_formats_is_never_rewritten(tmp_path: Path) -> None:
    folders = cnn_in_every_format(tmp_path)
    for fmt in ("safetensors", "torchscript"):
        config = json.loads((folders[fmt] / "config.json").read_text())
        (folders[fmt] / "config.json").write_text(json.dumps({**config, "fuse": "on"}))
        runner = load_runner(load_model_config(folders[fmt]), torch.device("cpu"), 8)
        assert runner.fused == ""
