"""A real S3-compatible HTTP server for tests: moto's standalone server as a subprocess on a
random loopback port, reached through s3fs like any S3 endpoint.

The credentials are made up (moto accepts any); they go to the test processes only, through
`env()` (AWS_* variables) or `storage_options()`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ACCESS_KEY = "testing-access-key"
SECRET_KEY = "s3cr3t-Do-Not-Log-7f3a9c"
REGION = "eu-west-1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3Server:
    """`python -m moto.server` on 127.0.0.1:PORT; `stop()` (or SIGKILL at exit) ends it.

    With `auth`, the server checks every request's credentials against its IAM users, of
    which it has none: every request is refused, as with wrong credentials.
    """

    def __init__(self, *, auth: bool = False) -> None:
        self.port = _free_port()
        self.log_path = Path(tempfile.mkdtemp(prefix="moto-")) / "moto.log"
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._fs: Any = None
        auth_env = {"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if auth else {}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(os.environ, **self.env(), **auth_env),
            )
        self._wait_up(30.0)

    def _wait_up(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited: {self.log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                    return
            except (urllib.error.URLError, OSError):
                if time.monotonic() > end:
                    self.stop()
                    raise RuntimeError("moto server did not answer") from None
                time.sleep(0.05)

    def env(self) -> dict[str, str]:
        """The variables a process needs to reach this server with s3fs/botocore."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def storage_options(self, **more: Any) -> dict[str, Any]:
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "endpoint_url": self.endpoint,
            "client_kwargs": {"region_name": REGION},
            **more,
        }

    def fs(self) -> Any:
        """An s3fs filesystem on this server for the test's own uploads (not fsspec's shared
        instance), its listings never cached."""
        if self._fs is None:
            import s3fs

            self._fs = s3fs.S3FileSystem(
                skip_instance_cache=True, use_listings_cache=False, **self.storage_options()
            )
        return self._fs

    def reset(self) -> None:
        """Drop every bucket and object."""
        req = urllib.request.Request(f"{self.endpoint}/moto-api/reset", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
