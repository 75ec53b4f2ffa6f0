"""Model folders for the benchmark: a ResNet-18-sized CNN at 224x224, the digits demo, a no-op, the langid text demo."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from inferq.workers.formats import save_export

ROOT = Path(__file__).resolve().parent.parent


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.down(x))


class ResNet18(nn.Module):
    """ResNet-18's shape (11.7 M parameters, 1.8 GFLOPs at 224x224); weights untrained."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(3, 2, 1)
        )
        layers = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.head = nn.Linear(512, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.head(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, 1), 1))


class NoOp(nn.Module):
    """What is left when the model costs nothing: the queue's own overhead."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def build_models(target: Path, resnet_max_batch: int = 16) -> dict[str, Path]:
    """Write the three model folders under ``target``; returns name -> folder."""
    target.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    resnet = target / "resnet"
    resnet.mkdir(exist_ok=True)
    save_export(ResNet18(), torch.zeros(2, 3, 224, 224), resnet / "model.pt2")
    imagenet = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}
    _config(
        resnet,
        "image_classifier",
        {"kind": "image", "mode": "RGB", "size": [224, 224], **imagenet},
        resnet_max_batch,
        labels=None,
    )
    digits = target / "digits"
    digits.mkdir(exist_ok=True)
    shutil.copy(ROOT / "models" / "digits" / "model.pt2", digits / "model.pt2")
    shutil.copy(ROOT / "models" / "digits" / "config.json", digits / "config.json")
    noop = target / "noop"
    noop.mkdir(exist_ok=True)
    save_export(NoOp(), torch.zeros(2, 4), noop / "model.pt2")
    _config(noop, "tensor", {"kind": "tensor", "shape": [4], "dtype": "float32"}, 256, labels=None)
    langid = target / "langid"  # the text demo model, a tiny BERT (models/langid/train.py), as shipped
    shutil.copytree(ROOT / "models" / "langid", langid, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.py"))
    return {"resnet": resnet, "digits": digits, "noop": noop, "langid": langid}


def _config(folder: Path, handler: str, spec: dict[str, object], max_batch: int, labels: list[str] | None) -> None:
    config = {
        "handler": handler,
        "format": "export",
        "weights": "model.pt2",
        "input": spec,
        "max_batch": max_batch,
        "labels": labels,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
