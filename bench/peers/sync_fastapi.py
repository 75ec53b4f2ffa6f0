"""The do-it-yourself server: the model runs inside the request; uvicorn workers for concurrency.

    python -m bench.peers.sync_fastapi api --port 8200 --model-dir models/digits [--workers 2] [--threads 2]

``POST /jobs`` answers ``200 {"id": null, "status": "finished", "result": ...}`` (``422``/``415``
with ``"status": "failed"`` for an input the model refuses); there is no queue, so ``GET /jobs/{id}``
is always ``404``. The endpoint is a plain ``def``: FastAPI runs it on its threadpool. Each uvicorn
worker process imports this module afresh and loads the model at startup, from the environment
(``BENCH_MODEL_DIR``, ``BENCH_THREADS``) that ``main`` sets before it starts them.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse

from bench.peers import job_view, load_model, parser, run_one
from inferq.shared.errors import InvalidInput, UnsupportedMedia

MODEL: Any = None


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    global MODEL
    MODEL = load_model(os.environ["BENCH_MODEL_DIR"], int(os.environ.get("BENCH_THREADS", "2")))
    yield


app = FastAPI(lifespan=lifespan)


async def raw_body(request: Request) -> bytes:
    return await request.body()


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}  # lifespan has loaded the model before the first request


@app.post("/jobs", response_model=None)
def predict(request: Request, body: Annotated[bytes, Depends(raw_body)]) -> dict[str, Any] | JSONResponse:
    try:
        result = run_one(MODEL, body, request.headers.get("content-type", ""))
    except InvalidInput as exc:
        code = 415 if isinstance(exc, UnsupportedMedia) else 422
        return JSONResponse(job_view(None, "failed", error=exc.message), status_code=code)
    return job_view(None, "finished", result)


@app.get("/jobs/{job_id}")
def get(job_id: str) -> None:
    raise HTTPException(404, "a synchronous server keeps no jobs: the result came with the POST")


def main() -> None:
    args = parser(__doc__, ["api"], redis=False, port=8200)
    args.add_argument("--workers", type=int, default=2, help="uvicorn worker processes, each with the model")
    options = args.parse_args()
    if not options.model_dir:
        raise SystemExit("sync_fastapi: --model-dir is required")
    import uvicorn

    # The workers re-import this module: they find the model through the environment.
    os.environ["BENCH_MODEL_DIR"] = os.path.abspath(options.model_dir)
    os.environ["BENCH_THREADS"] = str(options.threads)
    uvicorn.run(
        "bench.peers.sync_fastapi:app",
        host=options.host,
        port=options.port,
        workers=options.workers,
        log_level="warning",
    )


if __name__ == "__main__":
    main()
