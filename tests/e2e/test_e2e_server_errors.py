"""A real API process on one keep-alive connection: a request that fails, handled or not, leaves it usable.

Starlette's ServerErrorMiddleware answered an unhandled exception's 500 and raised it again, and uvicorn then closed
the connection: the client's next request on it failed with ECONNRESET. A version path of a Unicode digit ("²",
which str.isdigit() accepts and int() refuses) was such an exception.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from tests.support.faulty_api import FAULT_PATH
from tests.support.models import ROOT
from tests.support.stack import Stack, _ready, new_stack, serving
from tests.support.waiting import wait_until

SERVE = (
    "import sys, uvicorn\n"
    "from inferq.api.http_protocol import HttpProtocol\n"
    "uvicorn.run('tests.support.faulty_api:create_app', factory=True, host='127.0.0.1', port=int(sys.argv[1]),"
    " http=HttpProtocol)\n"
)


def _start_api(stack: Stack) -> Path:
    """The API with its test-only fault route, as uvicorn serves ``inferq api`` (its protocol too); its log."""
    log_path = stack.tmp / "api.log"
    with log_path.open("wb") as log:
        stack.procs.append(
            subprocess.Popen(
                [sys.executable, "-c", SERVE, str(stack.port)], cwd=ROOT, env=stack.env, stdout=log, stderr=log
            )
        )
    stack.logs.append(log_path)
    wait_until(lambda: _ready(stack.base), 60, "the API to answer /readyz")
    return log_path


def _exchange(sock: socket.socket, path: str) -> tuple[int, dict[str, str], bytes]:
    """One GET on ``sock``: the answer's status, headers and body, read to its Content-Length."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode())
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the API closed the connection instead of answering GET {path}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the API closed the connection mid-body"
        body += chunk
    return int(status_line.split(" ")[1]), headers, body


def test_an_unhandled_error_answers_500_and_keeps_the_connection(tmp_path: Path) -> None:
    with serving(new_stack(tmp_path)) as stack:
        log_path = _start_api(stack)
        with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as sock:
            status, headers, body = _exchange(sock, FAULT_PATH)
            assert (status, headers["content-type"]) == (500, "application/json")
            assert json.loads(body) == {"error": {"code": "internal_error", "message": "internal server error"}}
            assert headers.get("connection") != "close"
            # The same connection, again: it was reset after the 500.
            status, _, body = _exchange(sock, "/healthz")
            assert status == 200, body
            status, _, body = _exchange(sock, FAULT_PATH)
            assert status == 500, body
            assert _exchange(sock, "/v1/models")[0] == 200
        stack.stop_all()
        log = log_path.read_text()
        # Logged once each, with its traceback, by the API's own handler; uvicorn never saw it raise.
        assert log.count("RuntimeError: an injected fault") == 2, log
        assert log.count("unhandled error") == 2, log
        assert "Exception in ASGI application" not in log, log


def test_a_version_in_unicode_digits_is_a_422_on_a_connection_that_stays(tmp_path: Path) -> None:
    with serving(new_stack(tmp_path)) as stack:
        log_path = _start_api(stack)
        with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as sock:
            for version in ("%C2%B2", "%D9%A3", "1%C2%B2", "x"):  # "²", Arabic-Indic three, "1²", a letter
                status, _, body = _exchange(sock, f"/v2/models/digits/versions/{version}")
                assert status == 422, body
                shown = version.replace("%C2%B2", "²").replace("%D9%A3", "٣")
                assert json.loads(body) == {"error": f"a version is a number in ASCII digits, got {shown!r}"}
            status, _, body = _exchange(sock, "/v2/models/digits/versions/1")
            assert status == 200 and json.loads(body)["versions"] == ["1"], body
            status, _, body = _exchange(sock, "/v2/models/digits/versions/7")
            assert (status, json.loads(body)) == (404, {"error": "model digits has no version '7' (it has: 1)"})
        stack.stop_all()
        assert "Traceback" not in log_path.read_text()
