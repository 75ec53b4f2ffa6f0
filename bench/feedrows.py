"""The feed's rows (``bench.feed``) in the targets table, and its own markdown: figures per job and where they go."""

from __future__ import annotations

from typing import Any

Row = dict[str, Any]
TARGETS_DOC = {
    "feed_redis_small": "feed: Redis CPU per single job, submit through the API to the finish, small input"
    " (digit PNG, langid text): <= 40 us",
    "feed_redis_jpeg": "feed: Redis CPU per single job, submit to finish, a 34 KB 224x224 JPEG: <= 80 us",
    "feed_worker_noop": "feed: worker CPU per job (every process and thread), max batch 64, no-op model: <= 25 us",
    "feed_worker_cnn": "feed: worker CPU per job (every process and thread), max batch 64, the CNN's 224x224 JPEG on"
    " an instant device: <= 600 us",
    "feed_worker_forward": "feed: of that, where the forward runs (today the worker's main thread): <= 150 us",
    "feed_sim_1000": "feed: simulated device at 1,000 img/s (1 ms per image, no CPU), 224x224 JPEGs, one worker:"
    " drain >= 0.95x the device's rate",
    "feed_sim_2000": "feed: simulated device at 2,000 img/s (0.5 ms per image): drain >= 0.85x the device's rate",
    "feed_host": "feed: the JPEG drain on an instant device (the host's capacity) >= 1.5x one thread of today's"
    " preprocessing arithmetic, measured right before and after",
    "feed_text": "feed: text (langid, instant device), worker + Redis CPU per job, submit to finish: <= 120 us",
    "feed_bulk_upload": "feed: bulk upload, the API's CPU per 34 KB JPEG line (base64, as `inferq batch` sends it),"
    " request to 202: <= 50 us",
}


def _row(name: str, value: float, holds: bool, detail: str) -> Row:
    return {"name": name, "doc": TARGETS_DOC[name], "value": value, "holds": holds, "detail": detail}


def _split(best: dict[str, Any]) -> str:
    return f"submit {best['redis_submit_us']:.1f} + drain {best['redis_drain_us']:.1f}"


def _threads(scenario: dict[str, Any]) -> str:
    """The best round's worker CPU per job by process and thread, largest first."""
    top = min(scenario["rounds"], key=lambda r: r["worker_us"])["worker"]
    parts = []
    for process in top["processes"]:
        named = sorted(process["threads_us"].items(), key=lambda kv: -kv[1])
        shown = ", ".join(f"{name} {us:.0f}" for name, us in named if us >= 0.5)
        exited = process["exited_threads_us"]
        if exited >= 0.5:
            shown += f", exited threads {exited:.0f}"
        parts.append(f"{process['comm']} {process['total_us']:.0f}: {shown}")
    return "; ".join(parts)


def rows(results: dict[str, Any]) -> list[Row]:
    """Each feed target measured in this run, with whether it holds."""
    feed = results.get("feed")
    if not feed:
        return []
    found = feed["scenarios"]
    rounds = feed["rounds"]
    best = {name: scenario["best"] for name, scenario in found.items()}
    out = []
    small = [name for name in ("digits", "text") if name in best]
    if "redis_single" in feed["rows"] and small:
        worst = float(max(best[name]["redis_us"] for name in small))
        label = {"digits": "digit PNG", "text": "langid text"}
        detail = "; ".join(f"{label[n]} {best[n]['redis_us']:.1f} us ({_split(best[n])})" for n in small)
        out.append(_row("feed_redis_small", worst, worst <= 40, f"{detail}; best of {rounds}"))
    if "redis_single" in feed["rows"] and "jpeg" in best:
        jpeg = best["jpeg"]
        size = found["jpeg"]["rounds"][0]["payload_bytes"]
        detail = f"{jpeg['redis_us']:.1f} us ({_split(jpeg)}), a {size:,}-byte JPEG; best of {rounds}"
        out.append(_row("feed_redis_jpeg", jpeg["redis_us"], jpeg["redis_us"] <= 80, detail))
    if "worker_cpu" in feed["rows"]:
        for name, row, goal in (("noop", "feed_worker_noop", 25.0), ("jpeg", "feed_worker_cnn", 600.0)):
            if name in best:
                value = best[name]["worker_us"]
                out.append(_row(row, value, value <= goal, f"{value:.1f} us/job ({_threads(found[name])})"))
        if "jpeg" in best:
            value = best["jpeg"]["forward_us"]
            whole = min(r["worker"]["processes"][0]["total_us"] for r in found["jpeg"]["rounds"])
            detail = f"{value:.1f} us/job in {feed['forward']} (the whole process it runs in: {whole:.0f} us)"
            out.append(_row("feed_worker_forward", value, value <= 150, detail))
    if "sim_device" in feed["rows"]:
        for name, row, goal in (("sim1000", "feed_sim_1000", 0.95), ("sim2000", "feed_sim_2000", 0.85)):
            if name in best:
                rate = feed["sim_rates"][name]
                ratio = best[name]["steady_per_s"] / rate
                detail = (
                    f"{ratio:.2f}x ({best[name]['steady_per_s']:.0f} of {rate} img/s, the worker on"
                    f" {best[name]['steady_worker_cores']:.2f} cores; best of {rounds})"
                )
                out.append(_row(row, ratio, ratio >= goal, detail))
    if "host_capacity" in feed["rows"] and "jpeg" in best and "host_loop" in feed:
        loop = feed["host_loop"]
        ratio = best["jpeg"]["steady_per_s"] / max(loop["before"], loop["after"])
        detail = (
            f"{ratio:.2f}x ({best['jpeg']['steady_per_s']:.0f} img/s drained, the worker on"
            f" {best['jpeg']['steady_worker_cores']:.2f} cores, vs the loop's {loop['before']:.0f} before,"
            f" {loop['after']:.0f} after)"
        )
        out.append(_row("feed_host", ratio, ratio >= 1.5, detail))
    if "text_cpu" in feed["rows"] and "text" in best:
        text = best["text"]
        value = text["worker_redis_us"]
        detail = f"{value:.1f} us (worker {text['worker_us']:.1f} + Redis {text['redis_us']:.1f}; best of {rounds})"
        out.append(_row("feed_text", value, value <= 120, detail))
    if "bulk_upload" in feed["rows"] and "bulk_upload" in feed:
        upload = feed["bulk_upload"]
        value = upload["best"]["api_us"]
        lines = upload["rounds"][0]["items"]
        detail = (
            f"{value:.1f} us/item (Redis {upload['best']['redis_us']:.1f}); {lines} lines an upload, best of {rounds}"
        )
        out.append(_row("feed_bulk_upload", value, value <= 50, detail))
    return out


