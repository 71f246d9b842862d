"""Ctrl-C never costs a conversation: `edge-run --chat` driven through a pseudo-terminal with SIGINT mid-reply
goes on for two more turns, and in the Python API a SIGINT landing anywhere in a step leaves the session
describing exactly what its ring holds."""

from __future__ import annotations

import os
import pty
import select
import signal
import time

import numpy as np

from edge_runtime.engine import LoadOptions, load
from edge_runtime.session import Session

from .bad_inputs_util import cli


class Terminal:
    """A child on a pseudo-terminal: what it printed so far, and waits for text to appear."""

    def __init__(self, fd: int):
        self.fd, self.seen = fd, ""

    def read(self, timeout: float) -> None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if ready:
            try:
                self.seen += os.read(self.fd, 65536).decode("utf-8", "replace")
            except OSError:  # the child closed its side
                pass

    def wait_for(self, text: str, after: int, timeout: float = 120) -> int:
        """Position just past the first `text` at or after `after` (fails after `timeout` seconds)."""
        end = time.monotonic() + timeout
        while (at := self.seen.find(text, after)) < 0:
            assert time.monotonic() < end, f"no {text!r} after {timeout} s; the terminal shows:\n{self.seen[-2000:]}"
            self.read(0.2)
        return at + len(text)

    def type(self, text: str) -> None:
        os.write(self.fd, text.encode())


def test_ctrl_c_mid_reply_and_the_chat_goes_on(serve_bundle):
    """A long reply is stopped by SIGINT once text has streamed; the chat says so, prompts again, and the two
    turns after it reply normally (no "driven outside this session" error), each cut by --max-tokens with a
    line saying so (the demo model seldom ends a turn); Ctrl-D then leaves with 0."""
    master, slave = pty.openpty()
    # serve_bundle: the demo model with a chat template (conftest.py), shared with the edge-serve tests
    args = ("--bundle", str(serve_bundle), "--target", "x86", "--chat", "--max-tokens", "2000", "--seed", "1")
    p = cli("run", *args, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    term = Terminal(master)
    try:
        at = term.wait_for("> ", 0)
        term.type("Tell me a very long story\n")
        reply_start = at  # the reply streams right after the echo of the input
        # Let it stream a while, then Ctrl-C mid-reply.
        end = time.monotonic() + 60
        while len(term.seen) < reply_start + 200 and time.monotonic() < end:
            term.read(0.05)
        assert p.poll() is None, term.seen
        p.send_signal(signal.SIGINT)
        at = term.wait_for("reply stopped", reply_start)
        at = term.wait_for("> ", at)
        for turn in ("And then?", "Thank you"):
            term.type(turn + "\n")
            at = term.wait_for("(reply cut at 2000 tokens by --max-tokens)", term.wait_for(turn, at))
            at = term.wait_for("> ", at)
        assert "Error" not in term.seen and "Traceback" not in term.seen, term.seen[-2000:]
        term.type("\x04")  # Ctrl-D at the prompt
        assert p.wait(timeout=60) == 0, term.seen[-2000:]
    finally:
        os.close(master)


def test_sigint_anywhere_in_a_step_leaves_session_and_ring_consistent(tied_bundle):
    """SIGINTs at random moments of replies (timer-driven, landing in prefill, decode, sampling and the
    session's bookkeeping alike): after each, the session holds exactly the user's tokens and the tokens it
    yielded, the ring agrees, and the next turn runs."""
    engine = load(tied_bundle, LoadOptions(sinks=4, window=500, slack=8))
    session = Session(engine)
    rng = np.random.default_rng(0)
    stream: list[int] = []  # what the caller gave and saw, in order
    interrupted = 0
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    armed = [False]  # a timer that fires once the turn is over must not interrupt the test itself

    def ctrl_c(*_) -> None:
        if armed[0]:
            signal.raise_signal(signal.SIGINT)

    alarm = signal.signal(signal.SIGALRM, ctrl_c)
    t0 = time.perf_counter()
    list(session.send([5, 6, 7], max_tokens=40, stop_ids=()))
    turn_s = time.perf_counter() - t0  # timers spread over a whole turn: prefill, decode and bookkeeping
    session.reset()
    try:
        for _ in range(40):
            if session.length > 400:
                session.reset()
                stream = []
            user = rng.integers(3, 300, int(rng.integers(1, 12))).tolist()
            stream += user
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, float(rng.uniform(1e-5, turn_s)))
                for step in session.send(user, max_tokens=40, stop_ids=()):
                    stream.append(step.token)
                armed[0] = False  # inside the try: an interrupt landing before this line is caught below
            except KeyboardInterrupt:
                armed[0] = False
                interrupted += 1
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            fed = len(stream) - (session.pending is not None)
            # A turn interrupted inside its prefill holds the chunks fed by then: the caller's record follows
            # the session there, which is the API's contract (session.length says how far it got).
            if session.length < len(stream):
                assert stream[: session.length] == session.recent_ids()
                stream = stream[: session.length]
                fed = len(stream) - (session.pending is not None)
            assert session.recent_ids() == stream
            assert engine.ring.tokens == fed
            session._check_engine()  # no "driven outside this session"
        assert interrupted >= 10, f"only {interrupted} of 40 turns were interrupted"
        # ... and the conversation goes on.
        assert len(list(session.send(rng.integers(3, 300, 5).tolist(), max_tokens=5, stop_ids=()))) == 5
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, alarm)
        signal.signal(signal.SIGINT, previous)
