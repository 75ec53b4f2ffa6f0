"""Real models through the real API and worker: text, torch.export images, ragged outputs, the text demo."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
import torch

from inferq.shared.models import load_model_config
from inferq.workers.running import load_runner
from tests.support.builders import (
    cnn_in_every_format,
    gray_png,
    sentences,
    write_bert,
    write_config,
    write_fixed_batch_cnn,
)
from tests.support.models import ROOT, train_script
from tests.support.stack import Stack, new_stack, serving

LANGID = ROOT / "models" / "langid"


@pytest.fixture(scope="module")
def models_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The API over a text classifier, an exported CNN, a ragged-output handler and the langid demo."""
    with serving(new_stack(tmp_path_factory.mktemp("models-stack"))) as running:
        models = running.models_dir
        write_bert(models / "sentiment" / "hf", labels=["neg", "pos"])
        # A user's own Hugging Face folder needs only inferq's config.json beside it.
        write_config(
            models / "sentiment",
            handler="text_classifier",
            format="huggingface",
            weights="hf",
            input={"kind": "text", "max_chars": 1000},
            top_k=2,
            max_batch=64,
        )
        shutil.copytree(cnn_in_every_format(running.tmp / "cnn")["export"], models / "cnn")
        write_fixed_batch_cnn(models / "cnn-fixed")
        write_config(
            models / "ragged",
            handler="tests.support.builders:Ragged",
            weights="none",
            input={"kind": "json", "schema": {"type": "object", "required": ["values"]}},
        )
        shutil.copytree(LANGID, models / "langid", ignore=shutil.ignore_patterns("__pycache__"))
        running.start_api()
        yield running


def _wait(stack: Stack, job_id: str) -> dict[str, Any]:
    response = httpx.get(f"{stack.base}/v1/jobs/{job_id}", params={"wait": 30}, timeout=40)
    assert response.status_code == 200, response.text
    return dict(response.json())


def _submit_text(stack: Stack, model: str, text: str) -> str:
    response = httpx.post(f"{stack.base}/v1/models/{model}/jobs", json={"inputs": text}, timeout=10)
    assert response.status_code == 202, response.text
    return str(response.json()["id"])


def test_texts_batched_over_http_match_each_text_run_alone(models_stack: Stack) -> None:
    texts = sentences(16, seed=11, max_words=40)
    # Queued before any worker runs, so the worker's first pop takes all of them as one padded batch.
    ids = [_submit_text(models_stack, "sentiment", text) for text in texts]
    models_stack.start_worker("sentiment", name="sentiment-worker")
    views = [_wait(models_stack, job_id) for job_id in ids]
    assert [view["status"] for view in views] == ["finished"] * 16, [view["error"] for view in views]
    assert [view["batch_size"] for view in views] == [16] * 16
    runner = load_runner(load_model_config(models_stack.models_dir / "sentiment"), torch.device("cpu"), 1)
    for text, view in zip(texts, views, strict=True):
        (alone,) = runner.handler.run([(text.encode(), "text/plain; charset=utf-8")])
        assert view["result"]["label"] == alone["label"]
        for got, want in zip(view["result"]["top_k"], alone["top_k"], strict=True):
            assert got["label"] == want["label"] and got["score"] == pytest.approx(want["score"], abs=1e-4)


