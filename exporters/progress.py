"""How an export says where it is: a bar on a terminal, plain lines with an ETA in a log, or nothing but errors.

Every stage reports through a `Progress`: `line(msg)` for a fact worth a line (calling the object does the same,
so the stages' `progress(msg)` calls, and callers that pass a plain `Callable[[str], None]`, keep working), and
`stage(name, total, unit, plan=...)` around work counted in units (layers, tensors, cases): its `advance()` gives
the rate so far and the ETA, and after the first unit of a long stage one line estimates the whole stage from it.

    progress = for_stream(sys.stderr)  # a bar on a terminal, plain lines otherwise
    with progress.stage("quantizing", 30, "layer", plan="int4-gptq, 16417 calibration tokens") as s:
        for i in range(30):
            s.status(f"layer {i + 1}: GPTQ")  # what the unit in flight is doing (bar, heartbeat lines)
            ...
            s.advance()

Renderers: LineProgress (plain lines to a callable: a non-terminal stream, a log, first-use exports), BarProgress
(tqdm on a terminal, docs/decisions/export-progress.md) and QuietProgress. Inside a stage a heartbeat thread
keeps every stretch without output under HEARTBEAT_SECONDS, however long one unit takes.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import IO, Any, Protocol, runtime_checkable

# Plain lines: a stage's unit lines at most this often, so a log shows progress without a line per tensor.
PLAIN_EVERY_SECONDS = 5.0
# Inside a stage no stretch without output is longer than this (the promise is 10 s; the heartbeat checks
# once a second).
HEARTBEAT_SECONDS = 8.0
# A stage projected to take at least this long gets one line with its estimate after its first unit, or after
# its first units that took this long together (the first of a fast stage's units is mostly warm-up: a float64
# reference pass's first layer measured 12x the mean of its 60).
ESTIMATE_FROM_SECONDS = 10.0
ESTIMATE_MEASURED_SECONDS = 2.0
# A bar's status at most this wide: tqdm takes the bar's width from what the text leaves of the terminal's
POSTFIX_WIDTH = 24

Emit = Callable[[str], None]


def duration(seconds: float) -> str:
    """`seconds` as a person reads it: 42 s, 3.5 min, 1 h 05 min."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.1f} min"
    return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60):02d} min"


class Stage:
    """A stage's count: units done of `total`, the rate so far, and what the unit in flight is doing."""

    def __init__(self, owner: LineProgress, name: str, total: int, unit: str, plan: str) -> None:
        self.owner, self.name, self.total, self.unit, self.plan = owner, name, max(int(total), 0), unit, plan
        self.started = owner.clock()
        self.done = 0.0
        self.state = ""  # what the unit in flight is doing
        self.estimated = False  # the estimate line is said once, after the first unit

    def advance(self, n: float = 1.0, note: str = "") -> None:
        """`n` more units done (fractions allowed); `note` says something of the unit just finished."""
        self.owner._advance(self, n, note)

    def status(self, msg: str) -> None:
        """What the unit in flight is doing: the bar's postfix, the heartbeat's lines."""
        self.owner._status(self, msg)

    def elapsed(self) -> float:
        return self.owner.clock() - self.started

    def eta(self) -> float | None:
        """Seconds left at the rate so far; None before the first unit."""
        if self.done <= 0:
            return None
        return max(self.total - self.done, 0.0) * self.elapsed() / self.done

    def count(self) -> str:
        whole = abs(self.done - round(self.done)) < 1e-6  # fractions summed to a whole number (weights, bytes)
        done = f"{round(self.done)}" if whole else f"{self.done:.1f}"
        return f"{done}/{self.total} {self.unit}s"

    def where(self) -> str:
        """`name done/total units, 1.2 min elapsed, ETA 3.4 min` (`name, 12 s elapsed` for a stage of one unit)."""
        if self.total <= 1:
            return f"{self.name}, {duration(self.elapsed())} elapsed"
        eta = self.eta()
        return f"{self.name} {self.count()}, {duration(self.elapsed())} elapsed" + (
            f", ETA {duration(eta)}" if eta is not None else ""
        )


@runtime_checkable
class Progress(Protocol):
    """What every export stage reports through (module docstring)."""

    def __call__(self, msg: str) -> None: ...

    def line(self, msg: str) -> None: ...

    def stage(
        self, name: str, total: int, unit: str = "layer", *, plan: str = ""
    ) -> contextlib.AbstractContextManager[Stage]: ...


