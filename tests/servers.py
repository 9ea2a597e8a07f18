"""Real servers on 127.0.0.1 for the filesystem tests: HTTP with Range requests, and S3 (moto)."""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import threading


class _RangeHandler(http.server.SimpleHTTPRequestHandler):
    """A static file server that honours ``Range: bytes=a-b`` (fsspec reads in blocks)."""

    def log_message(self, *args):  # quiet
        pass

    def send_head(self):
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            self.send_error(404)
            return None
        size = os.path.getsize(path)
        match = re.match(r"bytes=(\d*)-(\d*)", self.headers.get("Range", ""))
        f = open(path, "rb")
        if match:
            start = int(match.group(1) or 0)
            end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.send_header("Content-Length", str(end - start + 1))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            f.seek(start)
            self._remaining = end - start + 1
        else:
            self.send_response(200)
            self.send_header("Content-Length", str(size))
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            self._remaining = size
        return f

    def copyfile(self, source, outputfile):
        while self._remaining > 0:
            chunk = source.read(min(1 << 16, self._remaining))
            if not chunk:
                break
            outputfile.write(chunk)
            self._remaining -= len(chunk)


@contextlib.contextmanager
def http_server(directory: str):
    handler = lambda *a, **k: _RangeHandler(*a, directory=directory, **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="test-http", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@contextlib.contextmanager
def s3_server():
    """A moto S3 server on 127.0.0.1; yields fsspec storage_options for s3fs."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield {
            "key": "testing", "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}", "region_name": "eu-west-1"},
        }
    finally:
        server.stop()
