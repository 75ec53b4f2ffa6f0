"""Plain RQ, as its users build it: one RQ job per request, ``rq.SimpleWorker``, a batch of one.

    python -m bench.peers.plain_rq api --port 8100 --redis-url redis://127.0.0.1:6380/0
    python -m bench.peers.plain_rq worker --redis-url redis://127.0.0.1:6380/0 --model-dir models/digits \
        [--threads 2]

The API puts the payload in the job's arguments (base64: RQ's JSON serializer refuses bytes);
``GET /jobs/{id}?wait=`` waits with RQ 2's ``Job.latest_result(timeout=...)`` (a blocking XREAD
on the job's result stream). Results and jobs expire (``result_ttl``, ``ttl``, ``failure_ttl``).
"""

from __future__ import annotations

import base64
import math
import os
import time
from pathlib import Path
from typing import Annotated, Any

import torch
from fastapi import Depends, FastAPI, HTTPException, Request, Response
from redis import Redis, RedisError
from rq import Queue, SimpleWorker
from rq.exceptions import NoSuchJobError
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from bench.peers import MAX_WAIT_S, job_view, load_model, parser, run_one

QUEUE = "bench-rq"
RESULT_TTL_S = 600  # how long a result stays readable
TTL_S = 600  # how long a job may wait in the queue

# The worker process's model: loaded once, before the worker takes its first job.
MODEL: Any = None

_STATUS = {
    JobStatus.CREATED: "queued",
    JobStatus.QUEUED: "queued",
    JobStatus.DEFERRED: "queued",
    JobStatus.SCHEDULED: "queued",
    JobStatus.STARTED: "started",
    JobStatus.FINISHED: "finished",
    JobStatus.FAILED: "failed",
    JobStatus.STOPPED: "failed",
    JobStatus.CANCELED: "failed",
}


def predict(payload_b64: str, content_type: str) -> Any:
    """The RQ job: one request through the model, as a batch of one."""
    return run_one(MODEL, base64.b64decode(payload_b64), content_type)


async def raw_body(request: Request) -> bytes:
    return await request.body()


def make_app(redis_url: str) -> FastAPI:
    app = FastAPI()
    connection = Redis.from_url(redis_url)
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)

    @app.get("/healthz")
    def healthz(response: Response) -> dict[str, str]:
        try:
            connection.ping()
        except RedisError as exc:
            response.status_code = 503
            return {"status": f"redis unreachable: {exc}"}
        return {"status": "ok"}

    @app.post("/jobs", status_code=202)
    def submit(request: Request, body: Annotated[bytes, Depends(raw_body)]) -> dict[str, str]:
        job = queue.enqueue(
            predict,
            base64.b64encode(body).decode(),
            request.headers.get("content-type", ""),
            result_ttl=RESULT_TTL_S,
            ttl=TTL_S,
            failure_ttl=RESULT_TTL_S,
        )
        return {"id": job.id}

    @app.get("/jobs/{job_id}")
    def get(job_id: str, wait: float = 0) -> dict[str, Any]:
        try:
            job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        except NoSuchJobError:
            raise HTTPException(404, f"no job {job_id}") from None
        # XREAD's block is whole milliseconds; latest_result takes whole seconds.
        timeout = math.ceil(min(max(wait, 0.0), MAX_WAIT_S))
        result = job.latest_result(timeout=timeout)
        if result is None:
            status = _STATUS.get(job.get_status(), "queued")
            if status not in ("finished", "failed"):
                return job_view(job_id, status)
            result = job.latest_result()  # it ended between the two reads
            if result is None:
                return job_view(job_id, status)
        if result.type == Result.Type.SUCCESSFUL:
            return job_view(job_id, "finished", result.return_value)
        error = (result.exc_string or "").strip().splitlines()
        return job_view(job_id, "failed", error=error[-1] if error else result.type.name.lower())

    return app


def drain_rate(connection: Redis, model_dir: Path, payloads: list[bytes], content_type: str) -> float:
    """Jobs per second one SimpleWorker drains from a queue filled beforehand (the drain baseline)."""
    global MODEL
    MODEL = load_model(model_dir, torch.get_num_threads())  # loaded before the clock starts, like inferq's
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
    for payload in payloads:
        queue.enqueue(predict, base64.b64encode(payload).decode(), content_type, result_ttl=RESULT_TTL_S, ttl=TTL_S)
    worker = SimpleWorker([queue], connection=connection, serializer=JSONSerializer, name=f"bench-rq-{os.getpid()}")
    started = time.perf_counter()
    worker.work(burst=True, logging_level="WARNING")
    return len(payloads) / (time.perf_counter() - started)


def main() -> None:
    args = parser(__doc__, ["api", "worker"], redis=True, port=8100).parse_args()
    if args.role == "api":
        import uvicorn

        uvicorn.run(make_app(args.redis_url), host=args.host, port=args.port, log_level="warning")
        return
    if not args.model_dir:
        raise SystemExit("plain_rq worker: --model-dir is required")
    global MODEL
    MODEL = load_model(args.model_dir, args.threads)
    connection = Redis.from_url(args.redis_url)
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)
    SimpleWorker([queue], connection=connection, serializer=JSONSerializer).work(logging_level="WARNING")


if __name__ == "__main__":
    # Run as the importable module: the API then enqueues "bench.peers.plain_rq.predict" (not
    # "__main__.predict"), and the worker's job function sees the MODEL loaded here.
    from bench.peers.plain_rq import main as module_main

    module_main()
