"""A real `edge-serve` process on a free loopback port, with request helpers, for the serve tests."""

from __future__ import annotations

import http.client
import json
from typing import Any

from edge_runtime.serve.process import ServerProcess

# The demo model's chat template (as tests/test_cli_chat.py's), plus two refusals the error sweep needs: a tool
# message the template raises on, and messages with no content, which render to nothing at all.
SERVE_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'tool' %}{{ raise_exception('this model takes no tool messages') }}{% endif %}"
    "{% if m['content'] %}{{ 'ROMEO' if m['role'] == 'assistant' else m['role'] | upper }}.\n"
    "{{ m['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt and messages | selectattr('content') | list %}ROMEO.\n{% endif %}"
    # Qwen3's and SmolLM3's switch, in miniature: the reply starts with an empty thought when it is off
    "{% if add_generation_prompt and enable_thinking is defined and not enable_thinking %}[aside]\n{% endif %}"
)


class Server(ServerProcess):
    """edge-serve (edge_runtime/serve/process.py) with the request helpers the tests use."""

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
