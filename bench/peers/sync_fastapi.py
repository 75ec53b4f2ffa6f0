"""The do-it-yourself server: the model runs inside the request, uvicorn workers for concurrency.

python -m bench.peers.sync_fastapi api --port P --model-dir DIR [--workers 2]
"""

from __future__ import annotations

import argparse
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool

from shared.models import load_model_config
from workers.handlers import Handler, load_handler

app = FastAPI()


@lru_cache(maxsize=1)
def handler() -> Handler:
    loaded = load_handler(load_model_config(Path(os.environ["BENCH_MODEL_DIR"])), torch.device("cpu"))
    loaded.load()
    return loaded


@app.get("/healthz")
def healthz() -> dict[str, str]:
    handler()
    return {"status": "ok"}


@app.post("/jobs")
async def predict(request: Request) -> dict[str, Any]:
    body = await request.body()
    content_type = request.headers.get("content-type", "")
    return {"id": None, "status": "finished", "result": await run_in_threadpool(_run, body, content_type)}


def _run(body: bytes, content_type: str) -> Any:
    model = handler()
    return model.postprocess(model.predict(model.preprocess(body, content_type).unsqueeze(0))[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["api"])
    parser.add_argument("--port", type=int, default=8200)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ["BENCH_MODEL_DIR"] = args.model_dir
    uvicorn.run(
        "bench.peers.sync_fastapi:app", host="127.0.0.1", port=args.port, workers=args.workers, log_level="warning"
    )


if __name__ == "__main__":
    main()
