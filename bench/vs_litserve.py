"""`python -m bench.vs_litserve [--model resnet|langid]`: inferq against LitServe, the server a user would pick
instead, on the same model and the same inputs, one request per input, alternated rounds (docs/performance).

- inferq: `inferq api` and one `inferq worker` for the model; a request is `POST /v1/models/<m>/jobs` with the input
  as its body and `Prefer: wait=60`, answered `200` with the finished job (its one-call form);
- LitServe: `bench.peers.litserve_peer`, batching as its docs advise (`max_batch_size` the model's, a 5 ms
  `batch_timeout`); an image is the multipart field `file`, as its docs upload files, a text the JSON `{"input"}`.

Two models:

- `resnet`, the ResNet-18-sized CNN, max batch 8: one 224×224 JPEG for every request, `hey` at 1, 4, 16, 64 clients;
- `langid`, the text demo (a tiny BERT, max batch 64, `max_batch_tokens` 4096): texts of a realistic spread of
  lengths (`texts()`: a few words to a paragraph, cut at the model's 128 tokens), each request the next text, so
  `wrk` drives it (hey sends one body). LitServe pads each batch to its longest text, as its users' batches do;
  inferq groups a batch by length within its token budget. The padding waste of both is measured: inferq's from its
  `/metrics` (`inferq_batch_padded_tokens_total`), LitServe's from the peer's `--stats` file.

Both run the model through inferq's own handler, with the torch threads each process gets by default. Rounds
alternate inferq, LitServe, LitServe, inferq…, and each side's best round at each load counts. Only `200` answers
count as items served.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import httpx
from redis import Redis

from bench.generators import LoadResult, hammer
from bench.procs import Processes, wait_http
from inferq.shared.redis_server import RedisServer, free_port

CLIENTS = (1, 4, 16, 64)
BATCH_TIMEOUT_S = 0.005
TEXT_MAX_BATCH = 64  # langid's max_batch: LitServe's max_batch_size, as its docs advise
TEXT_LOCALES = ("en_US", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL", "pl_PL", "cs_CZ")  # langid's languages
# Words per text: log-normal, median 12, most between 3 and 50: queries and sentences beside a few paragraphs.
TEXT_MEDIAN_WORDS, TEXT_SIGMA, TEXT_MAX_WORDS = 12, 0.9, 160


def texts(count: int = 512, seed: int = 0) -> list[str]:
    """Texts in langid's languages, of a realistic spread of lengths, from the word lists faker ships."""
    rng = random.Random(seed)
    lists = [import_module(f"faker.providers.lorem.{locale}").Provider.word_list for locale in TEXT_LOCALES]
    out = []
    for _ in range(count):
        words = rng.choice(lists)
        n = min(TEXT_MAX_WORDS, max(1, round(rng.lognormvariate(math.log(TEXT_MEDIAN_WORDS), TEXT_SIGMA))))
        out.append(" ".join(rng.choice(words) for _ in range(n)).capitalize() + ".")
    return out


@dataclass
class Inputs:
    """What each side sends: one body for every request (hey), or a mix sent in turn (wrk)."""

    inferq: list[bytes]
    inferq_type: str
    litserve: list[bytes]
    litserve_type: str

    def load(self, side: str) -> Callable[[str, int, float], LoadResult]:
        bodies = self.inferq if side == "inferq" else self.litserve
        content_type = self.inferq_type if side == "inferq" else self.litserve_type
        headers = {"content-type": content_type, **({"prefer": "wait=60"} if side == "inferq" else {})}
        if len(bodies) == 1:
            return lambda url, c, s: hammer(url, c, s, tool="hey", method="POST", body=bodies[0], headers=headers)
        return lambda url, c, s: hammer(url, c, s, tool="wrk", method="POST", bodies=bodies, headers=headers)


def image_inputs(image: bytes) -> Inputs:
    body, content_type = multipart("file", "image.jpg", "image/jpeg", image)
    return Inputs([image], "image/jpeg", [body], content_type)


def text_inputs(corpus: list[str]) -> Inputs:
    return Inputs(
        [t.encode() for t in corpus],
        "text/plain; charset=utf-8",
        [json.dumps({"input": t}).encode() for t in corpus],
        "application/json",
    )


def multipart(field: str, filename: str, content_type: str, data: bytes) -> tuple[bytes, str]:
    """A multipart/form-data body with one file field, and its content type."""
    boundary = secrets.token_hex(16)
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()
    return head + data + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


def _point(load: Callable[[str, int, float], LoadResult], url: str, clients: int, seconds: float) -> dict[str, Any]:
    load(url, clients, 1.0)  # warm: the batch sizes settle
    result = load(url, clients, seconds).summary()
    # hey counts answers by status; wrk counts the 2xx and 3xx together (a 3xx is never answered here).
    served = result["statuses"].get("200", 0) if result["tool"] == "hey" else result["ok"]
    result["images_per_s"] = served / result["duration_s"]
    return result


