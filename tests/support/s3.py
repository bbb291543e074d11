"""An S3 API on loopback for the tests: moto's server in a subprocess, one bucket created."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from resources.embedded import find_free_port


@dataclass(frozen=True)
class S3Server:
    """Where the server listens and the credentials it accepts (moto accepts any)."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"


@contextmanager
def s3_server(log_path: Path, bucket: str, start_timeout_s: float = 60) -> Iterator[S3Server]:
    """Start ``moto.server`` on a free loopback port, create ``bucket``, stop it on exit."""
    from pyarrow.fs import S3FileSystem

    port = find_free_port()
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start: {log_path.read_text()[-4000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            time.sleep(0.1)
        server = S3Server(f"http://127.0.0.1:{port}", "platform-test-key", "platform-test-secret")
        S3FileSystem(
            endpoint_override=server.endpoint,
            access_key=server.access_key,
            secret_key=server.secret_key,
            region=server.region,
            allow_bucket_creation=True,
        ).create_dir(bucket)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
