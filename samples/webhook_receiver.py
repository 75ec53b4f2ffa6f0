"""A local webhook receiver for trying inferq's webhooks: verifies each delivery and prints the job.

    INFERQ_WEBHOOK_SECRET=whsec_... .venv/bin/python samples/webhook_receiver.py [PORT]

It answers 204 at once to a delivery whose Standard Webhooks signature checks out with the
same secret the sender uses, and 401 otherwise (no secret set: it prints deliveries unverified).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from inferq.client import WebhookVerificationError, verify_webhook

SECRET = os.environ.get("INFERQ_WEBHOOK_SECRET", "")
MAX_BODY = 1 << 20


class Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY:
            self.send_response(413)
            self.end_headers()
            return
        body = self.rfile.read(length)
        if SECRET:
            try:
                job = verify_webhook(SECRET, dict(self.headers), body)
            except WebhookVerificationError as exc:
                print(f"refused a delivery: {exc}", flush=True)
                self.send_response(401)
                self.end_headers()
                return
            print(f"verified {self.headers['webhook-id']}: {job.id} {job.status} {json.dumps(job.result)}", flush=True)
        else:
            print(f"unverified (no INFERQ_WEBHOOK_SECRET): {body.decode(errors='replace')}", flush=True)
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 9000
    server = ThreadingHTTPServer(("127.0.0.1", port), Receiver)
    print(f"listening on http://127.0.0.1:{port}/hook", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
