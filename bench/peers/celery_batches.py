"""Celery with a Redis broker and result backend, batching with celery-batches' ``Batches``.

    python -m bench.peers.celery_batches api --port P --redis-url URL
    python -m bench.peers.celery_batches worker --redis-url URL --model-dir DIR

Needs the `bench` extra (celery, celery-batches).
"""

from __future__ import annotations

import argparse
import base64
import os
from typing import Any

import torch
import uvicorn
from celery import Celery
from celery_batches import Batches
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool

from bench.rq_baseline import _handler
from shared.models import load_model_config

REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:1/0")
MODEL_DIR = os.environ.get("BENCH_MODEL_DIR", "")
MAX_BATCH = load_model_config(__import__("pathlib").Path(MODEL_DIR)).max_batch if MODEL_DIR else 32

celery_app = Celery("bench", broker=REDIS_URL, backend=REDIS_URL)
# Batches needs the worker to prefetch at least a batch's worth of messages.
celery_app.conf.update(worker_prefetch_multiplier=0, result_expires=600, task_serializer="json")


@celery_app.task(base=Batches, flush_every=MAX_BATCH, flush_interval=0.01)
def infer(requests: list[Any]) -> None:
    handler = _handler(MODEL_DIR)
    good, tensors = [], []
    for request in requests:
        payload, content_type = request.args
        try:
            tensors.append(handler.preprocess(base64.b64decode(payload), content_type))
            good.append(request)
        except Exception as exc:  # noqa: BLE001 - one bad item must not fail the batch
            celery_app.backend.mark_as_failure(request.id, exc, request=request)
    if not good:
        return
    outputs = handler.predict(torch.stack(tensors))
    for request, row in zip(good, outputs, strict=True):
        celery_app.backend.mark_as_done(request.id, handler.postprocess(row), request=request)


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/jobs", status_code=202)
    async def submit(request: Request) -> dict[str, str]:
        body = await request.body()
        result = await run_in_threadpool(
            infer.delay, base64.b64encode(body).decode(), request.headers.get("content-type", "")
        )
        return {"id": result.id}

    @app.get("/jobs/{job_id}")
    def get(job_id: str, wait: float = 0) -> dict[str, Any]:
        result = celery_app.AsyncResult(job_id)
        try:
            value = result.get(timeout=wait or None, propagate=False) if wait else None
        except Exception:  # noqa: BLE001 - a timeout: still running
            value = None
        status = {"SUCCESS": "finished", "FAILURE": "failed"}.get(result.state, "queued")
        return {"id": job_id, "status": status, "result": value if status == "finished" else None}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["api", "worker"])
    parser.add_argument("--port", type=int, default=8300)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model-dir", default="")
    args = parser.parse_args()
    if os.environ.get("BENCH_REDIS_URL") != args.redis_url or os.environ.get("BENCH_MODEL_DIR", "") != args.model_dir:
        # The task's batch size and the app's broker are read at import: re-exec with them set.
        os.environ["BENCH_REDIS_URL"], os.environ["BENCH_MODEL_DIR"] = args.redis_url, args.model_dir
        os.execv(os.sys.executable, [os.sys.executable, "-m", "bench.peers.celery_batches", *os.sys.argv[1:]])
    if args.role == "api":
        uvicorn.run(make_app(), host="127.0.0.1", port=args.port, log_level="warning")
        return
    _handler(args.model_dir)
    celery_app.worker_main(
        [
            "worker",
            "--pool=solo",
            "--concurrency=1",
            "--loglevel=WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ]
    )


if __name__ == "__main__":
    main()
