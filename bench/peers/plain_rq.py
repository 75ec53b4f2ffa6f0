"""Plain RQ: one RQ job per request, run by RQ's SimpleWorker, no batching.

python -m bench.peers.plain_rq api --port P --redis-url URL
python -m bench.peers.plain_rq worker --redis-url URL --model-dir DIR
"""

from __future__ import annotations

import argparse
import base64

import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from redis import Redis
from rq import Queue, SimpleWorker
from rq.job import Job
from rq.serializers import JSONSerializer

from bench.rq_baseline import MODEL_DIR, QUEUE, _handler, run_item


def make_app(redis_url: str) -> FastAPI:
    app = FastAPI()
    connection = Redis.from_url(redis_url)
    queue = Queue(QUEUE, connection=connection, serializer=JSONSerializer)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/jobs", status_code=202)
    async def submit(request: Request) -> dict[str, str]:
        body = await request.body()
        content_type = request.headers.get("content-type", "")
        job = await run_in_threadpool(
            queue.enqueue, run_item, base64.b64encode(body).decode(), content_type, result_ttl=600, ttl=600
        )
        return {"id": job.id}

    @app.get("/jobs/{job_id}")
    def get(job_id: str, wait: float = 0) -> dict[str, object]:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        result = job.latest_result(timeout=int(wait)) if wait else job.latest_result()
        if result is None:
            return {"id": job_id, "status": job.get_status(), "result": None}
        status = "finished" if result.type == result.Type.SUCCESSFUL else "failed"
        return {"id": job_id, "status": status, "result": result.return_value}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["api", "worker"])
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--model-dir", default="")
    args = parser.parse_args()
    if args.role == "api":
        uvicorn.run(make_app(args.redis_url), host="127.0.0.1", port=args.port, log_level="warning")
        return
    MODEL_DIR["path"] = args.model_dir
    _handler(args.model_dir)  # the model stays loaded in the worker process
    connection = Redis.from_url(args.redis_url)
    worker = SimpleWorker(
        [Queue(QUEUE, connection=connection, serializer=JSONSerializer)],
        connection=connection,
        serializer=JSONSerializer,
    )
    worker.work(logging_level="WARNING")


if __name__ == "__main__":
    main()
