"""Speculative decoding: propose k tokens cheaply, verify them in one target call.

    spec = SpeculativeDecoder(PromptLookup())                  # or "lookup"; DraftModel(load(draft_dir))
    generate(engine_or_session, tok, prompt, config, speculative=spec); spec.stats.acceptance

`speculative_generate_step` is generate.py's `generate_step` with speculation: the same contract (one Step per
token, over a decoding.Source), the same token choice (decoding.Selector); stream_generate picks one of the two.

A step feeds the target's pending token and the k proposals as one chunk (Turn.extend), reads the k + 1
logits rows and walks them in order. Row j decides the token after proposal j: under greedy decoding (and
for proposals that were chosen rather than sampled: prompt lookup, a greedy draft) the target's own choice
from that row is taken, and the walk goes on while it equals the proposal; so the tokens are exactly
plain decoding's, given the same logits. A sampled draft uses the standard rejection rule (Leviathan et
al. 2023, Chen et al. 2023): accept proposal d with probability min(1, p(d)/q(d)), else emit a token of
norm(max(p - q, 0)) and stop; every token is then distributed as the target's p. The rows past the first
disagreement are dropped from the ring (Turn.drop, exact within the slack rows, so k <= slack).

Where it loses: a rejected proposal costs a (k+1)-token call instead of a 1-token one (on a 2-core x86,
a 2-token call of the 135M int4 model costs ~1.5 decode steps, 9 tokens ~3.4: small models verify
compute-bound). So k is chosen per step from what was measured: the decoder keeps each call size's cost
in plain decode steps (seconds over the plain step's, proposing included), and each *arm* (an n-gram size
of the lookup, the draft) its per-token acceptance a; the k taken maximises the expected tokens a call
emits, (1 - a^(k+1)) / (1 - a), over that cost. Each arm also keeps a measured gain: the tokens a step
emitted, in plain-decode-step seconds, over the step's seconds. An arm whose gain falls below 1 is
switched off for a while (doubling up to 512 tokens), then probed again; meanwhile the decoder decodes
plainly. The switch reads the clock, so under sampling a seed fixes
the distribution, not the very tokens; `adaptive=False` fixes k and never switches off.

The first token of a reply is the prefill's; logits processors and the repetition penalty see each row
with the tokens accepted before it; constraints that force tokens (constrain.py) decode plainly.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING

from . import kernels
from .decoding import Selector, Source, Turn
from .decoding import rejection_sample as rejection_sample
from .errors import SessionError, SpeculativeError
from .proposers import NONE, DraftModel, PromptLookup, Proposal, Proposer, check_draft
from .sampling import LogitsProcessor, Sampler, Step

if TYPE_CHECKING:
    from .engine import Engine

DEFAULT_K = 8  # most tokens one step proposes (the lookup's; a draft's default is 4: each costs a draft step)
DRAFT_K = 4  # a draft's proposals per step by default: each costs one draft decode step
_GAIN_EMA = 0.25  # weight of a step's gain in its arm's average
_BACKOFF = (16, 512)  # tokens an arm stays off after its gain fell below 1: first, most
_PRIOR_GAIN, _PROBE_GAIN = 1.3, 1.1  # a new arm survives a bad first step; a probe after a pause does not
_ACCEPT_DECAY = 0.9  # per verification, the weight of an arm's past acceptance counts
_COST_EMA = 0.2  # weight of a call's measured cost in its size's average
_PRIOR_SLOPE = 0.3  # plain steps each verified row adds, until measured (135M int4, 2-core x86: ~0.3)


class SpeculationOffWarning(RuntimeWarning):
    """Exact speculation cannot verify even one proposal on this bundle here; it decodes plainly."""


@dataclass
class SpeculativeStats:
    steps: int = 0  # target calls: verification chunks plus plain decode steps
    verify_steps: int = 0
    proposed: int = 0
    accepted: int = 0
    emitted: int = 0  # tokens after the first of each reply the caller took (the first is the prefill's)
    switched_off: int = 0  # times an arm was switched off

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / self.steps if self.steps else 0.0

    def since(self, before: SpeculativeStats) -> SpeculativeStats:
        """What was counted after `before` (a copy of these stats taken earlier)."""
        return SpeculativeStats(*(getattr(self, f.name) - getattr(before, f.name) for f in fields(self)))

    def to_dict(self) -> dict[str, float]:
        return {
            "steps": self.steps,
            "verify_steps": self.verify_steps,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "acceptance": round(self.acceptance, 4),
            "tokens_per_step": round(self.tokens_per_step, 4),
            "switched_off": self.switched_off,
        }


@dataclass
class _Arm:
    k: int  # the fixed k (adaptive=False); else the last k chosen
    gain: float = _PRIOR_GAIN
    off_until: int = 0
    backoff: int = _BACKOFF[0]
    hits: float = 1.0  # accepted proposals and rejections, decayed: the per-token acceptance estimate
    misses: float = 1.0

    @property
    def acceptance(self) -> float:
        return self.hits / (self.hits + self.misses)

    def judged(self, accepted: int, proposed: int) -> None:
        self.hits = _ACCEPT_DECAY * self.hits + accepted
        self.misses = _ACCEPT_DECAY * self.misses + (accepted < proposed)


@dataclass
class SpeculativeDecoder:
    """`proposer`: PromptLookup() or DraftModel(engine); `k`: most tokens proposed per step (1..slack)."""

    proposer: Proposer
    k: int = DEFAULT_K
    adaptive: bool = True
    exact: bool = True  # verify at most engine.exact_rows - 1 proposals a step (rows its kernels round alike)
    stats: SpeculativeStats = field(default_factory=SpeculativeStats)

    def __post_init__(self) -> None:
        if not isinstance(self.k, int) or self.k < 1:
            raise SpeculativeError(f"the draft tokens per step (k) must be an integer >= 1, got {self.k!r}")
        self._arms: dict[Hashable, _Arm] = {}
        self._plain_s: float | None = None  # EMA of a plain decode step's seconds
        self._cost: dict[int, float] = {}  # rows of a verification call -> EMA of its seconds / _plain_s
        self._position = 0  # tokens emitted by this decoder (the arms' back-off clock)
        self._cap = self.k  # proposals one step may verify (start() lowers it for exact mode)

    def describe(self) -> str:
        """What proposes and how many at most, for reports: "prompt lookup, k <= 8"."""
        p = self.proposer
        what = f"draft {p.engine.bundle.path}" if isinstance(p, DraftModel) else "prompt lookup"
        return f"{what}, k {'<=' if self.adaptive else '='} {self.k}"

    def check(self, engine: Engine) -> None:
        """Refuse a k the target's ring (or the draft's) cannot roll back."""
        rings = [("target", engine)]
        if isinstance(self.proposer, DraftModel):
            rings.append(("draft", self.proposer.engine))
        for name, e in rings:
            slack = e.geometry.slack
            if self.k > slack:
                raise SpeculativeError(
                    f"{self.k} draft tokens per step exceed the {name} ring's {slack} slack rows (a rejected "
                    f"proposal is rolled back within them); use at most {slack}, or load with a larger slack"
                )

    def start(self, engine: Engine, sampler: Sampler) -> None:
        """A reply begins on `engine` (before anything is fed: the exactness probe runs on its ring)."""
        self.check(engine)
        # Greedy tokens equal plain decoding's only where a verification chunk rounds as decode steps do; a
        # sampled reply is the target's distribution either way (up to rounding), so only greedy is capped.
        rows = engine.exact_rows if self.exact and sampler.params.greedy else None
        self._cap = self.k if rows is None else min(self.k, rows - 1)
        if self._cap == 0:
            warnings.warn(_speculation_off_message(), SpeculationOffWarning, stacklevel=3)

    def propose(self) -> Proposal:
        """The proposer's tokens for this step, none until a plain step was timed (k is chosen by cost)."""
        return self.proposer.propose(self._budget) if self._plain_s is not None else NONE

    # -- adaptation ----------------------------------------------------------------------------------

    def _budget(self, arm: Hashable) -> int:
        a = self._arms.setdefault(arm, _Arm(k=self.k))
        if self._cap == 0:  # exact mode where no two rows round alike: nothing is verified
            return 0
        if not self.adaptive:
            return min(a.k, self._cap)
        if self._position < a.off_until:
            return 0
        a.k = self._best_k(a.acceptance)
        return a.k

    def _best_k(self, alpha: float) -> int:
        """The k in 1..cap with the most expected tokens per plain-step cost (1 where none beats plain
        decoding: the arm's measured gain then switches it off). A call size not measured yet costs the
        measured sizes' mean cost per added row (a prior slope until any is)."""
        slopes = [(c - 1) / (r - 1) for r, c in self._cost.items() if r > 1]
        slope = max(sum(slopes) / len(slopes), 0.0) if slopes else _PRIOR_SLOPE
        best_k, best = 1, 0.0
        for k in range(1, self._cap + 1):
            tokens = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1.0
            value = tokens / self._cost.get(k + 1, 1 + slope * k)
            if value > best:
                best_k, best = k, value
        return best_k

    def _plain(self, seconds: float) -> None:
        self.stats.steps += 1
        self.stats.emitted += 1
        self._position += 1
        s = self._plain_s
        # Clipped: one step stalled by another process must not make every verification look cheap.
        self._plain_s = seconds if s is None else 0.9 * s + 0.1 * min(seconds, 2 * s)

    def _verified(self, proposal: Proposal, accepted: int, seconds: float) -> None:
        st, n = self.stats, len(proposal.tokens)
        st.steps += 1
        st.verify_steps += 1
        st.proposed += n
        st.accepted += accepted
        st.emitted += accepted + 1
        self._position += accepted + 1
        if not self.adaptive:
            return
        a = self._arms[proposal.arm]
        a.judged(accepted, n)
        assert self._plain_s is not None
        cost = seconds / self._plain_s
        last = self._cost.get(n + 1)
        # Clipped as the plain step's average is: one call stalled by another process is not its size's cost.
        self._cost[n + 1] = cost if last is None else (1 - _COST_EMA) * last + _COST_EMA * min(cost, 2 * last)
        gain = (accepted + 1) * self._plain_s / max(seconds, 1e-9)
        a.gain = (1 - _GAIN_EMA) * a.gain + _GAIN_EMA * gain
        if a.gain < 1.0:
            a.off_until = self._position + a.backoff
            a.backoff = min(2 * a.backoff, _BACKOFF[1])
            a.gain = _PROBE_GAIN
            a.hits, a.misses = 1.0, 1.0  # the probe after the pause starts from the prior: small k
            st.switched_off += 1
        elif a.gain > 1.1:
            a.backoff = _BACKOFF[0]