# inferq's fill-wait policies beside its default (adaptive), on the CNN: the worker's settings for each
# (workers/fill.py). The fixed wait is LitServe's batch_timeout.
POLICIES = {
    "inferq": {},
    "inferq greedy": {"INFERQ_BATCH_WAIT": "greedy"},
    f"inferq fixed {BATCH_TIMEOUT_S * 1000:g} ms": {"INFERQ_MAX_WAIT_MS": f"{BATCH_TIMEOUT_S * 1000:g}"},
}


def _inferq(procs: Processes, model: str, seconds: float, inputs: Inputs, env: dict[str, str]) -> dict[str, Any]:
    port = free_port()
    procs.start("vs-inferq-api", "inferq", "--log-level", "WARNING", "api", "--port", str(port))
    procs.start("vs-inferq-worker", "inferq", "--log-level", "WARNING", "worker", "--model", model, env=env)
    base = f"http://127.0.0.1:{port}"
    return _measure(
        procs, f"{base}/readyz", f"{base}/v1/models/{model}/jobs", inputs.load("inferq"), seconds, lambda: _scrape(base)
    )


def _litserve(procs: Processes, model_dir: Path, max_batch: int, seconds: float, inputs: Inputs) -> dict[str, Any]:
    port = free_port()
    args = ["--port", str(port), "--model-dir", str(model_dir), "--max-batch", str(max_batch)]
    stats = procs.log_dir / f"litserve-stats-{port}.json"
    if len(inputs.litserve) > 1:
        args += ["--text", "--stats", str(stats)]
    procs.start("vs-litserve", "bench.peers.litserve_peer", "api", *args, "--batch-timeout", str(BATCH_TIMEOUT_S))
    base = f"http://127.0.0.1:{port}"
    read = lambda: json.loads(stats.read_text()) if stats.exists() else {}  # noqa: E731
    return _measure(procs, f"{base}/healthz", f"{base}/predict", inputs.load("litserve"), seconds, read)


def _scrape(base: str) -> dict[str, float]:
    """inferq's token counters, from its /metrics."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    out = {}
    for name, key in (("inferq_batch_tokens_total", "tokens"), ("inferq_batch_padded_tokens_total", "padded_tokens")):
        found = re.findall(rf"^{name}{{[^}}]*}} ([0-9.e+]+)$", text, re.M)
        if found:
            out[key] = sum(float(v) for v in found)
    return out


def _measure(
    procs: Processes,
    health: str,
    url: str,
    load: Callable[[str, int, float], LoadResult],
    seconds: float,
    counts: Callable[[], dict[str, Any]],
) -> dict[str, Any]:
    """The started server's load points, once it answers a request with 200 (its model loaded and warm), and its
    token counts after them; then it is stopped, whatever happened."""
    try:
        wait_http(health, timeout_s=120)
        deadline = time.monotonic() + 120
        while not load(url, 1, 1.0).ok:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} never answered 200")
            time.sleep(0.5)
        points = {c: _point(load, url, c, seconds) for c in CLIENTS}
        return {"points": points, "counts": counts()}
    finally:
        procs.stop()


def padding_waste(counts: dict[str, Any]) -> float | None:
    """The share of the padded token grid that was padding."""
    padded = counts.get("padded_tokens")
    return 1.0 - counts.get("tokens", 0) / padded if padded else None


def vs_litserve(
    redis_url: str,
    models_dir: Path,
    model: str,
    inputs: Inputs,
    max_batch: int,
    rounds: int,
    seconds: float,
    logs: Path,
    policies: bool = False,
) -> dict[str, Any]:
    """Alternated rounds, inferq and LitServe on one model; each side's best round per client count. With
    ``policies``, inferq's other fill-wait policies (``POLICIES``) run as sides of their own, in the same rounds."""
    procs = Processes(logs, {"INFERQ_REDIS_URL": redis_url, "INFERQ_MODELS_DIR": str(models_dir)})
    sides = ["inferq", "litserve", *(list(POLICIES)[1:] if policies else [])]
    best: dict[str, dict[int, dict[str, Any]]] = {side: {} for side in sides}
    waste: dict[str, list[float]] = {side: [] for side in sides}
    rows: list[dict[str, Any]] = []
    order = [*sides, *reversed(sides)] * rounds
    for side in order[: len(sides) * rounds]:
        Redis.from_url(redis_url).flushall()
        if side == "litserve":
            measured = _litserve(procs, models_dir / model, max_batch, seconds, inputs)
        else:
            measured = _inferq(procs, model, seconds, inputs, POLICIES[side])
        share = padding_waste(measured["counts"])
        if share is not None:
            waste[side].append(share)
        for clients, point in measured["points"].items():
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
    policy_table = [
        {
            "clients": c,
            **{side: {"per_s": best[side][c]["images_per_s"], "p50_ms": best[side][c]["p50_ms"]} for side in POLICIES},
        }
        for c in CLIENTS
        if policies
    ]
    return {
        "model": model,
        "max_batch": max_batch,
        "batch_timeout_s": BATCH_TIMEOUT_S,
        "inputs": len(inputs.inferq),
        "padding_waste": {side: sum(v) / len(v) for side, v in waste.items() if v},
        "points": table,
        "policies": policy_table,
        "rounds": rows,
    }


