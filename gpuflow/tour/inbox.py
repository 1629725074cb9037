"""The tour's operators' channel: a webhook on loopback that the remediate flow notifies
through a real Prefect notification block, so the tour shows the message it sent (and
the flow does not warn that no channel is configured)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prefect.blocks.notifications import CustomWebhookNotificationBlock


class Inbox:
    """Keeps every message POSTed to it; ``block()`` is the notifier that posts here."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        received = self.messages

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    received.append(json.loads(raw))
                except ValueError:
                    received.append({"subject": raw.decode(errors="replace")})
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass  # the tour prints what arrived, not one line per request

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def block(self) -> CustomWebhookNotificationBlock:
        host, port = self._server.server_address[:2]
        return CustomWebhookNotificationBlock(
            name="gpuflow-tour",
            url=f"http://{host}:{port}/notify",
            json_data={"subject": "{{subject}}", "body": "{{body}}"},
        )

    def __enter__(self) -> Inbox:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