def speculative_generate_step(
    source: Source,
    prompt_ids: Sequence[int],
    sampler: Sampler,
    decoder: SpeculativeDecoder,
    *,
    logits_processors: Sequence[LogitsProcessor] = (),
    logprobs: int | None = None,
) -> Iterator[Step]:
    """generate.generate_step with speculation (`decoder` proposes, the target verifies): the same contract, one
    Step per token forever; the caller stops. A processor that forces tokens (constrain.py) is refused:
    generate.step_generator decodes such a reply plainly."""
    processors = tuple(logits_processors)
    if any(hasattr(p, "forced_tokens") for p in processors):
        raise SpeculativeError("a constraint that forces tokens decodes plainly: use generate_step")
    engine = source.engine
    decoder.start(engine, sampler)
    turn = source.begin(prompt_ids)
    # What the proposer starts from: the whole prompt of a fresh stream (a draft then runs the target's very
    # stream), else the tokens the session's ring holds (the conversation before them is gone).
    context = turn.context()
    decoder.proposer.start(engine, context, sampler.params)
    stops = frozenset(engine.manifest.tokenizer.eos_token_ids)
    pick = Selector(sampler, processors, context, engine.geometry.logical_capacity, logprobs, stops)
    fused = pick.fused_argmax(engine)
    ahead = 0  # tokens fed to the target beyond the last one yielded (the caller may stop any time)
    owed = 0  # tokens counted in stats.emitted but not yielded yet
    try:
        step = pick.select(turn.logits)
        decoder.proposer.advance([step.token], 0)
        while True:
            turn.sampled(step.token)
            owed = max(owed - 1, 0)  # the reply's first token (owed 0) is the prefill's, never counted
            yield step
            pick.took(step.token)
            t0 = time.perf_counter()
            proposal = decoder.propose()
            if not proposal.tokens:
                logits = turn.decode(step.token)
                step = Step(engine.decoded_argmax()) if fused else pick.select(logits)
                decoder._plain(time.perf_counter() - t0)
                decoder.proposer.advance([step.token], 0)
                owed = 1
                continue
            out = _verify(turn, pick, proposal)
            decoder._verified(proposal, len(out) - 1, time.perf_counter() - t0 - proposal.catch_up_s)
            decoder.proposer.advance([s.token for s in out], len(out) - 1)
            ahead, owed = len(out) - 1, len(out)
            for s in out[:-1]:  # accepted proposals: fed already
                ahead, owed = ahead - 1, owed - 1
                yield s
                pick.took(s.token)
            step = out[-1]
    finally:
        if ahead:  # the caller stopped inside an accepted run: forget what it never took
            _unfeed(turn, ahead)
        decoder.stats.emitted -= owed  # nor count it: tokens per call are tokens the caller got


