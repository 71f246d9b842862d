"""Files users keep are readable by others, like bundles: edge-bench --json-out is 0644, not mkstemp's 0600."""

from __future__ import annotations

import json
import stat

from edge_runtime.bench.report import write_json


def test_json_report_is_0644(tmp_path):
    out = tmp_path / "bench.json"
    write_json({"a": 1}, out)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert json.loads(out.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # no temp file left beside it