def test_an_exported_model_serves_images(models_stack: Stack, digits_heldout: tuple[Any, Any]) -> None:
    models_stack.start_worker("cnn", name="cnn-worker")
    models_stack.wait_for_worker("cnn")
    runner = load_runner(load_model_config(models_stack.models_dir / "cnn"), torch.device("cpu"), 1)
    for png in digits_heldout[0][:4]:
        response = httpx.post(
            f"{models_stack.base}/v1/models/cnn/jobs",
            files={"file": ("d.png", png, "image/png")},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert response.status_code == 200, response.text
        assert response.json()["result"] == runner.handler.run([(png, "image/png")])[0]


def test_a_model_exported_for_batches_of_one_serves_each_job_at_batch_one(models_stack: Stack) -> None:
    """Its jobs said batch_size 4, and its log blamed the data on every batch."""
    images = [gray_png(seed) for seed in range(4)]
    ids = []
    for image in images:
        response = httpx.post(
            f"{models_stack.base}/v1/models/cnn-fixed/jobs", files={"file": ("x.png", image, "image/png")}, timeout=10
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    # Queued first: a worker that could batch would take all four in one pop.
    worker = models_stack.start_worker("cnn-fixed", name="fixed-worker")
    views = [_wait(models_stack, job_id) for job_id in ids]
    assert [view["status"] for view in views] == ["finished"] * 4, [view["error"] for view in views]
    assert [view["batch_size"] for view in views] == [1] * 4
    runner = load_runner(load_model_config(models_stack.models_dir / "cnn-fixed"), torch.device("cpu"), 1)
    assert [view["result"] for view in views] == [runner.handler.run([(i, "image/png")])[0] for i in images]
    log = models_stack.logs[models_stack.procs.index(worker)].read_text()
    assert log.count("takes one item at a time") == 1
    # The config's device is auto: the first GPU where there is one (a lent GPU machine runs this suite too).
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    assert f"model cnn-fixed (export) loaded on {device}, max batch 1" in log
    assert "splitting to isolate" not in log


def test_outputs_of_different_sizes_come_back_per_job(models_stack: Stack) -> None:
    rows = [[0.9, 0.1, 0.8], [0.2], [], [0.6] * 7]
    ids = []
    for row in rows:
        response = httpx.post(
            f"{models_stack.base}/v1/models/ragged/jobs", json={"inputs": {"values": row}}, timeout=10
        )
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    models_stack.start_worker("ragged", name="ragged-worker")
    views = [_wait(models_stack, job_id) for job_id in ids]
    assert [view["status"] for view in views] == ["finished"] * 4
    assert [view["result"]["count"] for view in views] == [2, 0, 0, 7]
    assert views[0]["result"]["kept"] == [pytest.approx(1.8), pytest.approx(1.6)]
    refused = httpx.post(f"{models_stack.base}/v1/models/ragged/jobs", json={"inputs": {"other": 1}}, timeout=10)
    assert refused.status_code == 422 and "values" in refused.json()["error"]["message"]


def test_the_text_demo_reads_held_out_texts_over_http(models_stack: Stack) -> None:
    texts, labels = train_script("langid").heldout_texts(200)
    models_stack.start_worker("langid", name="langid-worker")
    models_stack.wait_for_worker("langid")

    def classify(text: str) -> str:
        response = httpx.post(
            f"{models_stack.base}/v1/models/langid/jobs",
            json={"inputs": text},
            headers={"Prefer": "wait=30"},
            timeout=40,
        )
        assert response.status_code == 200, response.text
        return str(response.json()["result"]["label"])

    with ThreadPoolExecutor(max_workers=16) as pool:
        predicted = list(pool.map(classify, texts))
    accuracy = sum(p == t for p, t in zip(predicted, labels, strict=True)) / len(labels)
    print(f"\nlangid demo over HTTP: {accuracy:.3f} on {len(labels)} held-out texts")
    assert accuracy >= 0.95
    # Its batches' tokens reach /metrics: every text's, exactly, and the padded grid they ran in.
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(LANGID / "hf")
    tokens = sum(len(tokenizer(text, truncation=True, max_length=128)["input_ids"]) for text in texts)
    exposed = httpx.get(f"{models_stack.base}/metrics", timeout=10).text
    samples = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in exposed.splitlines()
        if line.startswith("inferq_batch_") and 'model="langid"' in line and "_tokens_total" in line
    }
    assert samples["inferq_batch_tokens_total"] == tokens
    assert samples["inferq_batch_padded_tokens_total"] >= tokens
