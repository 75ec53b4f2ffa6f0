"""The benchmark's outputs: JSON, a markdown table with the targets, and a PNG plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TARGETS_DOC = {
    "drain": "worker drain, no-op model: >= 25x RQ SimpleWorker",
    "e2e_noop": "end to end, no-op model: >= 5x the plain-RQ peer",
    "saturation": "ResNet at saturation: >= 0.9x the bare model at the worker's max batch",
    "idle_latency": "one client: p50 <= bare batch-1 time + 5 ms",
    "keys": "after results expire, no more keys than before the run",
    "bulk_drain": "bulk batch, no-op model, submit + drain per item: >= 3x cheaper than single jobs",
    "lanes_latency": "one client during a bulk drain: p50 <= idle p50 + one batch time",
}


def _best(points: list[dict[str, Any]]) -> dict[str, Any]:
    return max(points, key=lambda p: p["throughput_per_s"])


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured ratio and whether it holds."""
    out = []
    systems = results.get("systems", {})
    inferq = systems.get("inferq", {})
    drain = results.get("drain")
    if drain:
        out.append(
            _target(
                "drain",
                drain["ratio"],
                25.0,
                f"{drain['inferq_jobs_per_s']:.0f} vs {drain['rq_jobs_per_s']:.0f} jobs/s",
            )
        )
    plain = systems.get("plain_rq", {})
    if "noop" in inferq and "noop" in plain:
        ours, theirs = _best(inferq["noop"]["closed"]), _best(plain["noop"]["closed"])
        ratio = ours["throughput_per_s"] / max(theirs["throughput_per_s"], 1e-9)
        out.append(
            _target(
                "e2e_noop", ratio, 5.0, f"{ours['throughput_per_s']:.0f} vs {theirs['throughput_per_s']:.0f} jobs/s"
            )
        )
    bare = results.get("bare", {}).get("resnet")
    if bare and "resnet" in inferq:
        at_max = bare["points"][-1]
        ours = _best(inferq["resnet"]["closed"])
        out.append(
            _target(
                "saturation",
                ours["throughput_per_s"] / at_max["items_per_s"],
                0.9,
                f"{ours['throughput_per_s']:.1f} vs {at_max['items_per_s']:.1f} img/s "
                f"(bare at batch {at_max['batch']})",
            )
        )
        one = inferq["resnet"]["closed"][0]
        bare_one = bare["points"][0]["batch_ms"]
        overhead = (one["p50_ms"] or 0) - bare_one
        out.append(
            {
                "name": "idle_latency",
                "doc": TARGETS_DOC["idle_latency"],
                "value": overhead,
                "holds": overhead <= 5.0,
                "detail": f"p50 {one['p50_ms']:.1f} ms vs bare {bare_one:.1f} ms (+{overhead:.1f} ms)",
            }
        )
    bulk_drain = results.get("bulk_drain")
    if bulk_drain:
        out.append(
            _target(
                "bulk_drain",
                bulk_drain["ratio"],
                3.0,
                f"{bulk_drain['bulk_us_per_item']:.0f} vs {bulk_drain['single_us_per_item']:.0f} us/item, "
                f"{bulk_drain['items']:,} items",
            )
        )
    lanes = results.get("lanes")
    if lanes:
        allowed = lanes["idle_p50_ms"] + lanes["batch_ms"]
        out.append(
            {
                "name": "lanes_latency",
                "doc": TARGETS_DOC["lanes_latency"],
                "value": lanes["during_p50_ms"],
                "holds": lanes["during_p50_ms"] <= allowed and lanes["bulk_finished"] == lanes["items"],
                "detail": f"p50 {lanes['during_p50_ms']:.1f} ms during vs {lanes['idle_p50_ms']:.1f} ms idle "
                f"+ {lanes['batch_ms']:.1f} ms batch; bulk run of {lanes['items']} finished {lanes['bulk_finished']}",
            }
        )
    keys = results.get("keys")
    if keys:
        out.append(
            {
                "name": "keys",
                "doc": TARGETS_DOC["keys"],
                "value": keys["after"] - keys["before"],
                "holds": keys["after"] <= keys["before"],
                "detail": f"{keys['before']} before, {keys['after']} after",
            }
        )
    return out


