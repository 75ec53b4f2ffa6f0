"""What importing the SDK brings in: neither torch nor the server's stack, in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

from tests.support.models import ROOT


def test_the_sdk_imports_neither_torch_nor_the_servers_stack() -> None:
    modules = ("inferq.client", "inferq.client_flows", "inferq.client_io", "inferq.client_http")
    modules += ("inferq.client_bulk", "inferq.client_types")
    forbidden = ("torch", "fastapi", "starlette", "transformers", "redis", "rq")
    code = f"import sys\nfor m in {modules!r}: __import__(m)\n"
    code += f"print(sorted(n for n in sys.modules if n.split('.')[0] in {forbidden!r}))"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
