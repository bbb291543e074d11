"""A TLS-terminating TCP proxy in front of a plaintext broker, for testing SSL pass-through.

Tansu 0.6.0 cannot serve TLS itself (``--cert`` and ``--key`` are mutually exclusive options;
a listener given a combined PEM accepts TCP but never answers the handshake), so the tests put
this proxy in front of a broker that advertises the proxy's port: every client must speak TLS
to reach the broker at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
import threading
from pathlib import Path


def make_self_signed_certificate(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command line."""
    cert, key = directory / "broker.pem", directory / "broker.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1,DNS:localhost",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class TlsProxy:
    """Accept TLS on ``127.0.0.1:port`` and relay the bytes to ``127.0.0.1:upstream_port``."""

    def __init__(self, port: int, upstream_port: int, cert: Path, key: Path) -> None:
        self.port = port
        self.upstream_port = upstream_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.handshakes = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    async def _handle(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        self.handshakes += 1
        try:
            upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            client_writer.close()
            return
        self._writers |= {client_writer, upstream[1]}
        await asyncio.gather(
            self._relay(client_reader, upstream[1]), self._relay(upstream[0], client_writer)
        )

    def __enter__(self) -> TlsProxy:
        self._thread.start()
        start = asyncio.start_server(
            self._handle, "127.0.0.1", self.port, ssl=self.context, ssl_handshake_timeout=5
        )
        self._server = asyncio.run_coroutine_threadsafe(start, self._loop).result(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        async def close() -> None:
            if self._server is not None:
                self._server.close()
                for writer in self._writers:
                    writer.close()
                await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(close(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
