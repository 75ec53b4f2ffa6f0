"""`python -m bench.vs_litserve`: inferq against LitServe, the server a user would pick instead, on the same model
and the same JPEG, one request per image, alternated rounds (docs/performance).

- inferq: `inferq api` and one `inferq worker` for the model; a request is `POST /v1/models/<m>/jobs` with the JPEG
  as its body and `Prefer: wait=60`, answered `200` with the finished job (its one-call form);
- LitServe: `bench.peers.litserve_peer`, batching as its docs advise (`max_batch_size` the model's, a 5 ms
  `batch_timeout`), the JPEG as the multipart field `file`, as its docs upload files.

Both run the model through inferq's own handler, with the torch threads each process gets by default, and `hey`
drives both at 1, 4, 16 and 64 clients. Rounds alternate inferq, LitServe, LitServe, inferq…, and each side's best
round at each load counts. Only `200` answers count as images served.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from redis import Redis

from bench.generators import hammer
from bench.procs import Processes, wait_http
from inferq.shared.redis_server import RedisServer, free_port

CLIENTS = (1, 4, 16, 64)
BATCH_TIMEOUT_S = 0.005


def multipart(field: str, filename: str, content_type: str, data: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body with one file field, and its content type."""
    boundary = secrets.token_hex(16)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _point(url: str, clients: int, seconds: float, body: bytes, headers: dict[str, str]) -> dict[str, Any]:
    hammer(url, clients, 1.0, tool="hey", method="POST", body=body, headers=headers)  # warm: the batch sizes settle
    result = hammer(url, clients, seconds, tool="hey", method="POST", body=body, headers=headers).summary()
    result["images_per_s"] = result["statuses"].get("200", 0) / result["duration_s"]
    return result


def _inferq(procs: Processes, model: str, seconds: float, image: bytes) -> dict[int, dict[str, Any]]:
    port = free_port()
    procs.start("vs-inferq-api", "inferq", "--log-level", "WARNING", "api", "--port", str(port))
    procs.start("vs-inferq-worker", "inferq", "--log-level", "WARNING", "worker", "--model", model)
    base = f"http://127.0.0.1:{port}"
    headers = {"content-type": "image/jpeg", "prefer": "wait=60"}
    return _measure(procs, f"{base}/readyz", f"{base}/v1/models/{model}/jobs", image, headers, seconds)


def _litserve(procs: Processes, model_dir: Path, max_batch: int, seconds: float, image: bytes) -> dict[int, Any]:
    port = free_port()
    args = ["--port", str(port), "--model-dir", str(model_dir), "--max-batch", str(max_batch)]
    procs.start("vs-litserve", "bench.peers.litserve_peer", "api", *args, "--batch-timeout", str(BATCH_TIMEOUT_S))
    base = f"http://127.0.0.1:{port}"
    body, content_type = multipart("file", "image.jpg", "image/jpeg", image)
    return _measure(procs, f"{base}/healthz", f"{base}/predict", body, {"content-type": content_type}, seconds)


def _measure(
    procs: Processes, health: str, url: str, body: bytes, headers: dict[str, str], seconds: float
) -> dict[int, dict[str, Any]]:
    """The started server's load points, once it answers a request with 200 (its model loaded and warm); then it is
    stopped, whatever happened."""
    try:
        wait_http(health, timeout_s=120)
        deadline = time.monotonic() + 120
        while not hammer(url, 1, 1.0, tool="hey", method="POST", body=body, headers=headers).statuses.get("200"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} never answered 200")
            time.sleep(0.5)
        return {c: _point(url, c, seconds, body, headers) for c in CLIENTS}
    finally:
        procs.stop()


def vs_litserve(
    redis_url: str, models_dir: Path, model: str, image: bytes, max_batch: int, rounds: int, seconds: float, logs: Path
) -> dict[str, Any]:
    """Alternated rounds, inferq and LitServe on one model; each side's best round per client count."""
    procs = Processes(logs, {"INFERQ_REDIS_URL": redis_url, "INFERQ_MODELS_DIR": str(models_dir)})
    best: dict[str, dict[int, dict[str, Any]]] = {"inferq": {}, "litserve": {}}
    rows: list[dict[str, Any]] = []
    order = ["inferq", "litserve", "litserve", "inferq"] * rounds
    for side in order[: 2 * rounds]:
        Redis.from_url(redis_url).flushall()
        if side == "inferq":
            points = _inferq(procs, model, seconds, image)
        else:
            points = _litserve(procs, models_dir / model, max_batch, seconds, image)
        for clients, point in points.items():
            rows.append({"side": side, "clients": clients, **point})
            if clients not in best[side] or point["images_per_s"] > best[side][clients]["images_per_s"]:
                best[side][clients] = point
    table = [
        {
            "clients": c,
            "inferq_per_s": best["inferq"][c]["images_per_s"],
            "litserve_per_s": best["litserve"][c]["images_per_s"],
            "inferq_p50_ms": best["inferq"][c]["p50_ms"],
            "litserve_p50_ms": best["litserve"][c]["p50_ms"],
            "ratio": best["inferq"][c]["images_per_s"] / max(best["litserve"][c]["images_per_s"], 1e-9),
        }
        for c in CLIENTS
    ]
    return {"model": model, "max_batch": max_batch, "batch_timeout_s": BATCH_TIMEOUT_S, "points": table, "rounds": rows}


def markdown(result: dict[str, Any], bare_per_s: float | None = None) -> str:
    lines = [
        "| clients | inferq img/s | LitServe img/s | inferq / LitServe | p50 inferq / LitServe (ms) |",
        "|---|---|---|---|---|",
    ]
    for p in result["points"]:
        lines.append(
            f"| {p['clients']} | {p['inferq_per_s']:.1f} | {p['litserve_per_s']:.1f} | {p['ratio']:.2f}× "
            f"| {p['inferq_p50_ms'] or 0:.0f} / {p['litserve_p50_ms'] or 0:.0f} |"
        )
    if bare_per_s:
        top = result["points"][-1]
        lines.append("")
        lines.append(
            f"Bare model, batch {result['max_batch']}, same run: {bare_per_s:.1f} img/s; at {top['clients']} clients "
            f"inferq is {top['inferq_per_s'] / bare_per_s:.2f}× it, LitServe {top['litserve_per_s'] / bare_per_s:.2f}×."
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="each load point's length")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if shutil.which("hey") is None:
        raise SystemExit("bench.vs_litserve needs hey (apt-get install hey)")
    from bench.models import build_models
    from bench.run import RESNET_MAX_BATCH, bare_model, payloads_for

    tmp = Path(tempfile.mkdtemp(prefix="inferq-vs-litserve-"))
    models = build_models(tmp / "models", resnet_max_batch=RESNET_MAX_BATCH)
    bare = bare_model(models["resnet"], [RESNET_MAX_BATCH], 3.0)
    image = payloads_for("resnet", 1)[0][0]
    redis = RedisServer(tmp / "redis", appendonly=False)
    redis.start()
    try:
        result = vs_litserve(
            redis.url, tmp / "models", "resnet", image, RESNET_MAX_BATCH, args.rounds, args.seconds, tmp
        )
    finally:
        redis.stop()
    result["bare_per_s"] = bare["best_items_per_s"]
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result, result["bare_per_s"]))


if __name__ == "__main__":
    main()
