"""Small models built on the spot, in every format inferq loads: nothing is downloaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from inferq.workers.formats import save_export
from inferq.workers.handlers import Handler, finite_list, pad_sequences

WORDS = [
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "a",
    "lazy",
    "dog",
    "while",
    "seven",
    "wizards",
    "quietly",
    "pack",
    "boxes",
    "of",
    "liquor",
    "jugs",
    "and",
    "every",
    "zebra",
    "enjoys",
    "long",
    "walks",
    "beside",
    "rivers",
    "under",
    "bright",
    "summer",
    "skies",
    "near",
    "old",
    "mountain",
    "towns",
]


def sentences(count: int, seed: int = 0, min_words: int = 1, max_words: int = 40) -> list[str]:
    """Deterministic texts of very different lengths."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        n = int(torch.randint(min_words, max_words + 1, (1,), generator=generator))
        picks = torch.randint(0, len(WORDS), (n,), generator=generator).tolist()
        out.append(" ".join(WORDS[i] for i in picks))
    return out


def write_tokenizer(folder: Path) -> Any:
    """A WordPiece tokenizer trained in well under a second, saved as save_pretrained writes it."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer.train_from_iterator(sentences(200), trainers.WordPieceTrainer(vocab_size=200, special_tokens=special))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=64,
    )
    fast.save_pretrained(str(folder))
    return fast


def write_bert(folder: Path, labels: list[str] | None = ("neg", "pos"), seed: int = 0) -> Any:  # type: ignore[assignment]
    """A 2-layer random-weight BERT (a classifier when labels are given) and its tokenizer in one folder."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    tokenizer = write_tokenizer(folder)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    if labels:
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
        model: Any = BertForSequenceClassification(config)
    else:
        model = BertModel(config, add_pooling_layer=False)
    model.eval().save_pretrained(str(folder))
    return model


class SmallCNN(nn.Module):
    """An 8x8 grayscale image classifier with three classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


class Scale(nn.Module):
    """x * factor: a model whose answers tell which weights gave them (versions, weights swapped under inferq up)."""

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.register_buffer("factor", torch.tensor(factor))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


def small_cnn() -> SmallCNN:
    """The factory a safetensors config names: ``tests.support.builders:small_cnn``."""
    torch.manual_seed(0)
    return SmallCNN().eval()


IMAGE_INPUT = {"kind": "image", "mode": "L", "size": [8, 8], "mean": [0.5], "std": [0.5]}


def gray_png(seed: int) -> bytes:
    """A random 8x8 grayscale PNG, the input SmallCNN takes."""
    from io import BytesIO

    from PIL import Image

    generator = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (8, 8), generator=generator, dtype=torch.uint8).numpy()
    buffer = BytesIO()
    Image.fromarray(pixels, mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def write_fixed_batch_cnn(folder: Path) -> Path:
    """SmallCNN exported as users often do: at batch 1 with no dynamic axis, so it runs batches of 1 only."""
    write_config(
        folder, handler="image_classifier", format="export", weights="model.pt2", input=IMAGE_INPUT, max_batch=8
    )
    program = torch.export.export(small_cnn(), (torch.zeros(1, 1, 8, 8),))
    torch.export.save(program, str(folder / "model.pt2"))
    return folder


def write_config(folder: Path, **config: Any) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


CNN_LABELS = ["a", "b", "c"]


def small_cnn_probs(handler: Any, image: bytes) -> dict[str, float]:
    """SmallCNN's own answer for a PNG as ``handler`` preprocesses it: each label's probability."""
    item = handler.preprocess(image, "image/png")
    probs = torch.softmax(small_cnn()(item.unsqueeze(0))[0], dim=0)
    return dict(zip(CNN_LABELS, probs.tolist(), strict=True))


def cnn_in_every_format(root: Path) -> dict[str, Path]:
    """The same SmallCNN as export, safetensors, torchscript and ONNX model folders (image_classifier)."""
    from safetensors.torch import save_file

    model = small_cnn()
    common = {"handler": "image_classifier", "input": IMAGE_INPUT, "labels": CNN_LABELS, "top_k": 3, "max_batch": 8}
    folders = {}
    folder = write_config(root / "cnn-export", format="export", weights="model.pt2", **common)
    save_export(model, torch.zeros(2, 1, 8, 8), folder / "model.pt2")
    folders["export"] = folder
    folder = write_config(
        root / "cnn-safetensors",
        format="safetensors",
        weights="model.safetensors",
        module="tests.support.builders:small_cnn",
        **common,
    )
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    folders["safetensors"] = folder
    folder = write_config(root / "cnn-torchscript", format="torchscript", weights="model.pt", **common)
    torch.jit.script(model).save(str(folder / "model.pt"))
    folders["torchscript"] = folder
    folder = write_config(root / "cnn-onnx", format="onnx", weights="model.onnx", **common)
    write_onnx_linear(folder / "model.onnx", model)
    folders["onnx"] = folder
    return folders


def write_onnx_linear(path: Path, model: SmallCNN) -> None:
    """SmallCNN as an ONNX graph written with onnx.helper (Conv, Relu, Flatten, Gemm), dynamic batch axis."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weights = {name: value.detach().numpy() for name, value in model.state_dict().items()}
    inits = [numpy_helper.from_array(value, name) for name, value in weights.items()]
    nodes = [
        helper.make_node("Conv", ["x", "conv.weight", "conv.bias"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("Flatten", ["r"], ["f"], axis=1),
        helper.make_node("Gemm", ["f", "head.weight", "head.bias"], ["logits"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "small_cnn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
        inits,
    )
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx_model.ir_version = 8  # readable by every onnxruntime this project admits
    onnx.checker.check_model(onnx_model)
    onnx.save(onnx_model, str(path))


class Ragged(Handler):
    """A json input {"values": [numbers]} of any length; the values over 0.5, doubled, out: outputs differ in size."""

    calls: dict[str, int] = {"collate": 0, "predict": 0}

    def load(self) -> None:
        self.model = lambda batch: batch * 2

    def preprocess(self, payload: bytes, content_type: str) -> torch.Tensor:
        return torch.tensor(json.loads(payload)["values"], dtype=torch.float32)

    def collate(self, items: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        Ragged.calls["collate"] += 1
        padded = pad_sequences(items, pad_value=0.0)
        lengths = torch.tensor([len(item) for item in items])
        return {"values": padded, "lengths": lengths}

    def predict(self, batch: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        Ragged.calls["predict"] += 1
        doubled = self.model(batch["values"])
        return [row[:n][row[:n] > 1.0] for row, n in zip(doubled, batch["lengths"].tolist(), strict=True)]

    def postprocess(self, output: torch.Tensor) -> dict[str, Any]:
        return {"kept": finite_list(output), "count": int(output.numel())}
