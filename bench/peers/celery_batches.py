"""Celery on Redis (broker and result backend), batching with celery-batches' ``Batches`` task.

    python -m bench.peers.celery_batches api --port 8300 --redis-url redis://127.0.0.1:6380/0
    python -m bench.peers.celery_batches worker --redis-url redis://127.0.0.1:6380/0 --model-dir models/digits \
        [--threads 2]

The API sends one task message per request (``infer.delay(payload_b64, content_type)``) and waits
with ``AsyncResult(id).get(timeout=wait)``. The worker (``--pool=solo``, concurrency 1: the model
batches, one process holds it) buffers the messages and runs them as one batch every
``max_batch`` messages (the model config's) or every 10 ms, storing each request's result with
``backend.mark_as_done``, as celery-batches' documentation shows. Needs the ``bench`` extra
(``celery[redis]``, ``celery-batches``). Celery cannot tell an unknown task id from a queued one:
such a GET answers ``"queued"`` after the wait, never ``404``.
"""

from __future__ import annotations

import base64
import contextlib
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request, Response
from redis import Redis, RedisError

from bench.peers import MAX_WAIT_S, job_view, load_model, parser

try:
    from celery import Celery
    from celery.exceptions import TimeoutError as CeleryTimeout
    from celery.result import AsyncResult
    from celery_batches import Batches, SimpleRequest
except ImportError as exc:  # the bench extra is not installed
    hint = "pip install 'celery[redis]' celery-batches"
    raise SystemExit(f"celery peer unavailable: {exc}; install it with {hint}") from exc

TASK = "bench.celery_batches.infer"
RESULT_TTL_S = 600
FLUSH_INTERVAL_S = 0.01

celery_app = Celery("bench_celery")
celery_app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=RESULT_TTL_S,
    # celery-batches: the worker must prefetch more than flush_every messages; 0 means no limit.
    worker_prefetch_multiplier=0,
    broker_connection_retry_on_startup=True,
)

# The worker process's model: loaded once before the worker consumes.
MODEL: Any = None

_STATUS = {"SUCCESS": "finished", "FAILURE": "failed", "REVOKED": "failed", "STARTED": "started"}


# flush_every is set from the model's max_batch when the worker starts (the task reads it per message).
@celery_app.task(base=Batches, name=TASK, flush_every=32, flush_interval=FLUSH_INTERVAL_S)
def infer(requests: list[SimpleRequest]) -> None:
    import torch

    items, accepted = [], []
    for request in requests:
        payload_b64, content_type = request.args
        try:
            items.append(MODEL.preprocess(base64.b64decode(payload_b64), content_type))
            accepted.append(request)
        except Exception as exc:  # one bad input fails alone, not its batch
            # call_errbacks=False: a SimpleRequest has no errbacks attribute.
            celery_app.backend.mark_as_failure(request.id, exc, request=request, call_errbacks=False)
    if not items:
        return
    outputs = MODEL.predict(torch.stack(items))
    for request, row in zip(accepted, outputs, strict=True):
        celery_app.backend.mark_as_done(request.id, MODEL.postprocess(row), request=request)


async def raw_body(request: Request) -> bytes:
    return await request.body()


def make_app() -> FastAPI:
    app = FastAPI()
    broker = Redis.from_url(celery_app.conf.broker_url)

    @app.get("/healthz")
    def healthz(response: Response) -> dict[str, str]:
        try:
            broker.ping()
        except RedisError as exc:
            response.status_code = 503
            return {"status": f"broker unreachable: {exc}"}
        return {"status": "ok"}

    @app.post("/jobs", status_code=202)
    def submit(request: Request, body: Annotated[bytes, Depends(raw_body)]) -> dict[str, str]:
        result = infer.delay(base64.b64encode(body).decode(), request.headers.get("content-type", ""))
        return {"id": result.id}

    @app.get("/jobs/{job_id}")
    def get(job_id: str, wait: float = 0) -> dict[str, Any]:
        result = AsyncResult(job_id, app=celery_app)
        wait = min(max(wait, 0.0), MAX_WAIT_S)
        if wait:
            with contextlib.suppress(CeleryTimeout):  # still queued: say so
                result.get(timeout=wait, propagate=False)
        status = _STATUS.get(result.state, "queued")
        if status == "finished":
            return job_view(job_id, status, result.result)
        if status == "failed":
            return job_view(job_id, status, error=repr(result.result))
        return job_view(job_id, status)

    return app


def main() -> None:
    args = parser(__doc__, ["api", "worker"], redis=True, port=8300).parse_args()
    celery_app.conf.update(broker_url=args.redis_url, result_backend=args.redis_url)
    if args.role == "api":
        import uvicorn

        uvicorn.run(make_app(), host=args.host, port=args.port, log_level="warning")
        return
    if not args.model_dir:
        raise SystemExit("celery_batches worker: --model-dir is required")
    global MODEL
    MODEL = load_model(args.model_dir, args.threads)
    infer.flush_every = MODEL.config.max_batch
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
    # Run as the importable module, so the task the worker runs sees the MODEL loaded here.
    from bench.peers.celery_batches import main as module_main

    module_main()