def _verify(turn: Turn, pick: Selector, proposal: Proposal) -> list[Step]:
    """Feed and judge `proposal`; the Steps it yields: the accepted proposals and one more token."""
    d = proposal.tokens
    rows = turn.extend(d)
    out: list[Step] = []
    for j in range(len(d) + 1):
        if j < len(d) and proposal.q is not None:
            accepted, step = pick.judge(rows[j], d[j], proposal.q[j], ahead=out)
        else:  # chosen proposals (or the bonus row): the target's own choice, compared
            step = pick.select(rows[j], ahead=out)
            accepted = j < len(d) and step.token == d[j]
        out.append(step)
        if not accepted:
            break
    if len(out) <= len(d):
        turn.drop(len(d) + 1 - len(out))  # the proposals after the first disagreement
    return out


def _speculation_off_message() -> str:
    return (
        "speculation is off under greedy decoding: this bundle's graph computes a multi-row chunk with other "
        f"rounding than a decode step on this CPU (kernels {kernels.isa() or 'ONNX Runtime'}; measured), so "
        "verified tokens could differ from plain greedy ones (the Python API's exact=False speculates anyway)"
    )


def _unfeed(turn: Turn, n: int) -> None:
    """Roll a stopped reply back to its last yielded token, if it is still the session's latest."""
    try:
        turn.drop(n)
    except SessionError:  # superseded: the session moved on, and owns its state now
        pass


