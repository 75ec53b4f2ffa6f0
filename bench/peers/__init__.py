"""The benchmark's peers: how users of other tools serve a PyTorch model, behind one HTTP contract.

Each peer is a module run as ``python -m bench.peers.<name> <role> [options]``:

- ``plain_rq``: plain RQ, one job per request on ``rq.SimpleWorker`` (roles ``api``, ``worker``);
- ``sync_fastapi``: the model runs inside the request, ``uvicorn --workers N`` (role ``api``);
- ``celery_batches``: Celery on Redis with celery-batches' ``Batches`` task (roles ``api``, ``worker``).

The contract every peer's API serves, so that the driver treats them alike:

- ``POST /jobs``, the raw input bytes as the body (``image/*`` or ``application/json``, the same
  payloads inferq's handlers take) -> ``202 {"id": "..."}``; the synchronous peer answers
  ``200 {"id": null, "status": "finished", "result": ...}`` at once instead;
- ``GET /jobs/{id}?wait=SECONDS`` -> blocks up to SECONDS for the job to end, then
  ``200 {"id", "status": "finished" | "failed" | "queued" | "started", "result", "error"}``;
  ``404`` for a job the peer does not know;
- ``GET /healthz`` -> ``200`` once the process can serve.

Only the serving architecture differs: every peer runs inferq's own handler (``load_handler``,
``preprocess``, ``predict``, ``postprocess``) on the CPU (or ``INFERQ_BENCH_DEVICE``), so pre- and
postprocessing are identical.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inferq.workers.handlers import Handler

# A GET never blocks longer than this, whatever ?wait= asks.
MAX_WAIT_S = 60.0


def load_model(model_dir: str | Path, threads: int) -> Handler:
    """inferq's handler for the model folder, weights loaded, with ``threads`` torch threads: on the CPU, or on
    the device ``INFERQ_BENCH_DEVICE`` names (``bench.gpu`` runs the peers on the GPU beside inferq)."""
    # torch only here: the queue peers' API processes never run the model.
    import torch

    from inferq.shared.models import load_model_config
    from inferq.workers.handlers import load_handler

    torch.set_num_threads(threads)
    device = torch.device(os.environ.get("INFERQ_BENCH_DEVICE", "cpu"))
    handler = load_handler(load_model_config(Path(model_dir).resolve()), device)
    handler.load()
    return handler


def run_one(handler: Handler, payload: bytes, content_type: str) -> Any:
    """One request through the model as a batch of one: preprocess, predict, postprocess."""
    (result,) = handler.run([(payload, content_type)])
    return result


def job_view(job_id: str | None, status: str, result: Any = None, error: str | None = None) -> dict[str, Any]:
    """The body every peer answers for a job."""
    return {"id": job_id, "status": status, "result": result, "error": error}


def parser(description: str | None, roles: list[str], *, redis: bool, port: int) -> argparse.ArgumentParser:
    """The command line the peers share: ``<role> [--port] [--redis-url] [--model-dir] [--threads]``."""
    out = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    out.add_argument("role", choices=roles)
    out.add_argument("--port", type=int, default=port, help="the API's port (api role)")
    out.add_argument("--host", default="127.0.0.1", help="the API's address (api role)")
    if redis:
        out.add_argument("--redis-url", required=True, help="Redis for the queue (and the results)")
    out.add_argument("--model-dir", default="", help="an inferq model folder: config.json + TorchScript weights")
    out.add_argument("--threads", type=int, default=2, help="torch.set_num_threads in each model process")
    return out
