"""Multi-turn sessions of closed-loop users: a user's next prompt is its whole conversation so far.

A closed loop with `turns` (docs/workload.md) groups each user's requests into conversations. The
k-th conversation to start lasts `turns[k]` turns (drawn up front). Turn 1's prompt is the request's
own drawn prompt length (the user's message, a system prompt included); turn t + 1's prompt is turn
t's prompt and output followed by the new message: prompt(t+1) = prompt(t) + output(t) + message.
So a follow-up can hit every full KV block its previous turn left in the cache, generated tokens
included (vLLM V1 hashes every full block of a request as it fills, and a finished request's blocks
stay cached until evicted). The chat template's extra tokens between turns are not modelled: the
next prompt starts with exactly the previous turn's tokens.

A conversation also ends early, and the message starts a new one, when the grown prompt and its
output would exceed `max_context` tokens or no longer fit the engine (its KV cache, or a
non-chunking scheduler's token budget): like a chat client starting over when the window is full.

Identity without token ids (sim/kv/prefix_cache.py): block j of conversation c is named ("turn", c, j)
-- unique per conversation and position, so it names everything before it too -- except the
blocks inside the conversation's system prompt (workload.prefix, drawn for its first request),
which keep the system prompt's shared names. Ids are given when a request arrives (`begin`): only
then is it known whose turn it is. Request ids are arrival order, as for every closed loop.
"""
from __future__ import annotations

import numpy as np

from sim.kv.prefix_cache import block_hashes
from sim.workload.generators import Users
from sim.workload.request import RequestTable


