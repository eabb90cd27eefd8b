"""Serving the site on loopback (stdlib ``ThreadingHTTPServer``) and writing it out as static files."""

from __future__ import annotations

import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .site import Page, Site

#: No scripts anywhere; inline styles only for the timeline bars.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    site: Site
    check_host: bool


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    server_version = "coda-agent-viewer"

    def _send(self, page: Page, body: bool = True) -> None:
        self.send_response(page.status)
        self.send_header("Content-Type", page.content_type)
        self.send_header("Content-Length", str(len(page.body)))
        for k, v in SECURITY_HEADERS.items():
            self.send_header(k, v)
        self.end_headers()
        if body:
            self.wfile.write(page.body)

    def _page(self) -> Page:
        if self.server.check_host and not _loopback_host_header(self.headers.get("Host", "")):
            # a page on another site that rebinds its DNS name to 127.0.0.1 must not read the runs
            return Page(403, "text/plain; charset=utf-8", "forbidden: unexpected Host header\n")
        try:
            return self.server.site.get(self.path)
        except Exception as exc:  # a bug in one page must not take the viewer down
            self.log_error("error rendering %s: %r", self.path, exc)
            return Page(500, "text/plain; charset=utf-8", f"internal error: {type(exc).__name__}: {exc}\n")

    def do_GET(self) -> None:
        self._send(self._page())

    def do_HEAD(self) -> None:
        self._send(self._page(), body=False)

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if isinstance(code, int) and code >= 400:  # quiet: only failed requests reach stderr
            super().log_request(code, size)


def _loopback_host_header(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
    return name.strip("[]") in ("127.0.0.1", "localhost", "::1")


def serve(site: Site, host: str = "127.0.0.1", port: int = 7575) -> ThreadingHTTPServer:
    """A bound (not yet serving) server; call ``serve_forever()``. Port 0 picks a free one."""
    server = (_Server6 if ":" in host else _Server)((host, port), _Handler)
    server.site = site
    server.check_host = host in ("127.0.0.1", "localhost", "::1")
    return server


def export_site(site: Site, out_dir: Path) -> int:
    """Write every page under ``out_dir`` (``index.html``, ``task/X.html``, ``run/Y.json``...); return the
    count."""
    written = 0
    with site.snapshot():
        for path in site.paths():
            page = site.get(path)
            target = out_dir / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(page.body)
            written += 1
    return written
