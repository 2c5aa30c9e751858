"""Speculative decoding: a draft proposes k tokens per running sequence, the target verifies them
(and samples one more) in one iteration, and each sequence keeps the accepted prefix.

    engine:
      speculative: {method: eagle, num_speculative_tokens: 3, acceptance_rate: 0.7}
      # method: draft (with draft_model: a preset) | eagle | mtp | ngram
      # acceptance_rate: per drafted token, or a list, one per position (k entries)

What is simulated, per decode iteration of a sequence with c tokens of context:
- **the target** verifies k + 1 tokens (k drafts and the next one): priced like a prefill chunk of
  k + 1 tokens at context c (the cost model sees `BatchStats.prefill_lens`/`prefill_contexts`), and
  takes k + 1 tokens of the iteration's `max_num_batched_tokens`, as vLLM counts them;
- **the draft** proposes k tokens for the B verifying sequences: `draft`: k decode steps of the
  draft model (its own cost model: measured if shipped, else the roofline) at batch B;
  `eagle`/`mtp`: k passes of one decoder layer of the target, priced as the target's decode step at
  batch B divided by its number of layers (an estimate); `ngram`: free (a CPU lookup);
- **acceptance**: position j (1..k) is accepted with probability a_j if every earlier one was; the
  sequence gains the accepted drafts + 1 tokens (never more than its output needs). With a constant
  a, the mean is (1 - a^(k+1)) / (1 - a). Draws come from the run's seeded generator;
- **KV**: each verifying sequence holds blocks for c + k + 1 tokens (vLLM's lookahead slots); the
  blocks past what it keeps return when it leaves; a sequence that cannot get them is preempted as
  in plain decoding;
- **metrics**: a sequence streams its new tokens together at the end of the iteration: one
  inter-token gap per sequence per iteration (vLLM's ITL: gaps between streamed chunks); TPOT =
  (E2E - TTFT) / (output - 1) falls with the tokens per step.

Not modelled: the draft model's weights and KV cache in GPU memory, tree attention, acceptance that
varies with context or batch, and decode fast-forward (every speculative iteration is simulated).
"""
from __future__ import annotations

import numpy as np

from sim.config.speculative import SpeculativeConfig


def accepted_tokens(rng: np.random.Generator, acceptance: tuple[float, ...], n: int) -> np.ndarray:
    """Tokens each of n verifying sequences gains: 1 + the number of leading accepted drafts."""
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ok = rng.random((n, len(acceptance))) < np.asarray(acceptance)
    return 1 + np.cumprod(ok, axis=1).sum(axis=1)


class SpeculativePool:
    """Verifying sequences, each advanced by its own accepted tokens per iteration (the decode
    pool's interface, sim/schedulers/decode_pool.py, without its fast-forward: max_steps is 1).
    The RequestTable holds every member's true computed/generated counts."""

    speculative = True

    def __init__(self, requests, kv, spec: SpeculativeConfig, rng: np.random.Generator):
        self.req, self.kv, self.spec, self.rng = requests, kv, spec, rng
        self.lookahead = spec.num_speculative_tokens + 1  # tokens verified per sequence
        self.members: dict[int, int] = {}  # member -> blocks it holds
        self._ids: np.ndarray | None = None

    @property
    def size(self) -> int:
        return len(self.members)

    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._ids = np.fromiter(self.members, dtype=np.int64, count=len(self.members))
            self._ids.setflags(write=False)
        return self._ids

    def context_sum(self) -> int:
        return int(self.req.computed[self.ids()].sum()) if self.members else 0

    def computed(self, rid: int) -> int:
        return int(self.req.computed[rid])

    def growth(self, rid: int, kv=None) -> int:
        """Blocks `rid` must add to verify its lookahead now."""
        return max(0, int(self.kv.blocks_for(self.computed(rid) + self.lookahead)) - self.members[rid])

    def new_blocks_now(self) -> int:
        return sum(self.growth(rid) for rid in self.members)


    def reserve(self, rid: int) -> None:
        """After the scheduler allocated growth(rid) blocks: the member holds them."""
        self.members[rid] += self.growth(rid)

    def reserve_all(self) -> None:
        for rid in self.members:
            self.reserve(rid)

    def join(self, rid: int) -> None:
        self.members[rid] = int(self.kv.blocks_for(self.computed(rid)))
        self._ids = None

    def leave(self, rid: int) -> None:
        """Blocks past what it computed go back now (the scheduler frees the rest)."""
        held = self.members.pop(rid)
        self.kv.release(held - int(self.kv.blocks_for(self.computed(rid))))
        self._ids = None

    def steps_to_next_finish(self) -> int:
        return 1

    def advance(self, steps: int) -> list[int]:
        """One verification: every member gains its accepted tokens; those done leave (returned)."""
        assert steps == 1
        req, ids = self.req, self.ids()
        gained = np.minimum(accepted_tokens(self.rng, self.spec.acceptance, len(ids)),
                            req.output[ids] - req.generated[ids])
        req.computed[ids] += gained
        req.generated[ids] += gained
        done = ids[req.generated[ids] >= req.output[ids]].tolist()
        for rid in done:
            self.leave(rid)
        return done

    def batch(self) -> tuple[np.ndarray, np.ndarray, int, int]:
        """(chunk lengths, contexts) of the verification, priced like prefill chunks, and the
        draft's batch and context sum."""
        ids = self.ids()
        contexts = self.req.computed[ids]
        return (np.full(len(ids), self.lookahead, dtype=np.int64), contexts, len(ids), int(contexts.sum()))