class LineProgress:
    """Plain lines to `emit`: each line as it comes, a stage's plan line, one estimate line after its first unit,
    unit lines (done/total, elapsed, ETA) at most every `every` seconds, and a closing line. A heartbeat
    line, with what the unit in flight is doing, follows `heartbeat` seconds without output inside a stage."""

    def __init__(
        self,
        emit: Emit,
        *,
        every: float = PLAIN_EVERY_SECONDS,
        heartbeat: float = HEARTBEAT_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._emit, self.every, self.heartbeat, self.clock = emit, every, heartbeat, clock
        self._lock = threading.RLock()  # the heartbeat thread writes too
        self._stages: list[Stage] = []
        self._last_output = clock()
        self._last_unit_line = float("-inf")
        self._beat: threading.Thread | None = None
        self._stop = threading.Event()

    def __call__(self, msg: str) -> None:
        self.line(msg)

    def line(self, msg: str) -> None:
        with self._lock:
            self._write(msg)

    @contextlib.contextmanager
    def stage(self, name: str, total: int, unit: str = "layer", *, plan: str = "") -> Iterator[Stage]:
        st = Stage(self, name, total, unit, plan)
        with self._lock:
            self._stages.append(st)
            self._open(st)
            self._start_heartbeat()
        ok = False
        try:
            yield st
            ok = True
        finally:
            with self._lock:
                self._stages.remove(st)
                self._close(st, ok)
            if not self._stages:
                self._stop_heartbeat()

    # What a renderer changes: how a stage opens, advances, ticks and closes, and where lines go.

    def _write(self, msg: str) -> None:
        self._emit(msg)
        self._last_output = self.clock()

    def _open(self, st: Stage) -> None:
        self._last_unit_line = st.started  # a stage shorter than `every` says only its plan and its end
        if st.total > 1:
            self._write(f"{st.name}: {st.total} {st.unit}s" + (f" ({st.plan})" if st.plan else ""))
        elif st.plan:
            self._write(f"{st.name} ({st.plan})")

    def _advance(self, st: Stage, n: float, note: str) -> None:
        with self._lock:
            st.done = min(st.done + n, float(st.total))
            st.state = ""
            now = self.clock()
            if self._estimate(st):
                self._last_unit_line = now  # the estimate line says as much as a unit line would
            elif st.done < st.total and now - self._last_unit_line >= self.every:
                self._last_unit_line = now
                self._write(f"  {st.where()}" + (f": {note}" if note else ""))

    def _estimate(self, st: Stage) -> bool:
        """After the first unit (the first few where one is too quick to time: a first unit of a fast stage is
        mostly warm-up), where the whole stage looks long: one line with its cost. Whether said."""
        if st.estimated or st.done < 1 or st.done >= st.total or st.elapsed() < ESTIMATE_MEASURED_SECONDS:
            return False
        st.estimated = True
        per_unit = st.elapsed() / st.done
        projected = per_unit * st.total
        if projected < ESTIMATE_FROM_SECONDS:
            return False
        finish = time.strftime("%H:%M", time.localtime(time.time() + per_unit * (st.total - st.done)))
        whole = abs(st.done - round(st.done)) < 1e-6 or st.done >= 10  # units or fractions (weights: M weights)
        first = "the first" if st.done == 1 else f"the first {round(st.done) if whole else f'{st.done:.1f}'}"
        self._write(
            f"{st.name}: about {duration(projected)} for {st.total} {st.unit}s"
            + (f" ({st.plan})" if st.plan else "")
            + f", {per_unit:.{1 if per_unit >= 0.1 else 3}f} s a {st.unit} as measured on {first}; done about {finish}"
        )
        return True

    def _status(self, st: Stage, msg: str) -> None:
        st.state = msg

    def _tick(self) -> None:
        """The heartbeat, once a second inside a stage: a line after `heartbeat` seconds of silence."""
        if self._stages and self.clock() - self._last_output >= self.heartbeat:
            st = self._stages[-1]
            self._write(f"  {st.where()}" + (f": {st.state}" if st.state else ""))

    def _close(self, st: Stage, ok: bool) -> None:
        if ok and st.total > 1:
            self._write(f"{st.name}: {st.count()} in {duration(st.elapsed())}")

    def _start_heartbeat(self) -> None:
        if self._beat is not None or self.heartbeat <= 0:
            return
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat_loop, name="export-progress", daemon=True)
        self._beat.start()

    def _stop_heartbeat(self) -> None:
        beat = self._beat
        if beat is None:
            return
        self._stop.set()
        beat.join()
        self._beat = None

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat)):
            with self._lock:
                try:
                    self._tick()
                except Exception:  # a closed stream must not kill the export from a side thread
                    self._stop.set()