class Sessions:
    def __init__(self, req: RequestTable, users: Users, prefix: list | None, caches: list,
                 block_size: int, fits):
        self.req = req
        req.prompt = req.prompt.copy()  # prompts grow in place; the caller's workload keeps its lengths
        self.message = req.prompt.copy()  # int64 [n]: each request's own new tokens
        assert users.turns is not None    # (sessions are the closed loops with turns)
        self.turns = users.turns          # int64 [n]: turns of the k-th conversation to start
        self.max_context = users.max_context
        self.prefix = prefix              # per request: its system prompt (a conversation's first)
        self.caches = caches              # the replicas' PrefixKVCaches (none: caching off)
        self.block_size = block_size
        self.fits = fits                  # (prompt, output) -> servable (sim/build.servable)
        n = len(req)
        self.conversation = np.full(n, -1, dtype=np.int64)  # per request, in start order
        self.turn = np.zeros(n, dtype=np.int64)              # per request, 1-based
        self.cut = 0                  # conversations ended early: their next prompt would not fit
        self.script = users.script        # recorded agent sessions: each call's lengths and tool time
        self.think = users.think_s        # (the closed loop reads each request's think time from it)
        self._sent = np.zeros(len(users.start_s), dtype=np.int64)  # user -> calls it has sent
        # agents with fan-out (users.fan_out): per user, the step's calls begun so far, its first call
        # (which carries the conversation on), the context its calls share, and the next step's
        # context (the first call's prompt and every answer of the step)
        self.fan, self.fan_offsets = users.fan_out, users.fan_offsets
        self._step = np.zeros(len(users.start_s), dtype=np.int64)
        self._in_step = np.zeros(len(users.start_s), dtype=np.int64)
        self._head: dict[int, int] = {}
        self._context = np.zeros(len(users.start_s), dtype=np.int64)
        self._grown = np.zeros(len(users.start_s), dtype=np.int64)
        self._last: dict[int, int] = {}     # user -> its latest request
        self._chain: list[list] = []        # conversation -> its block names so far

    def begin(self, rid: int, user: int) -> None:
        """Request `rid` has just been sent by `user`: it continues the user's conversation or
        starts the next one. Sets its prompt, and its block names in every replica's cache."""
        req = self.req
        if self.script is not None:
            self._scripted(rid, user)
            return
        if self.fan is not None:
            self._fanned(rid, user)
            return
        message, output = int(self.message[rid]), int(req.output[rid])
        last = self._last.get(user)
        self._last[user] = rid
        if last is not None:
            conv = int(self.conversation[last])
            prompt = int(req.prompt[last] + req.output[last]) + message
            if self.turn[last] < self.turns[conv]:
                if self._allowed(prompt, output):
                    self._join(rid, conv, int(self.turn[last]) + 1, prompt, output)
                    return
                self.cut += 1
        self._start(rid, message, output)

    def _fanned(self, rid: int, user: int) -> None:
        """A call of an agent's step with fan-out. The step's first call continues the conversation
        as a turn does (its prompt: the last step's first prompt, every answer of that step, then its
        own new tokens); the others share the context before those new tokens and add their own, each
        a branch of the conversation that nothing after it continues."""
        req, fan = self.req, self.fan
        assert fan is not None and self.fan_offsets is not None
        message, output = int(self.message[rid]), int(req.output[rid])
        calls = int(fan[self.fan_offsets[user] + self._step[user]])
        if self._in_step[user] == 0:  # the step's first call
            head = self._head.get(user)
            self._head[user] = rid
            prompt = int(self._grown[user]) + message
            if head is not None and self._allowed(prompt, output):
                self._join(rid, int(self.conversation[head]), int(self.turn[head]) + 1, prompt, output)
            else:
                if head is not None:  # (the grown context would not fit: a fresh one)
                    self.cut += 1
                self._start(rid, message, output)
                prompt = message
            self._context[user] = prompt - message
            self._grown[user] = prompt + output
        else:
            head = self._head[user]
            prompt = int(self._context[user]) + message
            if self._allowed(prompt, output):
                self._join(rid, int(self.conversation[head]), int(self.turn[head]), prompt, output,
                           shared=int(self._context[user]))
            else:
                self.cut += 1
                self._start(rid, message, output)
            self._grown[user] += output
        self._in_step[user] += 1
        if self._in_step[user] == calls:
            self._in_step[user] = 0
            self._step[user] += 1

    def _scripted(self, rid: int, user: int) -> None:
        """A recorded session's next call: its prompt, output and tool time as recorded. It continues
        the conversation when its prompt starts with the previous call's prompt and output (its
        length at least theirs), else (the agent cut or summarised its context) starts a new one."""
        script, req = self.script, self.req
        assert script is not None
        i = int(script.offsets[user] + self._sent[user])
        self._sent[user] += 1
        prompt, output = int(script.prompt[i]), int(script.output[i])
        req.output[rid] = output
        self.think[rid] = script.tool_s[i]
        last = self._last.get(user)
        self._last[user] = rid
        if last is not None and prompt >= int(req.prompt[last] + req.output[last]):
            if self._allowed(prompt, output):
                self._join(rid, int(self.conversation[last]), int(self.turn[last]) + 1, prompt, output)
                return
            self.cut += 1
        self._start(rid, prompt, output)

    def _allowed(self, prompt: int, output: int) -> bool:
        if self.max_context is not None and prompt + output > self.max_context:
            return False
        return self.fits(prompt, output)

    def _start(self, rid: int, prompt: int, output: int) -> None:
        conv = len(self._chain)
        p = self.prefix[rid] if self.prefix is not None else None
        shared = block_hashes(p, rid, prompt, self.block_size)  # its system prompt's blocks
        self._chain.append(shared)
        self._join(rid, conv, 1, prompt, output)

    def _join(self, rid: int, conv: int, turn: int, prompt: int, output: int, shared: int | None = None) -> None:
        """`rid` is the next turn of conversation `conv` (its block names extend the conversation's),
        or with `shared` a fan-out branch of it: the conversation's first `shared` tokens (their
        whole blocks' names), its own tokens after them named for it alone."""
        self.req.prompt[rid] = prompt
        self.conversation[rid], self.turn[rid] = conv, turn
        if not self.caches:
            return
        full = (prompt + output - 1) // self.block_size  # blocks it fills: KV of all but its last token
        if shared is None:
            chain = self._chain[conv]
            chain.extend(("turn", conv, j) for j in range(len(chain), full))
        else:
            chain = self._chain[conv][:shared // self.block_size]
            chain = chain + [("fan", rid, j) for j in range(len(chain), full)]
        # one list per conversation, read up to each reader's own token count (prefix_cache.py)
        for cache in self.caches:
            cache.hashes[rid] = chain
            cache.prompt[rid] = prompt

    def summary(self) -> dict:
        """summary.json's `sessions`: conversations, their turns, and how many ended early."""
        sent = self.conversation >= 0
        conversations = int(self.conversation.max(initial=-1)) + 1
        return {"conversations": conversations,
                "turns_mean": float(sent.sum() / conversations) if conversations else 0.0,
                "ended_at_context_limit": self.cut}
