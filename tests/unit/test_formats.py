"""Every weight format loads the same model to the same results; every bad config is one readable line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inferq.shared.errors import ConfigError
from inferq.shared.models import load_model_config
from inferq.workers.running import load_runner
from tests.support.builders import (
    IMAGE_INPUT,
    cnn_in_every_format,
    gray_png,
    sentences,
    small_cnn_probs,
    write_bert,
    write_config,
)

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def cnn_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return cnn_in_every_format(tmp_path_factory.mktemp("cnn"))


@pytest.mark.parametrize("fmt", ["export", "safetensors", "torchscript", "onnx"])
def test_every_format_gives_the_models_own_answer(cnn_folders: dict[str, Path], fmt: str) -> None:
    config = load_model_config(cnn_folders[fmt])
    runner = load_runner(config, CPU, 8)
    images = [gray_png(seed) for seed in range(6)]
    results = runner.handler.run([(image, "image/png") for image in images])
    for image, result in zip(images, results, strict=True):
        expected = small_cnn_probs(runner.handler, image)
        assert result["label"] == max(expected, key=lambda k: expected[k])
        for entry in result["top_k"]:
            assert entry["score"] == pytest.approx(expected[entry["label"]], abs=1e-5)


def test_huggingface_embedding_is_the_masked_mean_normalised(tmp_path: Path) -> None:
    model = write_bert(tmp_path / "hf", labels=None)
    write_config(tmp_path, handler="text_embedding", format="huggingface", weights="hf", input={"kind": "text"})
    runner = load_runner(load_model_config(tmp_path), CPU, 8)
    texts = sentences(5, seed=2)
    results = runner.handler.run([(t.encode(), "text/plain") for t in texts])
    tokenizer = runner.handler.tokenizer  # type: ignore[attr-defined]
    for text, result in zip(texts, results, strict=True):
        with torch.no_grad():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0]
        expected = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
        assert result["dim"] == 32
        assert result["embedding"] == pytest.approx(expected.tolist(), abs=1e-5)


def test_text_classifier_labels_come_from_id2label_or_the_config(tmp_path: Path) -> None:
    write_bert(tmp_path / "hf", labels=["neg", "pos"])
    common = {"handler": "text_classifier", "format": "huggingface", "weights": "hf", "input": {"kind": "text"}}
    write_config(tmp_path, **common)
    (result,) = load_runner(load_model_config(tmp_path), CPU, 4).handler.run([(b"a lazy dog", "text/plain")])
    assert {entry["label"] for entry in result["top_k"]} == {"neg", "pos"}
    write_config(tmp_path, labels=["bad", "good"], **common)
    (result,) = load_runner(load_model_config(tmp_path), CPU, 4).handler.run([(b"a lazy dog", "text/plain")])
    assert {entry["label"] for entry in result["top_k"]} == {"bad", "good"}


def test_compile_and_warmup_run_before_the_first_job(cnn_folders: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "compiled"
    folder.mkdir()
    (folder / "model.pt2").symlink_to(cnn_folders["export"] / "model.pt2")
    config = json.loads((cnn_folders["export"] / "config.json").read_text())
    write_config(folder, **{**config, "compile": True})
    runner = load_runner(load_model_config(folder), CPU, 4)
    assert type(runner.handler.model).__name__ == "OptimizedModule"
    eager = load_runner(load_model_config(cnn_folders["export"]), CPU, 4)
    payloads = [(gray_png(seed), "image/png") for seed in range(3)]
    assert runner.handler.run(payloads) == eager.handler.run(payloads)


def _error(folder: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        config = load_model_config(folder)
        load_runner(config, CPU, 4)
    message = caught.value.message
    assert "\n" not in message
    return message


def test_bad_configs_are_one_line_naming_the_model_and_file(cnn_folders: dict[str, Path], tmp_path: Path) -> None:
    common = {"handler": "image_classifier", "input": IMAGE_INPUT}
    bad = write_config(tmp_path / "missing", format="export", weights="nope.pt2", **common)
    assert _error(bad) == f"model 'missing': weights file {bad / 'nope.pt2'} does not exist"
    bad = write_config(tmp_path / "unknown", format="tensorflow", weights="m.pb", **common)
    assert _error(bad).startswith(f"{bad / 'config.json'}: format: Input should be 'export', 'safetensors'")
    assert "(got 'tensorflow')" in _error(bad)
    bad = write_config(tmp_path / "handler", handler="no_such_pkg.mod:Handler", weights="x", input=IMAGE_INPUT)
    assert _error(bad).startswith("model 'handler': handler 'no_such_pkg.mod:Handler': cannot import no_such_pkg.mod")
    bad = write_config(
        tmp_path / "module", format="safetensors", weights="model.safetensors", module="nowhere:f", **common
    )
    (bad / "model.safetensors").symlink_to(cnn_folders["safetensors"] / "model.safetensors")
    assert _error(bad).startswith("model 'module': module 'nowhere:f': cannot import nowhere")
    bad = write_config(
        tmp_path / "misfit",
        format="safetensors",
        weights="model.safetensors",
        module="tests.support.builders:Ragged",
        **common,
    )
    from safetensors.torch import save_file

    save_file({"conv.weight": torch.zeros(2, 2)}, str(bad / "model.safetensors"))
    message = _error(bad)
    assert message.startswith("model 'misfit': ")
    bad = write_config(
        tmp_path / "wrong",
        format="safetensors",
        weights="model.safetensors",
        module="tests.support.builders:small_cnn",
        **common,
    )
    save_file({"conv.weight": torch.zeros(2, 2)}, str(bad / "model.safetensors"))
    message = _error(bad)
    assert message.startswith(
        f"model 'wrong': the weights in {bad / 'model.safetensors'} do not fit tests.support.builders:small_cnn"
    )
    assert "Missing key(s)" in message or "size mismatch" in message
    bad = write_config(tmp_path / "garbage", format="export", weights="model.pt2", **common)
    (bad / "model.pt2").write_bytes(b"not a program")
    assert _error(bad).startswith(f"model 'garbage': cannot load {bad / 'model.pt2'} as export: ")
    bad = write_config(
        tmp_path / "hf", handler="text_classifier", format="huggingface", weights="hf", input={"kind": "text"}
    )
    assert _error(bad) == f"model 'hf': weights folder {bad / 'hf'} does not exist (the output of save_pretrained)"


def test_a_hugging_face_folder_without_tokenizer_files_is_refused(tmp_path: Path) -> None:
    # transformers builds a tokenizer of its five special tokens from config.json alone: every word became
    # [UNK], and different texts got identical embeddings.
    write_bert(tmp_path / "hf", labels=None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / "hf" / name).unlink()
    write_config(tmp_path, handler="text_embedding", format="huggingface", weights="hf", input={"kind": "text"})
    assert _error(tmp_path) == (
        f"model '{tmp_path.name}': the tokenizer in {tmp_path / 'hf'} knows no words, only its 5 special tokens "
        "(are its files missing? save_pretrained writes tokenizer.json or vocab.txt): every text would read as "
        "unknown words and get the same result; save the model's tokenizer there (tokenizer.save_pretrained) "
        'or name its folder in the config\'s "tokenizer"'
    )


def test_a_text_classifier_on_a_checkpoint_without_its_head_is_refused(tmp_path: Path) -> None:
    # transformers fills a missing head with random weights, new at every start: two workers disagreed.
    write_bert(tmp_path / "hf", labels=None)  # an encoder saved without a classification head (nor pooler)
    write_config(tmp_path, handler="text_classifier", format="huggingface", weights="hf", input={"kind": "text"})
    assert _error(tmp_path) == (
        f"model '{tmp_path.name}': {tmp_path / 'hf'} has no weights for bert.pooler.dense.bias, "
        "bert.pooler.dense.weight, classifier.bias, classifier.weight: AutoModelForSequenceClassification would "
        "fill them at random, differently at every start; save the trained model there (save_pretrained), or "
        "serve the checkpoint with a handler that does not need them"
    )
    # The embedding handler never runs the pooler (its result is the masked mean): the same folder serves it.
    write_config(tmp_path, handler="text_embedding", format="huggingface", weights="hf", input={"kind": "text"})
    (first,) = load_runner(load_model_config(tmp_path), CPU, 4).handler.run([(b"a lazy dog", "text/plain")])
    (again,) = load_runner(load_model_config(tmp_path), CPU, 4).handler.run([(b"a lazy dog", "text/plain")])
    assert first == again
