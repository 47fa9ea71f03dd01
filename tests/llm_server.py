"""A real chat-completions server on loopback, standing in for Ollama, vLLM or a hosted
API: the one boundary Reverie does not own. It can answer well, slowly, with errors,
with garbage, empty or too long, and records what it was asked."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeLLM:
    """Behaviours: good, slow, error, garbage, empty, long, flaky (one 500, then good)."""

    def __init__(self) -> None:
        self.behaviour = "good"
        self.delay = 2.0
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with owner._lock:
                    owner.requests.append(
                        {"path": self.path, "auth": self.headers.get("Authorization"), "body": body}
                    )
                    count = len(owner.requests)
                owner.respond(self, body, count)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def respond(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], count: int) -> None:
        behaviour = self.behaviour
        if behaviour == "flaky":
            behaviour = "error" if count == 1 else "good"
        if behaviour == "slow":
            time.sleep(self.delay)
        if behaviour == "error":
            self._send(handler, 500, b'{"error": "model crashed"}')
            return
        if behaviour == "garbage":
            self._send(handler, 200, b"<html>not json at all")
            return
        content = {"empty": "   ", "long": "word " * 2000}.get(behaviour) or self.answer(body)
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]}
        self._send(handler, 200, json.dumps(reply).encode())

    @staticmethod
    def answer(body: dict[str, Any]) -> str:
        """A short, deterministic answer naming how many items the prompt listed."""
        prompt = body["messages"][-1]["content"]
        items = len(re.findall(r"^\d+\. ", prompt, flags=re.M))
        return f"LLM summary of {items} memories."

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(payload)))
        handler.end_headers()
        handler.wfile.write(payload)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
