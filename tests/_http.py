"""A JSON request handler shared by the tests' fake OpenAI-compatible servers (real HTTP on loopback)."""
import json
from http.server import BaseHTTPRequestHandler


class JSONHandler(BaseHTTPRequestHandler):
    "Quiet handler with `_send(status, obj)`: the shared part of every fake server in the tests."
    def log_message(self, *a): pass

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
