"""One request's decoding state, shared by the single-stream decoder and the batching engine.

A `Sequence` knows its context, its own n-gram index (prompt + output so far), its
lookahead settings, sampling and stop criteria. Per step it proposes a draft
tree, picks the model's tokens from the verified logits, emits up to the first
stop condition and learns from what it emitted. It never touches the model:
whoever runs the forward (one request, or a batch of them) hands it its rows
of logits.

A step whose drafts were all cut (the planner chose a plain step) still
teaches: the full proposal is kept as a shadow, and once the tokens it would
have covered are out, the acceptance walk is replayed against them. The
calibration therefore keeps learning while drafting is off, and a request or
a load level that went plain because drafts looked weak can come back when
they turn good. Without it, a plain step never updates the estimates that
made it plain, and drafting stays off for good.
"""

import time
from dataclasses import dataclass, field

import torch

from lookahead.config import LookaheadConfig
from lookahead.core.draft import DraftTree, build_tree, match, root_only
from lookahead.core.planner import RowDrafts
from lookahead.core.calibration import Calibration, CalibrationTable
from lookahead.model.sampling import RowChooser, SamplingParams
from lookahead.engine.backlog import LearnBacklog
from lookahead.engine.stats import RequestStats
from lookahead.core.ngram_index import NGramIndex
from lookahead.core.trie import TokenTrie
from lookahead.core.verify import Acceptance, accept

SHADOW_DRAFTS = 8  # rows of a cut proposal replayed as a shadow: about the widest tree a step picks on a CPU


@dataclass(frozen=True)
class StopCriteria:
    max_new_tokens: int = 128
    eos_token_ids: frozenset[int] = frozenset()
    stop_strings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"invalid max_new_tokens={self.max_new_tokens!r}: must be >= 1")


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "length" | "eos" | "stop" | "cancelled" | "error"
    stats: RequestStats


