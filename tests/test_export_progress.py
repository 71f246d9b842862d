"""An export says what it will cost and where it is (exporters/progress.py), and validates at bounded cost.

Plain lines where stderr is not a terminal (done/total and an ETA, at most one unit line every few seconds), a
bar where it is, nothing but the error under `edge-export --quiet`; one line estimating a long stage from its first
unit; a heartbeat inside a long unit; old-style `Callable[[str], None]` progress still takes lines. Validation: the
graph with int8 activations follows its twin's tokens, so the reference scores each case once.
"""

from __future__ import annotations

import io
import re
import shutil
import time

import pytest
from click.testing import CliRunner

from edge_runtime.cli.export import main as export_cli
from edge_runtime.exporters import progress as progress_mod
from edge_runtime.exporters import validate as validate_mod
from edge_runtime.exporters.export import ExportOptions, export
from edge_runtime.exporters.progress import BarProgress, LineProgress, QuietProgress, as_progress, for_stream
from edge_runtime.exporters.quant import QuantConfig, QuantMethod
from edge_runtime.models import DEMO_CHECKPOINT


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The demo checkpoint less heldout.txt (its perplexity report is not these tests')."""
    d = tmp_path_factory.mktemp("progress") / "demo"
    shutil.copytree(DEMO_CHECKPOINT, d, ignore=shutil.ignore_patterns("heldout.txt"))
    return d


def test_plain_lines_carry_done_total_and_eta_and_are_bounded():
    clock, lines = FakeClock(), []
    p = LineProgress(lines.append, every=5.0, heartbeat=0, clock=clock)
    with p.stage("quantizing", 100, "layer", plan="int4-gptq, block 32") as s:
        for _ in range(100):
            clock.now += 1.0
            s.advance()
    units = [x for x in lines if x.startswith("  quantizing ")]
    assert lines[0] == "quantizing: 100 layers (int4-gptq, block 32)"
    assert lines[-1] == "quantizing: 100/100 layers in 1.7 min"
    assert 10 <= len(units) <= 100 / 5  # a line at most every 5 s of 100 s, yet the log shows progress
    for line in units:
        assert re.search(r"\d+/100 layers, .* elapsed, ETA \d", line), line
    assert "ETA 1.6 min" in units[0]  # after 5 layers of 1 s: 95 s left


def test_an_estimate_line_follows_the_first_unit_of_a_long_stage():
    clock, lines = FakeClock(), []
    p = LineProgress(lines.append, every=float("inf"), heartbeat=0, clock=clock)
    with p.stage("quantizing", 30, "layer", plan="int4-gptq, 16417 calibration tokens") as s:
        clock.now += 24.0
        s.advance()
        estimate = len(lines)
        for _ in range(29):
            clock.now += 24.0
            s.advance()
    assert lines[0] == "quantizing: 30 layers (int4-gptq, 16417 calibration tokens)"
    assert estimate == 2 and lines[1].startswith(
        "quantizing: about 12.0 min for 30 layers (int4-gptq, 16417 calibration tokens), 24.0 s a layer as measured "
        "on the first; done about "
    )
    # units too quick to time one by one (the first is mostly warm-up): the first 2 s of them
    quick = []
    q = LineProgress(quick.append, every=float("inf"), heartbeat=0, clock=clock)
    with q.stage("reference forward", 100, "layer") as s:
        for _ in range(100):
            clock.now += 0.25
            s.advance()
    assert quick[1].startswith(
        "reference forward: about 25 s for 100 layers, 0.2 s a layer as measured on the first 8;"
    )
    # a short stage says its plan and its end only
    short = []
    q = LineProgress(short.append, heartbeat=0, clock=clock)
    with q.stage("dequantizing", 272, "tensor") as s:
        for _ in range(272):
            clock.now += 0.01
            s.advance()
    assert short == ["dequantizing: 272 tensors", "dequantizing: 272/272 tensors in 3 s"]


def test_a_heartbeat_breaks_a_long_unit_s_silence_with_what_it_is_doing():
    lines = []
    p = LineProgress(lines.append, heartbeat=0.2)
    with p.stage("calibrating", 30, "layer") as s:
        s.status("layer 1: calibration forward, sequence 3/32")
        time.sleep(0.7)
    beats = [x for x in lines if "sequence 3/32" in x]
    assert beats and beats[0].startswith("  calibrating 0/30 layers, 0 s elapsed")
    n = len(lines)
    time.sleep(0.4)
    assert len(lines) == n  # outside a stage the heartbeat is stopped


def test_a_terminal_gets_a_bar_and_lines_above_it(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    term = Terminal()
    p = for_stream(term)
    assert isinstance(p, BarProgress)
    p("loading the checkpoint")
    with p.stage("quantizing", 3, "layer") as s:
        for _ in range(3):
            time.sleep(0.15)  # past tqdm's 0.1 s between redraws
            s.advance(note="worst weight error 1.0e-01")
    out = term.getvalue()
    assert re.search(r"\[ *\d+\.\ds\] loading the checkpoint\n", out)
    assert re.search(r"quantizing: +\d+%\|.*\| 3/3 ", out)  # tqdm's bar, drawn with \r on the terminal
    assert "quantizing: 3/3 layers in" in out
    monkeypatch.setenv("TERM", "dumb")
    assert not isinstance(for_stream(Terminal()), BarProgress)


def test_a_non_terminal_gets_plain_stamped_lines_and_quiet_gets_nothing():
    log = io.StringIO()
    p = for_stream(log)
    assert type(p) is LineProgress
    p("building ort graph")
    assert re.fullmatch(r"\[ *\d+\.\ds\] building ort graph\n", log.getvalue())
    quiet = for_stream(log, quiet=True)
    assert isinstance(quiet, QuietProgress)
    with quiet.stage("quantizing", 2, "layer") as s:
        quiet("nothing")
        s.advance(2)
    assert log.getvalue().count("\n") == 1


def test_old_style_callable_progress_still_gets_every_stage_s_lines(demo, tmp_path, monkeypatch):
    """A plain Callable[[str], None] (tests, first-use exports) is wrapped: stage lines arrive as lines, and the
    plan line with its estimate comes after the first layer, before the stage's end."""
    monkeypatch.setattr(progress_mod, "ESTIMATE_FROM_SECONDS", 0.0)  # the demo is quick: every stage is "long"
    monkeypatch.setattr(progress_mod, "ESTIMATE_MEASURED_SECONDS", 0.0)  # and its first layer long enough to time
    lines: list[str] = []
    export(ExportOptions(checkpoint=demo, out=tmp_path / "b", quant=QuantConfig(QuantMethod.INT4)), lines.append)
    assert all(isinstance(x, str) for x in lines)
    start = lines.index("quantizing: 6 layers (int4, block 32)")
    estimate = next(i for i, x in enumerate(lines) if x.startswith("quantizing: about "))
    end = next(i for i, x in enumerate(lines) if x.startswith("quantizing: 6/6 layers in "))
    assert start < estimate < end
    assert "a layer as measured on the first" in lines[estimate]
    assert any(x.startswith("validating against the float64 reference") for x in lines)
    assert lines[-1].startswith(f"wrote {tmp_path / 'b'} in ")
    assert as_progress(lines.append)  # wrapped, callable like the function it wraps


def test_quiet_prints_nothing_on_success_and_one_line_on_failure(demo, tmp_path):
    out = tmp_path / "b"
    r = CliRunner().invoke(export_cli, [str(demo), "-o", str(out), "--quant", "int4", "--quiet"])
    assert r.exit_code == 0, r.output
    assert r.output == "" and (out / "manifest.json").is_file()
    r = CliRunner().invoke(export_cli, [str(demo), "-o", str(out), "--quant", "int4", "-q"])  # exists already
    assert r.exit_code == 1
    (line,) = r.output.splitlines()
    assert line.startswith("Error: ") and "--overwrite" in line


def test_the_int8_activation_graph_follows_its_twin_and_the_reference_runs_once_per_case(demo, tmp_path, monkeypatch):
    """Two grids (the accuracy_level 0 twin, then the bundle's graph with int8 activations) but one float64 pass:
    the bundle's graph is fed the twin's tokens, and the memo's logits serve both. Two float32 passes over the
    dense streams: the probe of the fp32 bound, then the int8 probe of the int8 bound."""
    passes = []
    real = validate_mod.forward_streams

    def counted(model, streams, *a, **k):
        passes.append((model.dtype.name, len(streams)))
        return real(model, streams, *a, **k)

    monkeypatch.setattr(validate_mod, "forward_streams", counted)
    lines: list[str] = []
    m = export(ExportOptions(checkpoint=demo, out=tmp_path / "b", quant=QuantConfig(QuantMethod.INT4)), lines.append)
    assert passes == [("float64", 4), ("float32", 3), ("float32", 3)]
    assert m.validation.tolerance_basis["int8_probe_rel_err"] > 0
    assert "  the reference's logits of all 4 streams reused from the earlier grid" in lines
    assert m.validation.max_rel_err <= m.validation.tolerance
    assert [c.tokens for c in m.validation.cases] == [9, 15, 72, 104]
    assert m.quantization["exact_parity"]["max_rel_err"] <= m.quantization["exact_parity"]["tolerance"]


def test_a_followed_stream_must_be_the_case_s_own():
    with pytest.raises(ValueError, match="followed stream"):
        validate_mod._graph_case(
            None,
            None,
            flavor=None,
            dtype=None,
            kv_heads=[],
            geometry=None,
            prompt=[1, 2],
            decode=2,
            follow=[1, 3, 4, 5],
        )


def test_the_twin_s_small_int8_head_is_a_float_gemm_of_the_same_values(demo, tmp_path):
    """MatMulNBits at accuracy_level 0 dequantizes 8-bit codes whole on every call; the twin's head, where its float32
    copy is small, is a Gemm over those values dequantized once, and the twin still meets the fp32 bound."""
    import numpy as np
    from onnx import numpy_helper

    from edge_runtime.exporters.checkpoint import load_checkpoint
    from edge_runtime.exporters.decoder import Flavor, Precision, build_decoder
    from edge_runtime.exporters.quant_pipeline import exact_twin, prepare_weights

    ckpt = load_checkpoint(demo)
    config = QuantConfig(QuantMethod.INT4)
    prepared = prepare_weights(ckpt, config, None, None, trt=False, weights_label="fp32", progress=None)
    twin = build_decoder(ckpt.args, prepared.weights, Flavor.ORT, Precision.FP32, exact_twin(prepared.quantized))
    (head,) = [n for n in twin.model.graph.node if n.name.startswith("/lm_head/") and n.op_type != "Reshape"]
    assert head.op_type == "Gemm"
    weights = {t.name: t for t in twin.model.graph.initializer}
    table = numpy_helper.to_array(weights[head.input[1]])
    assert table.dtype == np.float32
    assert np.array_equal(table, prepared.quantized.lookup(prepared.weights.lm_head).dequantize())
    m = export(ExportOptions(checkpoint=demo, out=tmp_path / "b", quant=config))
    assert m.quantization["exact_parity"]["max_rel_err"] <= m.quantization["exact_parity"]["tolerance"] <= 1e-4


class Recorder(LineProgress):
    """Every status and unit of every stage, in order."""

    def __init__(self) -> None:
        super().__init__(lambda msg: None, heartbeat=0)
        self.events: list[str] = []

    def _status(self, st, msg):
        self.events.append(f"{st.name}: {msg}")
        super()._status(st, msg)

    def _advance(self, st, n, note):
        self.events.append(f"{st.name}: done {st.done + n:g}")
        super()._advance(st, n, note)


def test_each_layer_is_calibrated_as_it_is_quantized_and_the_stage_says_so(demo, tmp_path):
    """The quantizing stage's units are layers, each calibrated (a forward per calibration sequence) just before
    it is quantized: layer 2's forward starts after layer 1 is done."""
    from edge_runtime.exporters.checkpoint import load_checkpoint
    from edge_runtime.exporters.quant_pipeline import prepare_weights

    rec = Recorder()
    ckpt = load_checkpoint(demo)
    calib = tmp_path / "calibration.txt"
    calib.write_text("ROMEO. But soft, what light through yonder window breaks? It is the east. " * 12)
    prepare_weights(
        ckpt, QuantConfig(QuantMethod.INT4_GPTQ), None, calib, trt=False, weights_label="fp32", progress=rec
    )
    quantizing = [e for e in rec.events if e.startswith("quantizing: ")]
    first = next(i for i, e in enumerate(quantizing) if "layer 2: calibration forward" in e)
    assert quantizing.index("quantizing: done 1") < first
    assert any(
        "layer 1: calibration forward, sequence 1/" in e for e in quantizing[: quantizing.index("quantizing: done 1")]
    )
    assert "quantizing: layer 1: GPTQ down" in quantizing
    assert quantizing[-1] == "quantizing: done 6"