class BarProgress(LineProgress):
    """A tqdm bar per stage on a terminal `stream` (elapsed, rate, ETA; refreshed once a second by the heartbeat
    so the clock moves inside a long unit), lines above it; the plan, estimate and closing lines as LineProgress."""

    def __init__(self, stream: IO[str], *, prefix: Callable[[], str] = lambda: "", **kwargs: Any) -> None:
        super().__init__(lambda msg: None, every=float("inf"), **kwargs)
        self.stream, self.prefix = stream, prefix
        self._bars: dict[int, Any] = {}

    def _write(self, msg: str) -> None:
        from tqdm import tqdm

        tqdm.write(self.prefix() + msg, file=self.stream)  # above the bars, which are redrawn below it
        self._last_output = self.clock()

    def _open(self, st: Stage) -> None:
        from tqdm import tqdm

        super()._open(st)
        fixed = _zero_width(self.stream)
        self._bars[id(st)] = tqdm(
            total=st.total,
            desc=st.name,
            unit=f" {st.unit}",
            file=self.stream,
            # a terminal that says it is 0 x 0 (a pty nobody sized: `script`, some CI runners) would get no bar
            # at all: 80 x 24 there, the terminal's own size (followed as it changes) elsewhere
            dynamic_ncols=not fixed,
            ncols=80 if fixed else None,
            nrows=24 if fixed else None,
            smoothing=0,  # the average rate: layers differ (the first builds caches), the mean does not jump
            leave=False,  # the closing line says it instead, so a log of the terminal keeps one line a stage
            position=len(self._stages) - 1,
        )

    def _advance(self, st: Stage, n: float, note: str) -> None:
        with self._lock:
            before = st.done
            super()._advance(st, n, note)
            bar = self._bars.get(id(st))
            if bar is not None:
                bar.set_postfix_str(_short(note), refresh=False)
                step = st.done - before
                bar.update(int(step) if float(step).is_integer() else step)  # "3/30", not "3.0/30"

    def _status(self, st: Stage, msg: str) -> None:
        with self._lock:
            st.state = msg
            bar = self._bars.get(id(st))
            if bar is not None:
                bar.set_postfix_str(_short(msg))

    def _tick(self) -> None:
        for bar in self._bars.values():
            bar.refresh()
        self._last_output = self.clock()

    def _close(self, st: Stage, ok: bool) -> None:
        bar = self._bars.pop(id(st), None)
        if bar is not None:
            bar.close()
        super()._close(st, ok)


class QuietProgress(LineProgress):
    """Nothing at all (`--quiet`): errors reach the user as the command's one-line error, not through here."""

    def __init__(self) -> None:
        super().__init__(lambda msg: None, heartbeat=0)

    def _write(self, msg: str) -> None:
        pass


def as_progress(progress: Progress | Emit | None) -> Progress:
    """`progress` as a Progress: itself, plain lines to a `Callable[[str], None]`, or nothing for None."""
    if progress is None:
        return QuietProgress()
    if isinstance(progress, Progress):
        return progress
    return LineProgress(progress)


def _short(msg: str, width: int = POSTFIX_WIDTH) -> str:
    return msg if len(msg) <= width else msg[: width - 3] + "..."


def _zero_width(stream: IO[str]) -> bool:
    try:
        return os.get_terminal_size(stream.fileno()).columns == 0
    except (AttributeError, OSError, ValueError):  # no file descriptor (a test's stream): tqdm's own default
        return False


def is_terminal(stream: IO[str]) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM") != "dumb"


def for_stream(stream: IO[str], *, quiet: bool = False, t0: float | None = None) -> Progress:
    """The renderer for `stream` (stderr, usually): nothing with `quiet`, a bar where it is a terminal, else
    plain lines. Every line starts with the seconds since `t0` (default: now), as the export's log always has."""
    start = time.perf_counter() if t0 is None else t0

    def prefix() -> str:
        return f"[{time.perf_counter() - start:6.1f}s] "

    if quiet:
        return QuietProgress()
    if is_terminal(stream):
        return BarProgress(stream, prefix=prefix)

    def emit(msg: str) -> None:
        stream.write(prefix() + msg + "\n")
        stream.flush()

    return LineProgress(emit)