@dataclass(eq=False)  # a request is compared by identity: two with the same prompt and settings are two requests
class Sequence:
    prompt: list[int]
    stop: StopCriteria
    sampling: SamplingParams
    la: LookaheadConfig
    tokenizer: object = None  # needed for stop strings only
    tokens: list[int] = field(default_factory=list)  # generated so far
    finish_reason: str | None = None
    stats: RequestStats = field(default_factory=RequestStats)

    def __post_init__(self) -> None:
        if not self.prompt:
            raise ValueError("prompt_ids must hold at least one token")
        self.ctx = list(self.prompt)  # every token so far; ctx[-1] is the next root (not in the KV cache)
        self.stats.prompt_tokens = len(self.prompt)
        self.drafting = self.la.enabled and self.la.decoding_length > 0
        self._local = NGramIndex(self.la.branch_length + 1, self.la.stop_words)
        self._local_len = 0  # tokens of ctx already in the local index: it is built on first use (see `local`)
        self.index_build_s = 0.0  # time spent catching the local index up (a one-off, not a step's own cost)
        self.generator = None
        if self.sampling.do_sample and not self.draws_on_device:
            self.generator = torch.Generator()
            if self.sampling.seed is not None:
                self.generator.manual_seed(self.sampling.seed)
            else:  # penalised: from torch's global generator, random per request, reproducible under manual_seed
                self.generator.manual_seed(int(torch.randint(0, 2**62, ())))
        self._stop_window = max((len(s) for s in self.stop.stop_strings), default=0) + 1
        self.own_calibration = Calibration(predicted=1.0, accepted=1.0)  # this request's recent acceptance
        self._proposal: DraftTree | None = None  # the last full proposal, before the budget cut it
        self._shadows: list[tuple[int, DraftTree]] = []  # (len(ctx) when proposed, cut proposal) awaiting tokens
        self.started_at = time.perf_counter()

    @property
    def local(self) -> NGramIndex:
        """This request's own n-grams (prompt + output so far), brought up to date on access.

        Built lazily, so a request never
        proposing drafts (lookahead off, or the engine's payoff check keeping
        a busy batch plain) does not pay even that.
        """
        if self._local_len < len(self.ctx):
            t0 = time.perf_counter()
            self._local.extend(self.ctx, self._local_len, len(self.ctx))
            self._local_len = len(self.ctx)
            self.index_build_s += time.perf_counter() - t0
        return self._local

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.stop.max_new_tokens - len(self.tokens)

    def result(self) -> Generation:
        assert self.finish_reason is not None, "the sequence has not finished"
        return Generation(self.tokens, self.finish_reason, self.stats)

    # ---- one step --------------------------------------------------------
    def propose(self, memory: TokenTrie, floor: float = 0.0) -> DraftTree:
        """The full candidate tree (probs on the trie's own scale; the caller applies the calibration).

        `floor`: no plan can take a draft less likely than this (`planner.break_even`), so past the
        shadow's first `SHADOW_DRAFTS` rows none is built. Calibrated probabilities are at most the trie's.
        """
        la = self.la
        max_depth = min(la.branch_length, self.remaining - 1)
        if not self.drafting or max_depth < 1:
            return root_only(self.ctx[-1])
        sources = [(self.local, la.prompt_weight), (memory, 1.0)]
        m, matched = match(sources, self.ctx, la.max_query_length, la.min_query_length)
        self._proposal = build_tree(self.ctx[-1], matched, m, la.decoding_mode, la.decoding_length, max_depth,
                                    floor, SHADOW_DRAFTS)
        return self._proposal

    def root(self) -> DraftTree:
        """A plain step's tree, nothing proposed (so no shadow either): the engine's payoff check said drafts lose."""
        self._proposal = None
        return root_only(self.ctx[-1])

    def draft_factor(self, calibration: CalibrationTable, match_length: int) -> float:
        """How far to trust this row's trie estimates: the shared rate for its match length, nudged by the
        request's own recent acceptance relative to that rate (geometric mean)."""
        shared = calibration.factor(match_length)
        return min(1.0, shared * self.own_calibration.factor ** 0.5)

    def candidates(self, tree: DraftTree, calibration: CalibrationTable, floor: float = 0.0) -> RowDrafts:
        """What the planner weighs for this row: its drafts' calibrated probabilities, or a fixed budget.
        A hier tree's rows come best first: those from the first one under `floor` on cannot be planned."""
        factor = self.draft_factor(calibration, tree.match_length)
        probs = [p * factor for p in tree.probs[1:]]
        if floor > 0 and self.la.decoding_mode == "hier":
            probs = probs[: next((i for i, p in enumerate(probs) if p < floor), len(probs))]
        return RowDrafts(probs, fixed=not self.la.adaptive)

    @property
    def draws_on_device(self) -> bool:
        """Sampled, unseeded and unpenalised: every tree row is drawn on the device, beside the other rows'
        argmax, in the step's one read back (BatchLogits.picks). A seeded request draws row by row along
        the walk from its own generator, so one seed gives one output whatever drafts the memory offered."""
        s = self.sampling
        return s.do_sample and s.repetition_penalty == 1.0 and s.seed is None

    def choose(self, tree: DraftTree, logits: torch.Tensor, picks: list[int]) -> Acceptance:
        """Walk the tree with the model's tokens; `logits` is [rows >= tree rows, vocab], `picks` its rows'
        tokens as read back (the argmax, or device draws when `draws_on_device`)."""
        if not self.sampling.needs_processing or self.draws_on_device:
            return accept(tree, lambda row, path: picks[row])
        chooser = RowChooser(self.sampling, self.ctx, self.generator)
        return accept(tree, lambda row, path: chooser(logits[row], path))

    def advance(self, tree: DraftTree, acc: Acceptance, calibration: CalibrationTable) -> list[int]:
        """Emit the accepted tokens up to the first stop condition and learn from them; return the emitted tokens."""
        emitted = []
        for tok in acc.tokens:
            self.tokens.append(tok)
            emitted.append(tok)
            if tok in self.stop.eos_token_ids:
                self.finish_reason = "eos"
            elif self.stop.stop_strings and self._hit_stop_string():
                self.finish_reason = "stop"
            elif len(self.tokens) >= self.stop.max_new_tokens:
                self.finish_reason = "length"
            if self.finish_reason:
                break
        old = len(self.ctx)
        self.ctx.extend(emitted)
        if self.drafting:
            # A proposing row's index stays current; an unbuilt one, or one whose row was kept plain (the
            # engine's payoff check), catches up on its next use.
            if self._local_len == old and self._proposal is not None:
                self._local.extend(self.ctx, old, len(self.ctx))
                self._local_len = len(self.ctx)
            if tree.num_drafts:
                self._learn(tree, len(acc.rows), calibration)
            elif self._proposal is not None and self._proposal.num_drafts:
                self._shadows.append((old, self._proposal.truncated(min(SHADOW_DRAFTS, self._proposal.num_drafts))))
            self._proposal = None
            self._replay_shadows(calibration)
        st = self.stats
        st.steps += 1
        st.draft_tokens += tree.num_drafts
        st.accepted_drafts += len(acc.rows)
        st.new_tokens = len(self.tokens)
        if st.steps == 1:
            st.first_token_s = time.perf_counter() - self.started_at
        return emitted

    def _learn(self, tree: DraftTree, accepted: int, calibration: CalibrationTable) -> None:
        predicted = sum(tree.probs[1:])
        calibration.update(tree.match_length, predicted, accepted)
        self.own_calibration.update(predicted * calibration.factor(tree.match_length), accepted)

    def _replay_shadows(self, calibration: CalibrationTable) -> None:
        """Learn from each shadow whose tokens are all out (or whose request ended): what it would have accepted."""
        while self._shadows:
            start, tree = self._shadows[0]
            actual = self.ctx[start:]  # the model's tokens after the shadow's root
            if len(actual) <= max(tree.depths) and not self.finished:
                return
            self._shadows.pop(0)
            walk = accept(tree, lambda row, path: actual[len(path)] if len(path) < len(actual) else None)
            self._learn(tree, len(walk.rows), calibration)

    def close(self, memory: TokenTrie | LearnBacklog, reason: str = "cancelled") -> bool:
        """End the request (if not ended) and hand its output to the shared memory (or the engine's backlog in
        front of it); whether it did."""
        if self.finish_reason is None:
            self.finish_reason = reason
        self.stats.total_s = time.perf_counter() - self.started_at
        learnt = self.drafting and bool(self.tokens) and reason != "error"
        if learnt:
            memory.add_sequence(self.tokens)
        return learnt

    def _hit_stop_string(self) -> bool:
        assert self.tokenizer is not None, "stop strings need a tokenizer"
        tail = self.tokenizer.decode(self.tokens[-self._stop_window :])
        return any(s in tail for s in self.stop.stop_strings)