def _target(name: str, ratio: float, goal: float, detail: str) -> dict[str, Any]:
    return {
        "name": name,
        "doc": TARGETS_DOC[name],
        "value": ratio,
        "holds": ratio >= goal,
        "detail": f"{ratio:.2f}x ({detail})",
    }


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"Machine: {machine['platform']}, {machine['cpus']} CPUs, torch {machine['torch']} on "
        f"{machine['device']}; {results['point_seconds']:.0f} s per load point; run took "
        f"{results.get('wall_s', 0) / 60:.1f} min.",
        "",
        "| target | measured | holds |",
        "|---|---|---|",
    ]
    for target in targets(results):
        lines.append(f"| {target['doc']} | {target['detail']} | {'yes' if target['holds'] else '**no**'} |")
    lines += ["", "ResNet-18-sized CNN, 224x224 JPEG in, closed loop (each client: submit, then wait):", ""]
    lines += [
        "| system | clients | throughput img/s | p50 ms | p95 ms | p99 ms | mean batch | queue ms | model ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, system in results.get("systems", {}).items():
        if "unavailable" in system:
            lines.append(f"| {name} | unavailable: {system['unavailable'][:80]} | | | | | | | |")
            continue
        for point in system.get("resnet", {}).get("closed", []):
            lines.append(_row(name, point))
    bare = results.get("bare", {}).get("resnet", {})
    for point in bare.get("points", []):
        lines.append(
            f"| bare model | batch {point['batch']} | {point['items_per_s']:.1f} | "
            f"{point['batch_ms']:.1f} | | | {point['batch']} | | |"
        )
    open_points = results.get("systems", {}).get("inferq", {}).get("resnet", {}).get("open", [])
    if open_points:
        lines += [
            "",
            "inferq, ResNet, open loop (Poisson arrivals at a fraction of the bare model's best):",
            "",
            "| offered img/s | throughput | p50 ms | p95 ms | p99 ms | mean batch |",
            "|---|---|---|---|---|---|",
        ]
        for p in open_points:
            lines.append(
                f"| {p['offered']:.1f} | {p['throughput_per_s']:.1f} | {_f(p['p50_ms'])} | "
                f"{_f(p['p95_ms'])} | {_f(p['p99_ms'])} | {_f(p['mean_batch'])} |"
            )
    for model, title in (("digits", "digits demo model (8x8 PNG)"), ("noop", "no-op model (queue overhead)")):
        lines += [
            "",
            f"{title}, closed loop:",
            "",
            "| system | clients | throughput/s | p50 ms | p95 ms | p99 ms | mean batch | queue ms | model ms |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name, system in results.get("systems", {}).items():
            for point in system.get(model, {}).get("closed", []):
                lines.append(_row(name, point))
    drain = results.get("drain")
    if drain:
        lines += [
            "",
            f"Drain, no-op model, one worker: inferq {drain['inferq_jobs_per_s']:.0f} jobs/s "
            f"({drain['inferq_jobs']} jobs) vs RQ SimpleWorker {drain['rq_jobs_per_s']:.0f} jobs/s "
            f"({drain['rq_jobs']} jobs).",
        ]
    return "\n".join(lines) + "\n"


def _row(name: str, p: dict[str, Any]) -> str:
    return (
        f"| {name} | {p['offered']:.0f} | {p['throughput_per_s']:.1f} | {_f(p['p50_ms'])} | {_f(p['p95_ms'])} | "
        f"{_f(p['p99_ms'])} | {_f(p['mean_batch'])} | {_f(p['queue_ms_mean'])} | {_f(p['inference_ms_mean'])} |"
    )


def _f(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}"


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, system in results.get("systems", {}).items():
        points = system.get("resnet", {}).get("closed", [])
        if not points:
            continue
        clients = [p["offered"] for p in points]
        left.plot(clients, [p["throughput_per_s"] for p in points], marker="o", label=name)
        right.plot(clients, [p["p50_ms"] for p in points], marker="o", label=f"{name} p50")
        right.plot(clients, [p["p99_ms"] for p in points], marker="x", linestyle="--", label=f"{name} p99")
    bare = results.get("bare", {}).get("resnet")
    if bare:
        left.axhline(bare["points"][-1]["items_per_s"], color="black", linestyle=":", label="bare model, max batch")
    for axis, ylabel in ((left, "images / s"), (right, "latency (ms)")):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent clients")
        axis.set_ylabel(ylabel)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    right.set_yscale("log")
    left.set_title("ResNet-18-sized CNN: throughput")
    right.set_title("ResNet-18-sized CNN: latency")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(results: dict[str, Any], out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    results["targets"] = targets(results)
    (out_dir / "latest.json").write_text(json.dumps(results, indent=2))
    table = markdown(results)
    (out_dir / "latest.md").write_text(table)
    plot(results, out_dir / "latest.png")
    return table