def resolve(speculative: SpeculativeDecoder | str) -> SpeculativeDecoder:
    """ "lookup" (prompt lookup, k 8) or a SpeculativeDecoder."""
    if isinstance(speculative, SpeculativeDecoder):
        return speculative
    if speculative == "lookup":
        return SpeculativeDecoder(PromptLookup())
    raise SpeculativeError(f"speculative must be 'lookup' or a SpeculativeDecoder, got {speculative!r}")


def from_options(
    engine: Engine, method: str | None, draft: str | Path | None, k: int | None, threads: int | None = None
) -> SpeculativeDecoder | None:
    """edge-run's --speculative lookup | --draft BUNDLE [--draft-tokens K], checked against `engine` before
    anything runs (a draft of another tokenizer, k of 0 or above the slack: one-line errors)."""
    if method is None and draft is None:
        if k is not None:
            raise SpeculativeError("--draft-tokens needs --speculative lookup or --draft BUNDLE")
        return None
    if method not in (None, "lookup") or (method is not None and draft is not None):
        raise SpeculativeError("give --speculative lookup or --draft BUNDLE, not both")
    if draft is None:
        spec = SpeculativeDecoder(PromptLookup(), k=DEFAULT_K if k is None else k)
    else:
        from .engine import LoadOptions, load

        d = load(draft, LoadOptions(threads=threads, spin=False))  # it takes turns with the target
        check_draft(engine.manifest, d.manifest, f"draft bundle '{draft}'")
        spec = SpeculativeDecoder(DraftModel(d), k=DRAFT_K if k is None else k)
    spec.check(engine)
    engine.exact_rows  # noqa: B018  (measured now, at start-up, if this bundle and CPU were never probed)
    return spec