def _holds(row: Row) -> str:
    return "yes" if row["holds"] else "**no**"


def _commands(phase: dict[str, Any], top: int = 6) -> str:
    listed = list(phase["commands"].items())[:top]
    return ", ".join(f"{name} {c['calls']:.2f}x {c['us']:.1f}" for name, c in listed)


def details(feed: dict[str, Any]) -> list[str]:
    """Per scenario: its best figures per job, and its best round's Redis commands per job."""
    lines = [
        "",
        f"Feed scenarios, per job (best of {feed['rounds']}; {feed['clients']} clients of {feed['loadgen']} for"
        f" {feed['submit_s']:g} s, then one worker, {', '.join(f'{k}={v}' for k, v in feed['worker_env'].items())};"
        f" load average {feed['load_average']['before'][0]:.1f} before, {feed['load_average']['after'][0]:.1f}"
        " after):",
        "",
        "| scenario | jobs | Redis submit us | Redis drain us | API us per submit | worker us | forward us |"
        " drain jobs/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, scenario in feed["scenarios"].items():
        b = scenario["best"]
        jobs = "/".join(str(r["jobs"]) for r in scenario["rounds"])
        lines.append(
            f"| {name} | {jobs} | {b['redis_submit_us']:.1f} | {b['redis_drain_us']:.1f} | {b['api_us']:.0f} |"
            f" {b['worker_us']:.1f} | {b['forward_us']:.1f} | {b['steady_per_s']:.0f} |"
        )
    lines += [
        "",
        "Redis commands per job, the best round (calls, then microseconds; a script's commands count under their"
        " own names and again in its EVAL/EVALSHA):",
        "",
        "| scenario | submit | drain |",
        "|---|---|---|",
    ]
    for name, scenario in feed["scenarios"].items():
        top = min(scenario["rounds"], key=lambda r: r["redis_us"])
        lines.append(f"| {name} | {_commands(top['submit']['redis'])} | {_commands(top['redis'])} |")
    return lines


def _inner(row: dict[str, Any], top: int = 8) -> str:
    return ", ".join(f"{name} {n:.2f}" for name, n in list(row["inner_per_job"].items())[:top])


def profile_lines(feed: dict[str, Any]) -> list[str]:
    """``--profile``'s round of each scenario: Redis's scripts and commands by share, the worker's functions."""
    profiled = feed.get("profile")
    if not profiled:
        return []
    lines = [
        "",
        "Profile (`--profile`: one more round, not a measured one). Redis: each phase's commands from its SLOWLOG,"
        " threshold 0; microseconds there hold the log's own cost, so read the shares (the costs per job are"
        " commandstats', above); a script's own commands per job beside it:",
        "",
        "| scenario | phase | script or command | calls per job | share | its commands per job |",
        "|---|---|---|---|---|---|",
    ]
    for name, found in profiled.items():
        for phase in ("redis_submit", "redis_drain"):
            for command, row in list(found[phase]["commands"].items())[:5]:
                if row["share"] < 0.01:
                    continue
                lines.append(
                    f"| {name} | {phase.removeprefix('redis_')} | {command} | {row['calls']:.3f} |"
                    f" {row['share']:.0%} | {_inner(row)} |"
                )
    lines += [
        "",
        "The worker over the drain (py-spy, every thread, samples while on a CPU): its threads' shares, the"
        " functions holding the most samples themselves, and inferq's with what they call:",
        "",
        "| scenario | threads | top functions (self) | inferq's functions with what they call |",
        "|---|---|---|---|",
    ]
    for name, found in profiled.items():
        worker = found["worker"]
        if "unavailable" in worker:
            lines.append(f"| {name} | {worker['unavailable']} | | |")
            continue
        threads = ", ".join(f"{thread} {share:.0%}" for thread, share in worker["threads"][:5])
        top = ", ".join(f"{fn} {share:.0%}" for fn, share in worker["self"][:8])
        rooms = ", ".join(f"{fn} {share:.0%}" for fn, share in worker.get("inferq_inclusive", [])[:8])
        lines.append(f"| {name} | {threads} | {top} | {rooms} |")
    return lines


def markdown(results: dict[str, Any]) -> str:
    """``bench.feed``'s own table: its targets, then its details."""
    feed = results["feed"]
    lines = [
        f"Feed rows (python -m bench.feed{' --aof: Redis with its append-only file' if feed.get('aof') else ''}),"
        f" run took {results.get('wall_s', 0) / 60:.1f} min.",
        "",
        "| target | measured | holds |",
        "|---|---|---|",
    ]
    lines += [f"| {row['doc']} | {row['detail']} | {_holds(row)} |" for row in rows(results)]
    lines += details(feed)
    lines += profile_lines(feed)
    return "\n".join(lines) + "\n"
