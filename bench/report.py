"""The benchmark's outputs: JSON, a markdown table with the targets, and a PNG plot."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import feedrows

TARGETS_DOC = {
    "submit_path": "submit path: digit submits >= 0.35x /healthz, one API process, worker paused",
    "waiting_clients": "many waiting clients (Prefer: wait, 16-1,024): at 1,024 >= 0.9x best, 0 failures, "
    "p99 <= 3x p50",
    "api_workers": "`inferq api --workers 2`: >= 1.5x one process's submit rate, worker paused",
    "drain": "worker drain, no-op model: >= 25x RQ SimpleWorker",
    "drain_digits": "worker drain, real digit jobs (8x8 PNG, the digits CNN): >= 10x RQ SimpleWorker's no-op drain",
    "overlap_cpu": "GPU-path overlap costs nothing on the CPU: ResNet saturation as shipped (auto) >= 0.95x off",
    "gpu_saturation": "GPU: ResNet saturation >= 0.95x the bare model's best batch throughput",
    "gpu_idle": "GPU: one client p50 <= bare batch-1 time + 3 ms",
    "e2e_noop": "end to end, no-op model: >= 5x the plain-RQ peer",
    "saturation": "ResNet at saturation (16 and 64 clients, one request per image, hey, as the LitServe rows):"
    " >= 0.9x the bare model at the worker's max batch",
    "idle_latency": "one client: p50 <= bare batch-1 time + 5 ms",
    "keys": "after results expire, no job keys are left and every key the run added has a TTL",
    "bulk_drain": "bulk batch, no-op model, submit + drain per item: >= 3x cheaper than single jobs",
    "lanes_latency": "one client during a bulk drain: p50 <= idle p50 + one batch time",
    "generator": "the load generator is not the bottleneck: no target figure within 90% of its ceiling",
    "durability": "INFERQ_DURABILITY=replica (WAIT per pipelined batch): submits >= 0.7x async, one replica",
    "shards": "two Redis carrying two no-op models drain >= 1.8x one carrying both (or the profile says why not)",
    "fairness_drain": "tenants in fair order: the no-op drain with two tenants >= 0.9x with one (fairness off)",
    "fairness_latency": "a small tenant (5 jobs/s) beside another's 10,000 queued at once: its p99 queue time"
    " <= alone + one batch time + 20 ms",
    "litserve_cnn": "against LitServe (the peer users would pick), ResNet-sized CNN, one request per image (hey):"
    " inferq >= 1.05x LitServe at 1, 4, 16 and 64 clients",
    "litserve_text": "against LitServe, the langid text model, texts of a realistic spread of lengths (wrk):"
    " inferq >= 1.3x LitServe at saturation (64 clients); padding waste of both in the detail",
    "tracing": "traces on (OTLP to a local sink) against off: the no-op drain, and the API's CPU per digit submit"
    " (no target: what tracing costs; off costs nothing, docs/tracing.md)",
}
LIMITED = " (limited by the generator)"
Row = dict[str, Any]


def _best(points: list[dict[str, Any]]) -> dict[str, Any]:
    return max(points, key=lambda p: p["throughput_per_s"])


def _target(name: str, ratio: float, goal: float, detail: str, limited: bool = False) -> Row:
    return {
        "name": name,
        "doc": TARGETS_DOC[name],
        "value": ratio,
        "holds": ratio >= goal,
        "detail": f"{ratio:.2f}x ({detail}){LIMITED if limited else ''}",
        "limited": limited,
    }


def _unmeasured(name: str, why: str, state: str = "not measured") -> Row:
    return {"name": name, "doc": TARGETS_DOC[name], "value": None, "holds": None, "state": state, "detail": why}


def submit_path_rows(results: dict[str, Any]) -> list[Row]:
    one = results.get("api", {}).get("one")
    if not one:
        return []
    detail = (
        f"{one['submits']['per_s']:.0f} submits/s vs {one['healthz']['per_s']:.0f} /healthz/s, "
        f"{one['submits']['clients']} connections, {one['submits']['tool']}; "
        f"{one['submits']['failed']} failed"
    )
    return [_target("submit_path", one["ratio"], 0.35, detail, one["limited_by_generator"])]


def api_workers_rows(results: dict[str, Any]) -> list[Row]:
    api = results.get("api", {})
    one, two = api.get("one"), api.get("two")
    if not one or not two:
        return []
    if "not_measured" in two:
        return [_unmeasured("api_workers", two["not_measured"])]
    ratio = two["submits"]["per_s"] / max(one["submits"]["per_s"], 1e-9)
    detail = f"{two['submits']['per_s']:.0f} vs {one['submits']['per_s']:.0f} submits/s"
    return [_target("api_workers", ratio, 1.5, detail, two["limited_by_generator"])]


def waiting_rows(results: dict[str, Any]) -> list[Row]:
    points = results.get("waiting", {}).get("points")
    if not points:
        return []
    best = max(p["per_s"] for p in points)
    last = points[-1]
    failed = sum(p["failed"] for p in points)
    share = last["per_s"] / max(best, 1e-9)
    tail = (last["p99_ms"] or 0) / max(last["p50_ms"] or 1e-9, 1e-9)
    limited = any(p["limited_by_generator"] for p in points)
    return [
        {
            "name": "waiting_clients",
            "doc": TARGETS_DOC["waiting_clients"],
            "value": share,
            "holds": share >= 0.9 and failed == 0 and tail <= 3.0,
            "detail": f"{share:.2f}x best ({last['per_s']:.0f} vs {best:.0f}/s at {last['clients']} clients), "
            f"{failed} failed, p99/p50 {tail:.1f} ({_f(last['p99_ms'])}/{_f(last['p50_ms'])} ms)"
            + (LIMITED if limited else ""),
            "limited": limited,
        }
    ]


def drain_rows(results: dict[str, Any]) -> list[Row]:
    drain = results.get("drain")
    if not drain:
        return []
    rounds = len(drain.get("rounds", {}).get("inferq", [])) or 1
    detail = f"{drain['inferq_jobs_per_s']:.0f} vs {drain['rq_jobs_per_s']:.0f} jobs/s, best of {rounds} alternated"
    rows = [_target("drain", drain["ratio"], 25.0, detail)]
    if "digits_ratio" in drain:
        detail = f"{drain['digits_jobs_per_s']:.0f} vs {drain['rq_jobs_per_s']:.0f} jobs/s, best of {rounds} alternated"
        rows.append(_target("drain_digits", drain["digits_ratio"], 10.0, detail))
    return rows


def overlap_rows(results: dict[str, Any]) -> list[Row]:
    overlap = results.get("overlap")
    if not overlap:
        return []
    detail = (
        f"best of {overlap['rounds']}: {max(overlap['auto']):.1f} img/s as shipped (auto, off on a CPU) vs "
        f"{max(overlap['off']):.1f} off, {overlap['jobs']} jobs queued; forced on: {max(overlap['on']):.1f} "
        f"({overlap['forced_on_ratio']:.2f}x)"
    )
    return [_target("overlap_cpu", overlap["ratio"], 0.95, detail)]


def gpu_rows(results: dict[str, Any]) -> list[Row]:
    gpu = results.get("gpu")
    if gpu is None:
        return []
    if "owed" in gpu:
        return [
            _unmeasured("gpu_saturation", gpu["owed"], "owed: no GPU"),
            _unmeasured("gpu_idle", gpu["owed"], "owed: no GPU"),
        ]
    best = gpu["bare"]["best_items_per_s"]
    ours = gpu["saturation_overlap_on"]
    detail = f"{ours:.0f} vs {best:.0f} img/s on {gpu['device']}; overlap off: {gpu['saturation_overlap_off']:.0f}"
    return [
        _target("gpu_saturation", ours / best, 0.95, detail),
        _unmeasured("gpu_idle", "this run measures the GPU with the worker alone, not through the API"),
    ]


def e2e_rows(results: dict[str, Any]) -> list[Row]:
    systems = results.get("systems", {})
    inferq, plain = systems.get("inferq", {}), systems.get("plain_rq", {})
    if "noop" not in inferq:
        return []
    if "noop" not in plain:  # still a row: the target is owed, and a run without the peer must say so
        return [_unmeasured("e2e_noop", "the plain-RQ peer did not run (--skip-peers, or --peers without it)")]
    ours, theirs = _best(inferq["noop"]["closed"]), _best(plain["noop"]["closed"])
    ratio = ours["throughput_per_s"] / max(theirs["throughput_per_s"], 1e-9)
    limited = bool(ours.get("limited_by_generator") or theirs.get("limited_by_generator"))
    detail = f"{ours['throughput_per_s']:.0f} vs {theirs['throughput_per_s']:.0f} jobs/s"
    return [_target("e2e_noop", ratio, 5.0, detail, limited)]


def bare_reference(results: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str] | None:
    """The bare ResNet's batch-1 and max-batch points the saturation and one-client rows compare against: the faster
    of the loops measured right before and right after inferq's ResNet loads (``bare_near_resnet``), else the one
    from the start of the run; and where it came from."""
    near = results.get("bare_near_resnet") or []
    if near:
        one = min((loop["points"][0] for loop in near), key=lambda point: point["batch_ms"])
        at_max = max((loop["points"][-1] for loop in near), key=lambda point: point["items_per_s"])
        return one, at_max, "the faster of the bare loops right before and after"
    bare = results.get("bare", {}).get("resnet")
    if not bare:
        return None
    return bare["points"][0], bare["points"][-1], "the bare loop at the start of the run"


def _saturation(results: dict[str, Any], inferq: dict[str, Any], at_max: dict[str, Any], source: str) -> Row:
    """inferq's ResNet at saturation against the bare model as given, as issue 31 measured it: the hey rounds of the
    LitServe comparison (one request per image, the generator in Go) against the bare loops right before and after
    them; the ratio to the loop of the model as the worker runs it (layout, fused graph) in the detail. Without those
    rounds, the closed loop of the asyncio generator, which takes CPU from the model on a small machine."""
    vs = results.get("litserve") or {}
    saturated = [p for p in vs.get("points", []) if p["clients"] >= 16]
    if saturated and vs.get("bare_per_s"):
        top = max(saturated, key=lambda p: p["inferq_per_s"])
        given, worker = vs["bare_per_s"], vs.get("bare_worker_per_s") or 0.0
        detail = (
            f"{top['inferq_per_s']:.1f} img/s at c={top['clients']} (hey) vs the bare model as given {given:.1f} img/s"
            f" at batch {vs['max_batch']}; against the bare loop of the model as the worker runs it"
            f" ({vs.get('bare_worker_form', '')}, {worker:.1f} img/s): {top['inferq_per_s'] / max(worker, 1e-9):.2f}x;"
            " each bare figure the faster of the loops right before and after the rounds"
        )
        return _target("saturation", top["inferq_per_s"] / given, 0.9, detail)
    ours = _best(inferq["resnet"]["closed"])
    return _target(
        "saturation",
        ours["throughput_per_s"] / at_max["items_per_s"],
        0.9,
        f"{ours['throughput_per_s']:.1f} vs {at_max['items_per_s']:.1f} img/s (bare at batch {at_max['batch']}, "
        f"{source}; the asyncio closed loop: no LitServe rounds in this run)",
        bool(ours.get("limited_by_generator")),
    )


def saturation_rows(results: dict[str, Any]) -> list[Row]:
    reference = bare_reference(results)
    inferq = results.get("systems", {}).get("inferq", {})
    if reference is None or "resnet" not in inferq:
        return []
    bare_one, at_max, source = reference
    out = [_saturation(results, inferq, at_max, source)]
    one = inferq["resnet"]["closed"][0]
    overhead = (one["p50_ms"] or 0) - bare_one["batch_ms"]
    out.append(
        {
            "name": "idle_latency",
            "doc": TARGETS_DOC["idle_latency"],
            "value": overhead,
            "holds": overhead <= 5.0,
            "detail": f"p50 {one['p50_ms']:.1f} ms vs bare {bare_one['batch_ms']:.1f} ms "
            f"(+{overhead:.1f} ms; {source})",
        }
    )
    return out


def bulk_rows(results: dict[str, Any]) -> list[Row]:
    bulk_drain = results.get("bulk_drain")
    if not bulk_drain:
        return []
    detail = (
        f"{bulk_drain['bulk_us_per_item']:.0f} vs {bulk_drain['single_us_per_item']:.0f} us/item, "
        f"{bulk_drain['items']:,} items"
    )
    return [_target("bulk_drain", bulk_drain["ratio"], 3.0, detail)]


def lanes_rows(results: dict[str, Any]) -> list[Row]:
    lanes = results.get("lanes")
    if not lanes:
        return []
    allowed = lanes["idle_p50_ms"] + lanes["batch_ms"]
    return [
        {
            "name": "lanes_latency",
            "doc": TARGETS_DOC["lanes_latency"],
            "value": lanes["during_p50_ms"],
            "holds": lanes["during_p50_ms"] <= allowed and lanes["bulk_finished"] == lanes["items"],
            "detail": f"p50 {lanes['during_p50_ms']:.1f} ms during vs {lanes['idle_p50_ms']:.1f} ms idle "
            f"+ {lanes['batch_ms']:.1f} ms batch; bulk run of {lanes['items']} finished {lanes['bulk_finished']}",
        }
    ]


def keys_rows(results: dict[str, Any]) -> list[Row]:
    keys = results.get("keys")
    if not keys:
        return []
    no_ttl, jobs_left = keys.get("added_without_ttl", []), keys.get("jobs_left", [])
    detail = (
        f"{keys['before']} keys before, {keys['after']} after; {len(jobs_left)} job keys left, "
        f"{len(no_ttl)} added keys without a TTL{': ' + ', '.join(no_ttl[:3]) if no_ttl else ''}"
    )
    return [
        {
            "name": "keys",
            "doc": TARGETS_DOC["keys"],
            "value": len(no_ttl) + len(jobs_left),
            "holds": not no_ttl and not jobs_left,
            "detail": detail,
        }
    ]


def durability_rows(results: dict[str, Any]) -> list[Row]:
    durability = results.get("durability")
    if not durability:
        return []
    detail = f"{durability['replica_per_s']:.0f} vs {durability['async_per_s']:.0f} submits/s"
    return [_target("durability", durability["ratio"], 0.7, detail)]


def shards_rows(results: dict[str, Any]) -> list[Row]:
    shards = results.get("shards")
    if not shards:
        return []
    one, two = shards["one_redis"], shards["two_redis"]
    cores = ", ".join(f"{name} {used:.2f}" for name, used in sorted(two["cpu_cores"].items()))
    detail = (
        f"{two['jobs_per_s']:.0f} vs {one['jobs_per_s']:.0f} jobs/s on {shards['cpus']} cores; "
        f"cores used with two: {cores}"
    )
    row = _target("shards", shards["ratio"], 1.8, detail)
    # What the machine allows: at one Redis's CPU per job, all its cores drain at most this many times as fast.
    ceiling = shards["cpus"] / max(sum(one["cpu_cores"].values()), 1e-9)
    row["detail"] += f"; the cores allow at most {ceiling:.2f}x at one Redis's CPU per job"
    if not row["holds"] and ceiling < 1.8 and shards["ratio"] >= 0.85 * ceiling:
        row |= {"holds": None, "state": f"bound by the cores ({shards['ratio'] / ceiling:.0%} of what they allow)"}
    return [row]


def fairness_rows(results: dict[str, Any]) -> list[Row]:
    fair = results.get("fairness")
    if not fair:
        return []
    submit_us = fair["submit_us"]
    detail = (
        f"{fair['on_jobs_per_s']:.0f} vs {fair['off_jobs_per_s']:.0f} jobs/s; a submit's script and round trip"
        f" {submit_us['on']:.0f} vs {submit_us['off']:.0f} us"
    )
    small = fair["small_tenant"]
    alone, beside, fifo = small["alone"], small["beside_backlog_fair"], small["beside_backlog_fifo"]
    allowed = alone["p99_ms"] + small["batch_ms"] + 20
    return [
        _target("fairness_drain", fair["ratio"], 0.9, detail),
        {
            "name": "fairness_latency",
            "doc": TARGETS_DOC["fairness_latency"],
            "value": beside["p99_ms"],
            "holds": beside["p99_ms"] <= allowed,
            "detail": f"p99 {beside['p99_ms']:.1f} ms beside the backlog vs {alone['p99_ms']:.1f} ms alone"
            f" + {small['batch_ms']:.1f} ms batch + 20 ms ({small['model']}, {beside['samples']} samples); without"
            f" fairness (one FIFO) {fifo['p99_ms']:.0f} ms",
        },
    ]


def tracing_rows(results: dict[str, Any]) -> list[Row]:
    traced = results.get("tracing")
    if not traced:
        return []
    ratio = traced["drain_on"] / traced["drain_off"]
    detail = (
        f"drain {traced['drain_on']:.0f} vs {traced['drain_off']:.0f} jobs/s; API CPU per digit submit"
        f" {traced['submit_us_on']:.0f} vs {traced['submit_us_off']:.0f} us"
    )
    state = f"{ratio:.2f}x the drain (measured, no target)"
    return [
        {
            "name": "tracing",
            "doc": TARGETS_DOC["tracing"],
            "value": ratio,
            "holds": None,
            "state": state,
            "detail": detail,
        }
    ]


def litserve_rows(results: dict[str, Any]) -> list[Row]:
    vs = results.get("litserve")
    if not vs:
        return []
    if "unavailable" in vs:
        return [_unmeasured("litserve_cnn", vs["unavailable"])]
    worst = min(vs["points"], key=lambda p: p["ratio"])
    detail = ", ".join(f"c={p['clients']}: {p['inferq_per_s']:.1f} vs {p['litserve_per_s']:.1f}" for p in vs["points"])
    rows = [_target("litserve_cnn", worst["ratio"], 1.05, f"lowest at c={worst['clients']}; img/s {detail}")]
    text = results.get("litserve_text")
    if not text:
        return rows
    if "unavailable" in text:
        return [*rows, _unmeasured("litserve_text", text["unavailable"])]
    top = text["points"][-1]
    waste = ", ".join(f"{side} {share:.0%}" for side, share in sorted(text.get("padding_waste", {}).items()))
    detail = (
        f"c={top['clients']}: {top['inferq_per_s']:.0f} vs {top['litserve_per_s']:.0f} texts/s; padding waste {waste}"
    )
    return [*rows, _target("litserve_text", top["ratio"], 1.3, detail)]


# The targets table, in order: one entry per group of rows; a new row is one function here.
ROWS: list[Callable[[dict[str, Any]], list[Row]]] = [
    submit_path_rows,
    waiting_rows,
    api_workers_rows,
    drain_rows,
    overlap_rows,
    gpu_rows,
    e2e_rows,
    saturation_rows,
    bulk_rows,
    lanes_rows,
    keys_rows,
    durability_rows,
    shards_rows,
    fairness_rows,
    tracing_rows,
    litserve_rows,
    feedrows.rows,
]


def targets(results: dict[str, Any]) -> list[Row]:
    """Each target with the measured ratio and whether it holds (None: not measured, or owed)."""
    out = [row for rows in ROWS for row in rows(results)]
    limited = [row["name"] for row in out if row.get("limited")]
    tool = results.get("loadgen", "?")
    out.append(
        {
            "name": "generator",
            "doc": TARGETS_DOC["generator"],
            "value": len(limited),
            "holds": not limited,
            "detail": f"{tool}; limited: {', '.join(limited)}" if limited else f"{tool}; none limited",
        }
    )
    return out


def _generator_tables(results: dict[str, Any]) -> list[str]:
    """The submit path, the waiting clients and every ceiling the generator reached on /healthz."""
    lines: list[str] = []
    api = results.get("api", {})
    measured = [(label, api[key]) for key, label in (("one", "1 process"), ("two", "--workers 2")) if key in api]
    measured = [(label, m) for label, m in measured if "submits" in m]
    if measured:
        lines += [
            "",
            f"Submit path, worker paused, {api.get('clients')} connections ({api.get('tool')}):",
            "",
            "| API | /healthz per s | digit submits per s | ratio | submit p50 ms | submit p99 ms | failed |",
            "|---|---|---|---|---|---|---|",
        ]
        for label, m in measured:
            sub = m["submits"]
            mark = " *" if m["limited_by_generator"] else ""
            lines.append(
                f"| {label} | {m['healthz']['per_s']:.0f} | {sub['per_s']:.0f}{mark}"
                f" | {m['ratio']:.2f} | {_f(sub['p50_ms'])} | {_f(sub['p99_ms'])} | {sub['failed']} |"
            )
    waiting = results.get("waiting", {}).get("points")
    if waiting:
        lines += [
            "",
            f"Many waiting clients: no-op model, each client a `Prefer: wait` submit ({results['waiting']['tool']}):",
            "",
            "| clients | jobs per s | p50 ms | p90 ms | p99 ms | failed | generator ceiling per s |",
            "|---|---|---|---|---|---|---|",
        ]
        for p in waiting:
            lines.append(
                f"| {p['clients']} | {p['per_s']:.0f}{' *' if p['limited_by_generator'] else ''} | "
                f"{_f(p['p50_ms'])} | {_f(p['p90_ms'])} | {_f(p['p99_ms'])} | {p['failed']} | "
                f"{p['generator_ceiling_per_s']:.0f} |"
            )
    if lines:
        lines += ["", "\\* limited by the generator: within 90% of what it sends to /healthz at that concurrency."]
    return lines


def _holds(target: Row) -> str:
    if target["holds"] is None:
        return str(target.get("state", "not measured"))
    return "yes" if target["holds"] else "**no**"


def markdown(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        f"Machine: {machine['platform']}, {machine['cpus']} CPUs, torch {machine['torch']} on "
        f"{machine['device']}; load generator {results.get('loadgen', '?')}; {results['point_seconds']:.0f} s per "
        "load point; run took "
        f"{results.get('wall_s', 0) / 60:.1f} min.",
        "",
        "| target | measured | holds |",
        "|---|---|---|",
    ]
    for target in targets(results):
        lines.append(f"| {target['doc']} | {target['detail']} | {_holds(target)} |")
    lines += _generator_tables(results)
    if results.get("feed"):
        lines += feedrows.details(results["feed"]) + feedrows.profile_lines(results["feed"])
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
    loops = [("bare model", results.get("bare", {}).get("resnet", {}))]
    near = ("bare model, right before inferq", "bare model, right after inferq")
    loops += zip(near, results.get("bare_near_resnet") or [], strict=False)
    for label, loop in loops:
        for point in loop.get("points", []):
            lines.append(
                f"| {label} | batch {point['batch']} | {point['items_per_s']:.1f} | "
                f"{point['batch_ms']:.1f} | | | {point['batch']} | | |"
            )
    vs = results.get("litserve", {})
    if vs.get("points"):
        from bench.vs_litserve import markdown as vs_markdown

        lines += [
            "",
            "ResNet-18-sized CNN against LitServe, one request per image (hey; best of alternated rounds):",
            "",
        ]
        lines += [vs_markdown(vs, vs.get("bare_per_s"))]
        if vs.get("policies"):
            from bench.vs_litserve import policies_markdown

            lines += [
                "",
                "inferq's batch wait on the same CNN, the three policies side by side in the same alternated rounds"
                " (the adaptive one is the default; the fixed wait is LitServe's batch_timeout):",
                "",
                policies_markdown(vs),
            ]
    text = results.get("litserve_text", {})
    if text.get("points"):
        from bench.vs_litserve import markdown as vs_markdown

        lines += [
            "",
            f"The langid text model against LitServe, {text['inputs']} texts of spread lengths in turn "
            "(wrk; best of alternated rounds):",
            "",
            vs_markdown(text),
        ]
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
    mark = " *" if p.get("limited_by_generator") else ""
    return (
        f"| {name} | {p['offered']:.0f} | {p['throughput_per_s']:.1f}{mark} | {_f(p['p50_ms'])} | {_f(p['p95_ms'])} | "
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
