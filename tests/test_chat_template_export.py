"""`edge-export --chat-template FILE`: checkpoints, GGUFs and the demo without a template get one; a source's own is
replaced; every bad file is one line before any work; the manifest records the template's origin."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from edge_runtime.bundle import open_bundle
from edge_runtime.cli.export import main as export_cli
from edge_runtime.cli.run import main as run_cli
from edge_runtime.errors import BundleError
from edge_runtime.manifest import MANIFEST_FILE, Manifest, TemplateOrigin, with_digest
from edge_runtime.models import DEMO_CHECKPOINT

from .tiny_models import demo_with_template, save_tiny_checkpoint

# Reads a special token (checked with the checkpoint's real ones at export) and ends on the generation prompt.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] | upper }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}ASSISTANT:{% endif %}"
)


def _sha(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def _export(*args: str):
    r = CliRunner().invoke(export_cli, [*map(str, args)])
    assert r.exit_code == 0, r.output
    return r


def _manifest(bundle: Path) -> dict:
    return json.loads((bundle / MANIFEST_FILE).read_text())


def _chat_works(bundle: Path) -> None:
    r = CliRunner().invoke(
        run_cli, ["--bundle", str(bundle), "--target", "x86", "--message", "hi", "--max-tokens", "3", "--json"]
    )
    assert r.exit_code == 0, r.output
    assert len(json.loads(r.stdout.strip().splitlines()[-1])["token_ids"]) <= 3


def _inspect(bundle: Path) -> str:
    r = CliRunner().invoke(export_cli, ["inspect", str(bundle)])
    assert r.exit_code == 0, r.output
    return next(line for line in r.stdout.splitlines() if line.startswith("chat "))


@pytest.fixture(scope="module")
def template_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tpl") / "chat.jinja"
    path.write_text(TEMPLATE, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def demo_bundle(tmp_path_factory, template_file) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo") / "b"
    r = _export("demo", "-o", out, "--window", "100", "--chat-template", template_file)
    return out, r.stderr


# ---------------------------------------------------------------------------------------------
# Sources without a template
# ---------------------------------------------------------------------------------------------


def test_demo_gets_the_file_and_chats(demo_bundle, template_file):
    out, stderr = demo_bundle
    assert f"chat template from --chat-template '{template_file}'" in stderr
    assert "replacing" not in stderr  # the demo has none to replace
    m = _manifest(out)
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    assert m["tokenizer"]["chat_template"] == "chat_template.jinja"
    sha = _sha(template_file.read_bytes())
    assert m["provenance"]["chat_template"] == {"source": "file", "path": str(template_file), "sha256": sha}
    assert m["files"]["chat_template.jinja"] == sha  # the recorded hash is of the bundle's file too
    _chat_works(out)
    assert _inspect(out) == f"chat        template chat_template.jinja from --chat-template '{template_file}' " + (
        f"(sha256 {sha[:12]})"
    )


def test_checkpoint_directory_without_a_template(tmp_path, template_file):
    ck = tmp_path / "ck"
    save_tiny_checkpoint("llama-tied", ck)
    out = tmp_path / "b"
    _export(ck, "-o", out, "--window", "100", "--chat-template", template_file)
    assert Manifest.read(out / MANIFEST_FILE).chat_template_origin == TemplateOrigin(
        "file", str(template_file), _sha(TEMPLATE)
    )
    _chat_works(out)


def test_a_checkpoints_own_template_is_recorded_and_replaced_in_one_line(tmp_path, template_file):
    ck = demo_with_template(tmp_path / "ck", "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    own = tmp_path / "own"
    _export(ck, "-o", own, "--window", "100")
    origin = Manifest.read(own / MANIFEST_FILE).chat_template_origin
    assert origin is not None and (origin.source, origin.path) == ("checkpoint", str(ck / "tokenizer_config.json"))
    assert "from the checkpoint's" in _inspect(own)

    replaced = tmp_path / "replaced"
    r = _export(ck, "-o", replaced, "--window", "100", "--chat-template", template_file)
    said = [line for line in r.stderr.splitlines() if "chat template" in line]
    assert len(said) == 1 and f"replacing the one from the checkpoint's '{ck / 'tokenizer_config.json'}'" in said[0]
    assert (replaced / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE
    assert _manifest(replaced)["provenance"]["chat_template"]["source"] == "file"


# ---------------------------------------------------------------------------------------------
# GGUF sources
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory) -> Path:
    pytest.importorskip("gguf")
    d = tmp_path_factory.mktemp("tiny-hf")
    save_tiny_checkpoint("llama-untied", d)
    return d


def _gguf(tiny_hf: Path, path: Path, template: str | None) -> Path:
    from .test_gguf import write_gguf

    write_gguf(tiny_hf, path, chat_template=template)
    return path


def test_gguf_without_a_template(tmp_path, tiny_hf, template_file):
    """Gemma 3 270M's GGUF carries no template: with --chat-template the bundle chats."""
    gguf = _gguf(tiny_hf, tmp_path / "none.gguf", None)
    plain = tmp_path / "plain"
    _export(gguf, "-o", plain, "--window", "100")
    assert _manifest(plain)["provenance"]["chat_template"] is None
    assert "no chat template" in _inspect(plain)

    out = tmp_path / "b"
    _export(gguf, "-o", out, "--window", "100", "--chat-template", template_file)
    assert _manifest(out)["provenance"]["chat_template"]["source"] == "file"
    _chat_works(out)


