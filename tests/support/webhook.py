"""A webhook receiver on a free loopback port: it keeps every JSON body POSTed to it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


class _Handler(BaseHTTPRequestHandler):
    server: WebhookReceiver

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.received.append({**body, "received_at": time.time()})
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        return


class WebhookReceiver(HTTPServer):
    """``received``: every body in arrival order, each with ``received_at`` (epoch seconds)."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.received: list[dict[str, Any]] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}/alerts"


@contextmanager
def webhook_receiver() -> Iterator[WebhookReceiver]:
    """A receiver serving in a daemon thread for the ``with`` block."""
    receiver = WebhookReceiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()
