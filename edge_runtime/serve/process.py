"""`edge-serve` as a child process: for apps that supervise their own server, the load script and the tests.

    server = ServerProcess(Path("out/"), "--slots", "4", log=Path("/tmp/edge-serve.log"))
    ... requests to server.base + "/v1" ...
    server.stop()

Standard library only (no Starlette): the parent may be a process that does not carry the serve extra.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command() -> list[str]:
    script = Path(sys.executable).parent / "edge-serve"  # the console script pyproject.toml installs
    return [str(script)] if script.exists() else [sys.executable, "-m", "edge_runtime.serve.cli"]


class ServerProcess:
    """`edge-serve --bundle B ARGS --port P` on a free loopback port, returned once /health answers 200;
    until `stop()`. Its output goes to `log`, kept for failure messages."""

    def __init__(self, bundle: Path | None, *args: str, log: Path, startup_s: float = 90.0):
        """`bundle` None: ARGS name the model (`--model M`, exported on first use)."""
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        source = ["--bundle", str(bundle)] if bundle is not None else []
        cmd = [*serve_command(), *source, "--port", str(self.port), *args]
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:  # bounded: the server is up, or has died, or the deadline passed
            if self.proc.poll() is not None:
                self._log_file.close()
                raise RuntimeError(f"edge-serve exited with {self.proc.returncode}:\n{self.output()}")
            if self._healthy():
                return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"edge-serve did not answer /health within {startup_s} s:\n{self.output()}")

    def _healthy(self) -> bool:
        # http.client, not urllib: urllib would send 127.0.0.1 through $http_proxy where one is set
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            conn.request("GET", "/health")
            return conn.getresponse().status == 200
        except OSError:  # not listening yet
            return False
        finally:
            conn.close()

    def output(self) -> str:
        """The last 4,000 characters the server printed."""
        if not self._log_file.closed:
            self._log_file.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (a graceful drain), then SIGKILL after `timeout` seconds; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()
        return self.proc.returncode