def test_a_ggufs_own_template_is_recorded_and_replaced(tmp_path, tiny_hf, template_file):
    from .test_gguf import TINY_TEMPLATE

    gguf = _gguf(tiny_hf, tmp_path / "own.gguf", TINY_TEMPLATE)
    own = tmp_path / "own"
    _export(gguf, "-o", own, "--window", "100")
    assert _manifest(own)["provenance"]["chat_template"] == {
        "source": "gguf",
        "path": str(gguf),
        "sha256": _sha(TINY_TEMPLATE),
    }
    assert f"from the GGUF's '{gguf}'" in _inspect(own)

    out = tmp_path / "b"
    r = _export(gguf, "-o", out, "--window", "100", "--chat-template", template_file)
    assert f"replacing the one from the GGUF's '{gguf}'" in r.stderr
    assert (out / "chat_template.jinja").read_text(encoding="utf-8") == TEMPLATE


# ---------------------------------------------------------------------------------------------
# Bad files: one line, before any work, nothing written
# ---------------------------------------------------------------------------------------------

# case -> (the file's bytes; None: no file, or a directory), what the one line says
BAD = {
    "missing": (None, "No such file or directory"),
    "directory": (None, "is a directory"),
    "not-utf8": (b"{{ messages }}\xff\xfe", "not valid UTF-8 (byte 14)"),
    "too-large": (b"x" * ((1 << 20) + 1), "over the 1 MiB"),
    "syntax": (b"{% for m in messages %}\n{{ m['content'] }}\n{% if %}\n{% endfor %}", "syntax error on line 3"),
    "render": (b"{% for m in messages %}{{ m['content'] / 0 }}{% endfor %}", "failed on this conversation"),
    "raises": (b"{{ raise_exception('roles must\nalternate') }}", "refused the conversation: roles must alternate"),
    "empty": (b"{# nothing #}\n", "as empty text"),
    "ignores-messages": (b"{% for m in messages %}{{ m.text }}|{% endfor %}", "without its last user message"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_template_file_is_one_line_and_writes_nothing(tmp_path, case):
    content, needle = BAD[case]
    path = tmp_path / "t.jinja"
    if case == "directory":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    out = tmp_path / "out" / "b"
    r = CliRunner().invoke(export_cli, ["demo", "-o", str(out), "--chat-template", str(path)])
    assert r.exit_code == 1, r.output
    lines = r.stderr.strip().splitlines()  # not even a progress line: refused before the export began
    assert len(lines) == 1 and lines[0].startswith("Error: ") and f"--chat-template '{path}'" in lines[0], lines
    assert needle in lines[0] and "Traceback" not in r.output
    assert not (tmp_path / "out").exists()  # refused before the export began: no progress, no partial


def test_a_bad_template_for_a_gguf_is_refused_before_conversion(tmp_path, tiny_hf):
    gguf = _gguf(tiny_hf, tmp_path / "m.gguf", None)
    (tmp_path / "t.jinja").write_text("{% for %}", encoding="utf-8")
    out = tmp_path / "out" / "b"
    (tmp_path / "out").mkdir()
    r = CliRunner().invoke(export_cli, [str(gguf), "-o", str(out), "--chat-template", str(tmp_path / "t.jinja")])
    assert r.exit_code == 1 and r.stderr.strip().count("\n") == 0, r.stderr
    assert "syntax error on line 1" in r.stderr
    assert list((tmp_path / "out").iterdir()) == []  # no conversion scratch directory


def test_the_console_script_prints_one_line(tmp_path):
    (tmp_path / "t.jinja").write_bytes(b"\xff")
    exe = Path(sys.executable).with_name("edge-export")
    cmd = [str(exe), "demo", "-o", str(tmp_path / "b"), "--chat-template", str(tmp_path / "t.jinja")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"Error: --chat-template '{tmp_path / 't.jinja'}' is not valid UTF-8 (byte 0)"
    ]
    assert not (tmp_path / "b").exists()


# ---------------------------------------------------------------------------------------------
# The manifest record
# ---------------------------------------------------------------------------------------------


def test_the_record_round_trips_through_the_manifest(demo_bundle):
    out, _ = demo_bundle
    m = Manifest.read(out / MANIFEST_FILE)
    again = Manifest.from_dict(json.loads(m.to_json()))
    assert again == m and again.chat_template_origin == m.chat_template_origin
    assert m.chat_template_origin.source == "file"


def _rewrite_provenance(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    data = _manifest(dst)
    change(data["provenance"])
    (dst / MANIFEST_FILE).write_text(json.dumps(with_digest(data), indent=2))
    return dst


def test_a_bundle_written_before_the_record_still_loads(demo_bundle, tmp_path):
    old = _rewrite_provenance(demo_bundle[0], tmp_path / "old", lambda p: p.pop("chat_template"))
    b = open_bundle(old)
    assert b.manifest.chat_template_origin is None
    assert b.manifest.tokenizer.chat_template == "chat_template.jinja"
    assert "origin not recorded" in _inspect(old)
    _chat_works(old)


def test_a_malformed_record_is_one_line_in_inspect(demo_bundle, tmp_path):
    bad = _rewrite_provenance(demo_bundle[0], tmp_path / "bad", lambda p: p["chat_template"].update(source="web"))
    with pytest.raises(BundleError, match="source 'web'"):
        _ = Manifest.read(bad / MANIFEST_FILE).chat_template_origin
    r = CliRunner().invoke(export_cli, ["inspect", str(bad)])
    assert r.exit_code == 1 and r.stderr.strip().count("\n") == 0 and "source 'web'" in r.stderr


def test_demo_checkpoint_still_ships_no_template():
    """The tests above lean on it: the demo model is not an instruct model."""
    config = json.loads((DEMO_CHECKPOINT / "tokenizer_config.json").read_text())
    assert "chat_template" not in config and not (DEMO_CHECKPOINT / "chat_template.jinja").exists()
