"""A real `edge-serve` process on a free loopback port, for the serve tests (and scripts/serve_load.py)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The demo model's chat template (as tests/test_cli_chat.py's), plus two refusals the error sweep needs: a tool
# message the template raises on, and messages with no content, which render to nothing at all.
SERVE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('this model takes no tool messages') }}{% endif %}"
    "{% if m['content'] %}{{ 'ROMEO' if m['role'] == 'assistant' else m['role'] | upper }}.\n"
    "{{ m['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt and messages | selectattr('content') | list %}ROMEO.\n{% endif %}"
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_command() -> list[str]:
    script = Path(sys.executable).parent / "edge-serve"  # the console script pyproject.toml installs
    return [str(script)] if script.exists() else [sys.executable, "-m", "edge_runtime.serve.cli"]


class Server:
    """`edge-serve --bundle B ARGS --port P` until `stop()`; its log is kept for failure messages."""

    def __init__(self, bundle: Path, *args: str, log: Path, startup_s: float = 90.0):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        cmd = [*serve_command(), "--bundle", str(bundle), "--port", str(self.port), *args]
        self._log_file = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log_file, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + startup_s
        while time.monotonic() < deadline:  # bounded: the server is up, or has died, or the deadline passed
            if self.proc.poll() is not None:
                raise RuntimeError(f"edge-serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"edge-serve did not answer /health within {startup_s} s:\n{self.output()}")

    def output(self) -> str:
        self._log_file.flush()
        return self.log.read_text(errors="replace")[-4000:]

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 60.0,
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def get(self, path: str) -> tuple[int, bytes]:
        status, _, body = self.request("GET", path, timeout=10.0)
        return status, body

    def post(self, path: str, obj: Any = None, raw: bytes | None = None, **headers: str) -> tuple[int, dict[str, Any]]:
        body = raw if raw is not None else json.dumps(obj).encode()
        status, _, data = self.request("POST", path, body, {"Content-Type": "application/json", **headers})
        return status, json.loads(data)

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log_file.close()
        return self.proc.returncode


def metric_samples(text: str) -> dict[str, list[Any]]:
    """Family name -> its samples, parsed by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: list(f.samples) for f in text_string_to_metric_families(text)}


def sample_value(families: dict[str, list[Any]], family: str, sample: str | None = None, **labels: str) -> float:
    """Sum of the samples named `sample` (default: the family's own name) whose labels include `labels`."""
    name = sample or family
    return sum(
        s.value
        for s in families.get(family, [])
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )
