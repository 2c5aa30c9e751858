"""Runs inside the vLLM virtualenv (calibrate/vllm_setup.sh): real vLLM, open loop, on a CPU clock.

    python calibrate/vllm_driver.py JOB.json OUT.json

Imports only vLLM and the standard library: servesim is not installed in that venv, and vLLM's
pins (transformers, numba, setuptools) must not meet ours. `calibrate/vllm_engine.py` writes the
job and reads OUT.json back into servesim's run schemas.

JOB.json: {"model_dir": config.json's folder (weights are vLLM's `dummy` load: random, never read),
           "engine": {block_size, num_gpu_blocks, max_num_seqs, max_num_batched_tokens,
                      enable_chunked_prefill, enable_prefix_caching, max_model_len, dtype},
           "requests": [[arrival_s, prompt_tokens, output_tokens], ...] (sorted by arrival),
           "seed": int, "clock": "cpu" | "wall", "vocab_size": int,
           "prefix": null or per request null | [[unit ids...], unit tokens] (sim/workload/generators.py)}
OUT.json:  {"requests": [{"arrival_s", "added_s", "token_s": [...], "preemptions"}],
            "iterations": [{"start_s", "returned_s", "end_s", "model_s",
                            "scheduled": [[i, tokens, context]],
                            "preempted": int, "kv_blocks_used": int, "waiting": int}],
            "meta": {...}}

Clock: `cpu` is the engine thread's CPU seconds (time.thread_time; OMP_NUM_THREADS=1 keeps torch's
work on this thread) plus idle time skipped: when vLLM holds no request the clock jumps to the next
arrival instead of sleeping. On a shared 2-core machine wall time scatters 2-50% per step; thread
CPU time 2-8% (docs/validation.md). `wall` is perf_counter with real sleeps.

A request is added to the engine at the first loop turn at or after its arrival (a step in flight
is not interrupted, as in vLLM's own busy loop); its latencies are measured from `arrival_s`, so the
wait for that step boundary counts, as it does in a server. An iteration runs from one loop turn's
arrival check to the next (adding the new requests, engine.step(), recording its tokens): busy
iterations tile the timeline, as the simulator's do. A token's time is when engine.step() returned it.
"""
from __future__ import annotations

import json
import os
import sys
import time


def _clock(kind: str):
    skipped = [0.0]
    base = time.thread_time if kind == "cpu" else time.perf_counter

    def now() -> float:
        return base() + skipped[0]

    def idle(dt: float) -> None:
        if dt <= 0:
            return
        if kind == "cpu":
            skipped[0] += dt
        else:
            time.sleep(dt)

    def rewind(dt: float) -> None:
        """The CPU clock only: take back `dt` s spent idle (the loop turn that found nothing to
        do), so that the engine wakes exactly at the arrival it waited for, as the simulator's
        does; otherwise every idle period shifts the timeline by a few microseconds and, now and
        then, an arrival lands on the other side of an iteration boundary."""
        if kind == "cpu" and dt > 0:
            skipped[0] -= dt

    return now, idle, rewind


def build_engine(job: dict):
    from vllm import EngineArgs, LLMEngine

    e = job["engine"]
    args = EngineArgs(
        model=job["model_dir"], load_format="dummy", skip_tokenizer_init=True,
        dtype=e.get("dtype", "bfloat16"), seed=job["seed"],
        block_size=e["block_size"],
        # vLLM keeps block 0 as the null block: override N + 1 gives N usable blocks.
        num_gpu_blocks_override=e["num_gpu_blocks"] + 1,
        max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
        enable_chunked_prefill=e["enable_chunked_prefill"],
        enable_prefix_caching=e["enable_prefix_caching"],
        max_model_len=e["max_model_len"],
        disable_log_stats=True, enforce_eager=e.get("enforce_eager", False),
        async_scheduling=False,
        # On the CPU backend this is the share of host memory reserved; the KV size is set above.
        gpu_memory_utilization=e.get("memory_fraction", 0.3),
    )
    return LLMEngine.from_engine_args(args)


def _index(request_id: str) -> int:
    """"r17" or vLLM's internal "r17-<random suffix>" -> 17."""
    return int(request_id[1:].split("-")[0])


class Recorder:
    """Wraps the in-process EngineCore's scheduler and executor: per iteration, each scheduled
    request's tokens and context (tokens computed before this step), preemptions, and the
    executor's time (the model step; the rest of the iteration is vLLM's engine overhead)."""

    def __init__(self, engine, now):
        core = engine.engine_core.engine_core          # InprocClient -> EngineCore
        self.scheduler, self.executor, self.now = core.scheduler, core.model_executor, now
        self.pending: dict | None = None
        self.preempted = 0
        self.preemptions: dict[int, int] = {}
        schedule, preempt = self.scheduler.schedule, self.scheduler._preempt_request
        execute = self.executor.execute_model

        def wrapped_schedule(*a, **k):
            out = schedule(*a, **k)
            reqs = self.scheduler.requests
            # num_computed_tokens was advanced by the schedule (_update_after_schedule)
            # KV blocks in use as the step runs (before finished requests free theirs), as the
            # simulator's steps.csv counts them
            self.pending = {"scheduled": [[_index(rid), n, reqs[rid].num_computed_tokens - n]
                                          for rid, n in out.num_scheduled_tokens.items()],
                            "preempted": self.preempted, "model_s": 0.0,
                            "kv_blocks_used": self._blocks_used(),
                            "waiting": len(self.scheduler.waiting)}
            self.preempted = 0
            return out

        def wrapped_preempt(request, *a, **k):
            self.preempted += 1
            i = _index(request.request_id)
            self.preemptions[i] = self.preemptions.get(i, 0) + 1
            return preempt(request, *a, **k)

        def wrapped_execute(*a, **k):
            t = self.now()
            out = execute(*a, **k)
            if self.pending is not None:
                self.pending["model_s"] += self.now() - t
            return out

        self.scheduler.schedule = wrapped_schedule
        self.scheduler._preempt_request = wrapped_preempt
        self.executor.execute_model = wrapped_execute

    def take(self) -> dict | None:
        rec, self.pending = self.pending, None
        return rec

    def _blocks_used(self) -> int:
        pool = self.scheduler.kv_cache_manager.block_pool
        return pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()


def warm_up(engine, job: dict) -> None:
    """Untimed requests before time 0 (first-call costs: allocator, compiled graphs): a long
    prompt, a batch of short ones, decodes."""
    from vllm import SamplingParams, TokensPrompt

    e = job["engine"]
    lens = [min(e["max_num_batched_tokens"], e["max_model_len"] - 8, 512), 16, 64, 128]
    for i, n in enumerate(lens * 2):
        engine.add_request(f"warm-{i}", TokensPrompt(prompt_token_ids=[(7 * i + 3) % 100 + 1] * n),
                           SamplingParams(max_tokens=4, min_tokens=4, ignore_eos=True, detokenize=False,
                                          temperature=0.0))
    while engine.has_unfinished_requests():
        engine.step()
    if e["enable_prefix_caching"]:
        engine.reset_prefix_cache()


def prompt_ids(index: int, length: int, vocab: int, prefix) -> list[int]:
    """Token ids for request `index`: its shared prefix unit by unit from the unit's chained id
    (so requests that share ids share tokens, and vLLM's own block hashes find them), then ids
    drawn from the request's index (distinct requests share nothing by accident)."""
    ids: list[int] = []
    if prefix:
        unit_ids, unit = prefix
        for uid in unit_ids:
            ids += [(uid * 1000003 + j * 7919) % (vocab - 1) + 1 for j in range(unit)]
        ids = ids[:length]
    ids += [(index * 7919 + j * 104729 + 17) % (vocab - 1) + 1 for j in range(len(ids), length)]
    return ids


def run(job: dict) -> dict:
    from vllm import SamplingParams, TokensPrompt

    now, idle, rewind = _clock(job["clock"])
    t_build = time.perf_counter()
    engine = build_engine(job)
    build_s = time.perf_counter() - t_build
    warm_up(engine, job)
    rec = Recorder(engine, now)
    reqs = job["requests"]
    prefixes = job.get("prefix")
    vocab = job["vocab_size"]
    out = [{"arrival_s": a, "added_s": None, "token_s": [], "preemptions": 0} for a, _, _ in reqs]
    iterations = []
    nxt, done, t0 = 0, 0, now()
    last_report, last, woke_for = 0.0, None, None
    while done < len(reqs):
        t = now() - t0
        if woke_for is not None:  # back from idle: the engine starts at the arrival itself
            rewind(t - woke_for)
            t, woke_for = (woke_for if job["clock"] == "cpu" else t), None
        if last is not None:  # the previous iteration ends where this loop turn starts
            last["end_s"], last = t, None
        while nxt < len(reqs) and reqs[nxt][0] <= t:
            arrival, prompt, output = reqs[nxt]
            ids = prompt_ids(nxt, prompt, vocab, prefixes[nxt] if prefixes else None)
            engine.add_request(f"r{nxt}", TokensPrompt(prompt_token_ids=ids),
                               SamplingParams(max_tokens=output, min_tokens=output, ignore_eos=True,
                                              detokenize=False, temperature=0.0))
            out[nxt]["added_s"] = t
            nxt += 1
        if not engine.has_unfinished_requests():
            idle(reqs[nxt][0] - t)
            woke_for = reqs[nxt][0]
            continue
        results = engine.step()
        returned = now() - t0  # the tokens of this step exist from here
        it = rec.take()
        if it is not None:
            # [start, end): from the arrival check before the step (adding requests is part of
            # it) to the next one, so that busy iterations tile the timeline without gaps
            it.update(start_s=t, returned_s=returned, end_s=returned)
            iterations.append(it)
            last = it
        for r in results:
            i = _index(r.request_id)
            n = len(r.outputs[0].token_ids)
            times = out[i]["token_s"]
            times.extend([returned] * (n - len(times)))
            if r.finished:
                done += 1
        if time.perf_counter() - last_report > 2.0:
            last_report = time.perf_counter()
            print(f"progress {done} {len(reqs)}", file=sys.stderr, flush=True)
    if last is not None:
        last["end_s"] = now() - t0
    for i, n in rec.preemptions.items():
        out[i]["preemptions"] = n
    import torch
    import vllm

    meta = {"vllm": vllm.__version__, "wall_s": time.perf_counter() - t_build, "torch": torch.__version__,
            "build_s": build_s,
            "clock": job["clock"], "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
            "torch_threads": torch.get_num_threads()}
    return {"requests": out, "iterations": iterations, "meta": meta}


def main() -> None:
    job_path, out_path = sys.argv[1], sys.argv[2]
    with open(job_path) as f:
        job = json.load(f)
    result = run(job)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f)
    os.replace(tmp, out_path)  # written whole or not at all
    print(f"progress {len(job['requests'])} {len(job['requests'])}", file=sys.stderr, flush=True)


def own_folder_off_path() -> None:
    """Run as a script, Python puts this file's folder (calibrate/) first on sys.path, where
    servesim's own modules would shadow what vLLM imports (calibrate/requests.py once hid PyPI's
    `requests`, and vLLM failed with "No module named 'sim'"). The driver needs nothing from there."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]


if __name__ == "__main__":
    own_folder_off_path()
    main()