def policies_markdown(result: dict[str, Any]) -> str:
    """inferq's fill-wait policies side by side: what each served, and its p50."""
    table = result.get("policies") or []
    if not table:
        return ""
    names = list(POLICIES)
    head = ["adaptive (the default)" if n == "inferq" else n.removeprefix("inferq ") for n in names]
    lines = [
        "| clients | "
        + " | ".join(f"{h} img/s" for h in head)
        + " | adaptive / greedy | adaptive / fixed | p50 (ms) |",
        "|---|" + "---|" * (len(names) + 3),
    ]
    for row in table:
        per_s = [row[n]["per_s"] for n in names]
        p50 = " / ".join(f"{row[n]['p50_ms'] or 0:.0f}" for n in names)
        lines.append(
            f"| {row['clients']} | "
            + " | ".join(f"{v:.1f}" for v in per_s)
            + f" | {per_s[0] / max(per_s[1], 1e-9):.2f}× | {per_s[0] / max(per_s[2], 1e-9):.2f}× | {p50} |"
        )
    return "\n".join(lines)


def markdown(result: dict[str, Any], bare_per_s: float | None = None) -> str:
    unit = "texts/s" if result.get("model") == "langid" else "img/s"
    lines = [
        f"| clients | inferq {unit} | LitServe {unit} | inferq / LitServe | p50 inferq / LitServe (ms) |",
        "|---|---|---|---|---|",
    ]
    for p in result["points"]:
        lines.append(
            f"| {p['clients']} | {p['inferq_per_s']:.1f} | {p['litserve_per_s']:.1f} | {p['ratio']:.2f}× "
            f"| {p['inferq_p50_ms'] or 0:.0f} / {p['litserve_p50_ms'] or 0:.0f} |"
        )
    waste = result.get("padding_waste") or {}
    if waste:
        lines.append("")
        lines.append(
            "Padding waste (padding's share of the token positions run): "
            + ", ".join(f"{side} {share:.0%}" for side, share in sorted(waste.items()))
            + "."
        )
    if bare_per_s:
        top = result["points"][-1]
        lines.append("")
        lines.append(
            f"Bare model, batch {result['max_batch']}, same run: {bare_per_s:.1f} {unit}; at {top['clients']} clients "
            f"inferq is {top['inferq_per_s'] / bare_per_s:.2f}× it, LitServe {top['litserve_per_s'] / bare_per_s:.2f}×."
        )
        fast = result.get("bare_worker_per_s")
        if fast:
            form = result.get("bare_worker_form", "")
            lines.append(
                f"inferq's worker runs this model {form} (it times its layouts and its fused graph at load,"
                f" workers/running.py); the bare model so: {fast:.1f} {unit}, inferq {top['inferq_per_s'] / fast:.2f}×"
                " it. LitServe runs the model as given, as its users' code does. Each bare figure is the faster of the"
                " loops right before and right after the rounds."
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["resnet", "langid"], default="resnet")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=8.0, help="each load point's length")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--policies", action="store_true", help="also inferq greedy and with a fixed wait (the CNN)")
    args = parser.parse_args()
    tool = "wrk" if args.model == "langid" else "hey"
    if shutil.which(tool) is None:
        raise SystemExit(f"bench.vs_litserve --model {args.model} needs {tool} (apt-get install {tool})")
    from bench.models import build_models
    from bench.run import RESNET_MAX_BATCH, bare_neighbours, payloads_for

    tmp = Path(tempfile.mkdtemp(prefix="inferq-vs-litserve-"))
    models = build_models(tmp / "models", resnet_max_batch=RESNET_MAX_BATCH)
    before = None
    if args.model == "resnet":
        before = bare_neighbours(models["resnet"], None, 3.0)
        inputs, max_batch = image_inputs(payloads_for("resnet", 1)[0][0]), RESNET_MAX_BATCH
    else:
        inputs, max_batch = text_inputs(texts()), TEXT_MAX_BATCH
    redis = RedisServer(tmp / "redis", appendonly=False)
    redis.start()
    try:
        result = vs_litserve(
            redis.url, tmp / "models", args.model, inputs, max_batch, args.rounds, args.seconds, tmp, args.policies
        )
    finally:
        redis.stop()
    if before is not None:
        result.update(bare_neighbours(models["resnet"], before, 3.0))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2))
    print(markdown(result, result.get("bare_per_s")))
    if result["policies"]:
        print()
        print(policies_markdown(result))


if __name__ == "__main__":
    main()
