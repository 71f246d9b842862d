"""Reading Markdown for tests/test_docs_runnable.py: fenced blocks, links, GitHub heading anchors; and running
a document's runnable blocks (the conventions are in that file's docstring)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK_TIMEOUT_S = 300  # a block that exports the real model takes ~30 s on an idle 2-core machine
STOP_GRACE_S = 10
RUNNABLE_LANGS = {"bash": "bash", "sh": "bash", "python": "python"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    lang: str  # "bash" or "python"
    text: str
    line: int  # of the opening fence, 1-based


def _fenced(lines: list[str]) -> list[tuple[int, int, str, str]]:
    """(first line index, closing line index, info string, content) of every fenced block, CommonMark's rules:
    a block closes on a fence of its own character at least as long, with no info string."""
    out = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m or (m["fence"][0] == "`" and "`" in m["info"]):
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        j = i + 1
        while j < len(lines):
            c = _FENCE.match(lines[j])
            if c and c["fence"][0] == fence[0] and len(c["fence"]) >= len(fence) and not c["info"].strip():
                break
            j += 1
        body = [ln[indent:] if ln[:indent].strip() == "" else ln.lstrip() for ln in lines[i + 1 : j]]
        out.append((i, j, m["info"].strip(), "".join(ln + "\n" for ln in body)))
        i = j + 1
    return out


def fenced_blocks(doc: Path) -> list[tuple[int, str, str]]:
    """(line of the opening fence, info string, content) of every fenced block of `doc`."""
    return [(i + 1, info, text) for i, _j, info, text in _fenced(doc.read_text(encoding="utf-8").splitlines())]


def runnable_blocks(doc: Path) -> list[Block]:
    """The blocks whose info string is `<bash|sh|python> runnable ...`, in document order."""
    blocks = []
    for start, _end, info, text in _fenced(doc.read_text(encoding="utf-8").splitlines()):
        words = info.split()
        if len(words) >= 2 and words[0] in RUNNABLE_LANGS and "runnable" in words[1:]:
            blocks.append(Block(RUNNABLE_LANGS[words[0]], text, start + 1))
    return blocks


def _prose_lines(doc: Path) -> list[tuple[int, str]]:
    """(1-based line number, text) of the lines outside fenced blocks, code spans (which may run across lines
    within a paragraph) blanked."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    inside = set()
    for start, end, _info, _text in _fenced(lines):
        inside.update(range(start, end + 1))
    text = "\n".join("" if n in inside else line for n, line in enumerate(lines))
    text = re.sub(r"(`+)(?:(?!\n\s*\n).)+?\1", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [(n + 1, line) for n, line in enumerate(text.split("\n")) if n not in inside]


_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)")
_HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*\b(?:href|src)=\"([^\"]+)\"", re.IGNORECASE)


def links_of(doc: Path) -> list[tuple[int, str]]:
    """(line, target) of every link: inline, image, reference definition, HTML href/src; not inside code."""
    found = []
    for n, line in _prose_lines(doc):
        for rx in (_LINK, _HTML_LINK):
            found += [(n, m.group(1)) for m in rx.finditer(line)]
        m = _REF_DEF.match(line)
        if m:
            found.append((n, m.group(1)))
    return found


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its rendered text lowercased, punctuation other than `-` and `_`
    dropped, each space a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text).replace("`", "")
    text = re.sub(r"\*+|(?<!\w)_+|_+(?!\w)", "", text)  # emphasis markers
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors_of(doc: Path) -> set[str]:
    """Every anchor a link may name in `doc`: heading slugs (repeats get -1, -2, ... as on GitHub) and HTML
    id/name attributes."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    raw = doc.read_text(encoding="utf-8").splitlines()
    for n, line in _prose_lines(doc):
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)(?:\s+#+)?\s*$", raw[n - 1])  # the heading as written
        if m:
            slug = github_slug(m.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
        anchors.update(re.findall(r"<a\b[^>]*\b(?:id|name)=\"([^\"]+)\"", line))
    return anchors


def free_port() -> int:
    from edge_runtime.serve.process import free_port as _free_port

    return _free_port()


class DocRun:
    """One document's runnable blocks, in order, in `work`; see test_docs_runnable.py for the environment."""

    def __init__(self, work: Path, scratch: Path):
        self.work = work
        self.blocks_dir = scratch / "blocks"
        self.blocks_dir.mkdir()
        home = scratch / "home"
        home.mkdir()
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("XDG_", "EDGE_SERVE_"))}
        env.update(
            HOME=str(home),
            EDGE_RUNTIME_CACHE=str(home / ".cache" / "edge-runtime"),  # where ~/.cache/edge-runtime would be
            PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
            NO_PROXY="localhost,127.0.0.1",
        )
        self.env = env
        self.groups: list[int] = []

    def __enter__(self) -> DocRun:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(self, block: Block) -> None:
        import pytest

        text = re.sub(r"\b8080\b", str(self.port), block.text)
        name = f"block-{block.line}"
        if block.lang == "python":
            script = self.blocks_dir / f"{name}.py"
            script.write_text(text, encoding="utf-8")
            cmd = [sys.executable, str(script)]
        else:
            cmd = ["bash", "-euo", "pipefail", "-c", text]
        out_path, err_path = self.blocks_dir / f"{name}.out", self.blocks_dir / f"{name}.err"
        # Files, not pipes: a server the block leaves running would hold a pipe open and the wait would hang.
        with out_path.open("wb") as out, err_path.open("wb") as err:
            proc = subprocess.Popen(
                cmd,
                cwd=self.work,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            self.groups.append(proc.pid)
            t0 = time.monotonic()
            try:
                rc = proc.wait(timeout=BLOCK_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._signal(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
        seconds = time.monotonic() - t0
        stdout = out_path.read_text(encoding="utf-8", errors="replace")
        stderr = err_path.read_text(encoding="utf-8", errors="replace")
        what = f"{block.lang} block at line {block.line} ({seconds:.1f} s)"
        report = f"--- block\n{text}--- stdout (tail)\n{stdout[-3000:]}\n--- stderr (tail)\n{stderr[-3000:]}"
        if rc is None:
            pytest.fail(f"{what} ran past {BLOCK_TIMEOUT_S} s\n{report}")
        if rc != 0:
            pytest.fail(f"{what} exited {rc}\n{report}")
        if not (stdout.strip() or stderr.strip()):
            pytest.fail(f"{what} printed nothing\n{report}")
        print(f"{what}: ok")

    @staticmethod
    def _signal(pgid: int, sig: int) -> bool:
        """Signal a process group this run started; False when none of it is left."""
        try:
            os.killpg(pgid, sig)
            return True
        except ProcessLookupError:
            return False

    def stop(self) -> None:
        """Stop what the blocks left running: SIGTERM to each block's process group, SIGKILL after a grace."""
        live = [g for g in self.groups if self._signal(g, signal.SIGTERM)]
        deadline = time.monotonic() + STOP_GRACE_S
        while live and time.monotonic() < deadline:
            time.sleep(0.1)
            live = [g for g in live if self._signal(g, 0)]
        for g in live:
            self._signal(g, signal.SIGKILL)
