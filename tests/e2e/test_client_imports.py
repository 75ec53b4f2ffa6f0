"""What the processes that need no torch bring in: the SDK's imports, in a fresh interpreter, and the webhook
sender's process (and the RQ scheduler it forks), which only sends HTTP."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import redis as redis_py
from rq.scheduler import SCHEDULER_KEY_TEMPLATE, SCHEDULER_LOCKING_KEY_TEMPLATE

from inferq.shared import keys
from tests.support.models import ROOT
from tests.support.stack import new_stack, serving
from tests.support.waiting import wait_until


def test_the_sdk_imports_neither_torch_nor_the_servers_stack() -> None:
    modules = ("inferq.client", "inferq.client_flows", "inferq.client_io", "inferq.client_http")
    modules += ("inferq.client_bulk", "inferq.client_types")
    forbidden = ("torch", "fastapi", "starlette", "transformers", "redis", "rq")
    code = f"import sys\nfor m in {modules!r}: __import__(m)\n"
    code += f"print(sorted(n for n in sys.modules if n.split('.')[0] in {forbidden!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _scheduler_pid(client: redis_py.Redis) -> int:
    """The PID of the sender's scheduler once it has registered; 0 before."""
    owner = client.get(SCHEDULER_LOCKING_KEY_TEMPLATE % keys.WEBHOOK_QUEUE)
    if owner is None:
        return 0
    return int(client.hget(SCHEDULER_KEY_TEMPLATE % owner.decode(), "pid") or 0)  # type: ignore[arg-type]


def _torch_files(pid: int) -> list[str]:
    """The files of torch's package the process has mapped (libtorch and its kin: hundreds of MB resident)."""
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return sorted({line.split()[-1] for line in maps if "/torch/" in line or "libtorch" in line})


def test_the_webhook_sender_and_its_scheduler_map_no_torch(tmp_path: Path) -> None:
    with serving(new_stack(tmp_path)) as stack, stack.redis() as client:
        sender = stack.start("webhooks", name="webhooks")
        wait_until(lambda: _scheduler_pid(client), 60, "the sender and its scheduler to register")
        assert _torch_files(sender.pid) == []
        assert _torch_files(_scheduler_pid(client)) == []
