"""Schedulers on tiny exact cases (unit cost: every iteration lasts 1 s, so times count iterations),
and against small pure-Python reference models of the same semantics.

Conventions used in the timeline comments: `[a,b]` is the iteration that starts at a and ends at b;
"tok k @ t" means output token k is sampled at time t (the end of the iteration computing it).
"""
import heapq

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simhelpers import run

TOY_OUTPUTS = [444, 480, 91, 315, 573, 547, 464, 360]  # scenarios/toy-*-8.yaml
STEP_COLS = ["start_s", "num_seqs", "prefill_tokens", "decode_tokens", "kv_blocks_used", "waiting"]


def steps_rows(result, cols=STEP_COLS):
    return [tuple(row) for row in result.steps[cols].itertuples(index=False)]


# ------------------------------------------------------------------ reference models (unit cost)

def _blocks(tokens, block_size):
    return -(-tokens // block_size)


def reference_iteration_level(arrival, prompt, output, *, chunked, max_num_seqs, budget,
                              block_size, num_blocks, policy="fcfs", priority=None,
                              reserve_full_isl=True, window=0, groups=(1, 0)):
    """Continuous (chunked=False) or chunked batching on one replica, one loop turn per iteration,
    without prefix caching. `reserve_full_isl`: a waiting request joins only if its whole sequence
    fits in the free blocks (vLLM 0.32's default). Returns per-request first/finish/first_sched/
    preemptions and one dict per iteration.

    Sliding window: `groups` = (full, sliding) layer groups, each token taking a block slot in each;
    a sliding group frees a request's blocks wholly before position computed - window + 1 when the
    next iteration's pass over the running requests reaches it (vLLM's remove_skipped_blocks in
    allocate_slots), and the whole-sequence gate asks a sliding group for at most
    cdiv(window - 1 + 2 x budget, block_size) + 1 blocks."""
    n = len(arrival)
    full_groups, sliding_groups = groups
    g = full_groups + sliding_groups
    cap = _blocks(window - 1 + 2 * budget, block_size) + 1

    def behind(c):
        return max(0, c - window + 1) // block_size if sliding_groups else 0

    def sequence(c):
        return full_groups * _blocks(c, block_size) + sliding_groups * min(_blocks(c, block_size), cap)

    key = {"fcfs": None, "sjf": list(output),
           "priority": list(priority) if priority is not None else [0] * n}[policy]
    computed, generated, held = [0] * n, [0] * n, [0] * n
    recomputing = [False] * n  # preempted after sampling, next token not sampled yet
    first, finish, first_sched, preemptions = [None] * n, [None] * n, [None] * n, [0] * n
    free, waiting, running, steps = num_blocks, [], [], []
    skipped = [0] * n  # blocks a request has freed behind its window (per sliding group)

    def release(rid):  # free what is behind the window now
        nonlocal free
        gone = sliding_groups * (behind(computed[rid]) - skipped[rid])
        free, held[rid], skipped[rid] = free + gone, held[rid] - gone, behind(computed[rid])
    now, next_arrival, done = 0.0, 0, 0

    def push(rid, front=False):
        if key is None:
            waiting.insert(0 if front else len(waiting), rid)
        else:  # ordered policies re-insert by key, ties by request id
            waiting.append(rid)
            waiting.sort(key=lambda r: (key[r], r))

    while done < n:
        while next_arrival < n and arrival[next_arrival] <= now:
            push(next_arrival)
            next_arrival += 1
        if not running and not waiting:
            now = arrival[next_arrival]
            continue
        left, scheduled, preempted = budget, [], False
        i = 0
        while i < len(running):  # running requests first, in admission order
            rid = running[i]
            release(rid)
            take = min(prompt[rid] + generated[rid] - computed[rid], left)
            need = g * (_blocks(computed[rid] + take, block_size) - _blocks(computed[rid], block_size))
            while need > free:
                victim = running.pop()  # the most recently admitted
                free += held[victim]
                held[victim] = computed[victim] = skipped[victim] = 0
                preemptions[victim] += 1
                recomputing[victim] = generated[victim] > 0
                push(victim, front=True)
                preempted = True
                if victim == rid:
                    break
            else:
                free, held[rid] = free - need, held[rid] + need
                left -= take
                scheduled.append((rid, take))
            i += 1
        while not preempted and waiting and len(running) < max_num_seqs and left > 0:
            rid = waiting[0]
            want = prompt[rid] + generated[rid] - computed[rid]
            take = min(want, left) if chunked else (want if want <= left else 0)
            need = g * _blocks(computed[rid] + take, block_size) - held[rid]
            whole = sequence(computed[rid] + want) - held[rid]
            if take == 0 or need > free or (reserve_full_isl and whole > free):
                break  # head of line waits
            waiting.pop(0)
            free, held[rid] = free - need, held[rid] + need
            running.append(rid)
            scheduled.append((rid, take))
            if first_sched[rid] is None:
                first_sched[rid] = now
            left -= take
        scheduled = [(r, t) for r, t in scheduled if t > 0]
        assert scheduled, "a servable workload always makes progress"
        # a decode: one token by a request that sampled its previous token and was not preempted since
        decodes = sum(1 for r, t in scheduled if t == 1 and generated[r] > 0 and not recomputing[r])
        take = dict(scheduled)
        # KV token slots in use (every group's), less those freed behind windows
        tokens = sum(g * (computed[r] + take.get(r, 0)) - sliding_groups * block_size * skipped[r]
                     for r in running)
        steps.append(dict(start_s=now, num_seqs=len(scheduled),
                          prefill_tokens=sum(t for _, t in scheduled) - decodes,
                          decode_tokens=decodes, kv_blocks_used=num_blocks - free,
                          waiting=len(waiting), kv_tokens=tokens))
        now += 1.0
        for rid, take in scheduled:
            computed[rid] += take
            if computed[rid] == prompt[rid] + generated[rid]:  # caught up: samples a token
                generated[rid] += 1
                recomputing[rid] = False
                if first[rid] is None:
                    first[rid] = now
                if generated[rid] == output[rid]:
                    finish[rid], done = now, done + 1
                    free, held[rid], skipped[rid] = free + held[rid], 0, 0
                    running.remove(rid)
    return dict(first=first, finish=finish, first_sched=first_sched, preemptions=preemptions,
                steps=steps)


def reference_static(arrival, prompt, output, *, max_num_seqs, block_size, num_blocks,
                     batch_timeout_s=0.0, policy="fcfs", priority=None):
    """Static batching on one replica: whole batches, each row reserving padded prompt + max output."""
    n = len(arrival)
    key = {"fcfs": list(range(n)), "sjf": list(output),
           "priority": list(priority) if priority is not None else [0] * n}[policy]
    capacity, max_out = num_blocks * block_size, max(output)
    first, finish, first_sched = [None] * n, [None] * n, [None] * n
    waiting, now, next_arrival, done, steps = [], 0.0, 0, 0, []
    while done < n:
        while next_arrival < n and arrival[next_arrival] <= now:
            waiting.append(next_arrival)
            next_arrival += 1
        waiting.sort(key=lambda r: (key[r], r))
        if not waiting:
            now = arrival[next_arrival]
            continue
        if len(waiting) < max_num_seqs and batch_timeout_s > 0:
            deadline = arrival[min(waiting)] + batch_timeout_s
            if now < deadline:
                now = min(deadline, arrival[next_arrival]) if next_arrival < n else deadline
                continue
        batch, longest = [], 0
        while waiting and len(batch) < max_num_seqs:
            padded = max(longest, prompt[waiting[0]])
            if (len(batch) + 1) * (padded + max_out) > capacity:
                break
            batch.append(waiting.pop(0))
            longest = padded
        longest_out = max(output[r] for r in batch)
        for r in batch:
            first_sched[r], first[r], finish[r] = now, now + 1, now + output[r]
        steps.append(dict(start_s=now, num_seqs=len(batch),
                          prefill_tokens=sum(prompt[r] for r in batch),
                          padded_tokens=len(batch) * longest - sum(prompt[r] for r in batch)))
        for k in range(1, longest_out):  # decode iteration k samples token k + 1
            active = sum(1 for r in batch if output[r] > k)
            steps.append(dict(start_s=now + k, num_seqs=active, prefill_tokens=0,
                              padded_tokens=len(batch) - active))
        now += longest_out
        done += len(batch)
    return dict(first=first, finish=finish, first_sched=first_sched, steps=steps)


# ------------------------------------------------------------------ static

@pytest.mark.parametrize("ff", [True, False])
def test_static_toy_one_batch(ff):
    r = run([0.0] * 8, 16, TOY_OUTPUTS, scheduler="static", max_num_seqs=8, fast_forward=ff)
    # [0,1] prefill of all 8 -> tok 1 @ 1; decode until the longest (573) -> 573 iterations
    assert r.summary["iterations"] == 573
    assert r.summary["duration_s"] == 573.0
    assert r.requests["first_token_s"].tolist() == [1.0] * 8
    assert r.requests["finish_s"].tolist() == [float(o) for o in TOY_OUTPUTS]
    assert r.requests["queue_s"].tolist() == [0.0] * 8
    # useful row-iterations: 8 in the prefill + sum(output - 1) decodes = sum(output) = 3274
    assert r.summary["slot_utilization"] == pytest.approx(3274 / (8 * 573), rel=1e-12)
    assert r.summary["slot_utilization"] == pytest.approx(0.71422, abs=1e-5)
    if ff:  # a row per run of identical iterations: the batch shrinks as rows finish
        assert steps_rows(r, ["start_s", "count", "num_seqs", "padded_tokens"]) == [
            (0.0, 1, 8, 0),      # prefill, prompts all 16: no padding
            (1.0, 90, 8, 0),     # until 91 finishes @ 91
            (91.0, 224, 7, 1),   # until 315
            (315.0, 45, 6, 2),   # until 360
            (360.0, 84, 5, 3),   # until 444
            (444.0, 20, 4, 4),   # until 464
            (464.0, 16, 3, 5),   # until 480
            (480.0, 67, 2, 6),   # until 547
            (547.0, 26, 1, 7),   # until 573
        ]
    else:
        assert len(r.steps) == 573 and (r.steps["count"] == 1).all()


@pytest.mark.parametrize("ff", [True, False])
def test_static_toy_two_batches_of_four(ff):
    r = run([0.0] * 8, 16, TOY_OUTPUTS, scheduler="static", max_num_seqs=4, fast_forward=ff)
    # batch 1 = requests 0-3 (arrival order) on [0,480]: finish = output, longest 480
    # batch 2 = requests 4-7 on [480, 480+573]: tok 1 @ 481, finish = 480 + output
    assert r.requests["first_token_s"].tolist() == [1.0] * 4 + [481.0] * 4
    assert r.requests["finish_s"].tolist() == [444.0, 480.0, 91.0, 315.0,
                                               480 + 573.0, 480 + 547.0, 480 + 464.0, 480 + 360.0]
    assert r.requests["queue_s"].tolist() == [0.0] * 4 + [480.0] * 4
    assert r.summary["iterations"] == 480 + 573


@pytest.mark.parametrize("ff", [True, False])
def test_static_batch_timeout_waits_for_a_full_batch(ff):
    arrival = [0.0, 0.5, 1.0, 5.0, 5.2, 5.4, 5.6]
    r = run(arrival, 8, [3, 2, 1, 2, 2, 2, 2], scheduler="static", max_num_seqs=4,
            batch_timeout_s=2.0, fast_forward=ff)
    # t=0: 1 waiting < 4, wait until 0 + 2.0; by t=2 three have arrived -> batch [0,1,2] on [2,5]:
    #   tok 1 @ 3; finish 2+3=5, 2+2=4, 2+1=3.
    # t=5: request 3 (arrived at 5.0 exactly) waits until 7.0, but at 5.6 the 4th arrives -> a
    #   full batch starts at once on [5.6,7.6]: tok 1 @ 6.6, finish 7.6.
    assert r.requests["first_token_s"].tolist() == pytest.approx([3, 3, 3, 6.6, 6.6, 6.6, 6.6])
    assert r.requests["finish_s"].tolist() == pytest.approx([5, 4, 3, 7.6, 7.6, 7.6, 7.6])
    assert r.requests["queue_s"].tolist() == pytest.approx([2.0, 1.5, 1.0, 0.6, 0.4, 0.2, 0.0])


@pytest.mark.parametrize("ff", [True, False])
def test_static_kv_memory_limits_the_batch(ff):
    # each row reserves padded prompt 16 + longest output 8 = 24 slots; 3 blocks x 16 = 48 -> 2 rows
    r = run([0.0] * 3, 16, 8, scheduler="static", max_num_seqs=8, block_size=16, num_gpu_blocks=3,
            fast_forward=ff)
    # batch [0,1] on [0,8]; batch [2] on [8,16]
    assert r.requests["finish_s"].tolist() == [8.0, 8.0, 16.0]
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 9.0]
    assert r.steps["kv_blocks_used"].tolist()[0] == 3  # 48 reserved slots


def test_static_pads_prompts_to_the_longest():
    r = run([0.0] * 3, [4, 10, 16], [1, 2, 3], scheduler="static", max_num_seqs=4, fast_forward=False)
    # [0,1] prefill: 3 rows x 16 padded = 48 computed, 30 useful -> 18 padded; tok 1 @ 1 (req 0 done)
    # [1,2] 3 rows decode, req 0 idle -> 1 padded; req 1 done @ 2
    # [2,3] 3 rows decode, reqs 0 and 1 idle -> 2 padded; req 2 done @ 3
    assert steps_rows(r, ["start_s", "num_seqs", "prefill_tokens", "decode_tokens",
                          "padded_tokens"]) == [(0.0, 3, 30, 0, 18), (1.0, 2, 0, 2, 1),
                                                (2.0, 1, 0, 1, 2)]
    assert r.requests["finish_s"].tolist() == [1.0, 2.0, 3.0]


# ------------------------------------------------------------------ continuous

def list_scheduling_finish(outputs, slots):
    """Continuous batching with every request at t=0 and ample budget/KV is greedy list scheduling:
    a request joins the iteration that starts when a slot frees, and holds it for `output` iters."""
    free_at = [0.0] * slots
    finish = []
    for o in outputs:
        start = heapq.heappop(free_at)
        finish.append(start + o)
        heapq.heappush(free_at, start + o)
    return finish


@pytest.mark.parametrize("ff", [True, False])
def test_continuous_twenty_requests_eight_slots(ff):
    outputs = np.random.default_rng(0).integers(50, 800, size=20).tolist()
    r = run([0.0] * 20, 16, outputs, scheduler="continuous", max_num_seqs=8, fast_forward=ff)
    ref = reference_iteration_level([0.0] * 20, [16] * 20, outputs, chunked=False, max_num_seqs=8,
                                    budget=8192, block_size=16, num_blocks=10**6)
    assert r.requests["finish_s"].tolist() == ref["finish"]
    assert r.requests["first_token_s"].tolist() == ref["first"]
    assert r.summary["iterations"] == len(ref["steps"])
    # the same, by a second argument: requests 0-7 start at 0; each later one takes the first slot
    # to free up (ties: any), e.g. request 8 (181 tokens) joins when 62 finishes @ 62 -> 243
    assert r.requests["finish_s"].tolist() == list_scheduling_finish(outputs, 8)
    assert r.requests["finish_s"].iloc[8] == 62 + 181
    assert r.summary["iterations"] == max(list_scheduling_finish(outputs, 8))


def test_continuous_toy_equals_static_length():
    r = run([0.0] * 8, 16, TOY_OUTPUTS, scheduler="continuous", max_num_seqs=8)
    # nobody waits for a freed slot, so continuous also needs 573 iterations; finish = output
    assert r.summary["iterations"] == 573
    assert r.requests["finish_s"].tolist() == [float(o) for o in TOY_OUTPUTS]


def test_continuous_prompt_waits_for_the_token_budget():
    r = run([0.0, 0.0], 8, [3, 2], scheduler="continuous", max_num_seqs=4, max_num_batched_tokens=10,
            fast_forward=False)
    # [0,1] A prefill 8 (B's 8 > 10 - 8 left: waits) -> A tok 1 @ 1
    # [1,2] A decode 1 + B prefill 8 = 9 <= 10 -> A tok 2 @ 2, B tok 1 @ 2
    # [2,3] A decode, B decode -> A tok 3 @ 3 (done), B tok 2 @ 3 (done)
    assert r.requests["first_token_s"].tolist() == [1.0, 2.0]
    assert r.requests["finish_s"].tolist() == [3.0, 3.0]
    assert steps_rows(r) == [(0.0, 1, 8, 0, 1, 1), (1.0, 2, 8, 1, 2, 0), (2.0, 2, 0, 2, 2, 0)]


def test_continuous_max_num_seqs_holds_a_request_back():
    r = run([0.0] * 3, 4, [2, 3, 2], scheduler="continuous", max_num_seqs=2, fast_forward=False)
    # [0,1] A, B prefill (C waits: 2 seats) -> tok 1 @ 1
    # [1,2] A, B decode -> A done @ 2
    # [2,3] B decode, C joins (prefill 4) -> B done @ 3, C tok 1 @ 3
    # [3,4] C decode -> done @ 4
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 3.0]
    assert r.requests["finish_s"].tolist() == [2.0, 3.0, 4.0]
    assert r.requests["queue_s"].tolist() == [0.0, 0.0, 2.0]
    assert steps_rows(r) == [(0.0, 2, 8, 0, 2, 1), (1.0, 2, 0, 2, 2, 1), (2.0, 2, 4, 1, 2, 0),
                             (3.0, 1, 0, 1, 1, 0)]


def test_output_one_finishes_at_its_prefill():
    r = run([0.0, 0.0], 5, [1, 3], scheduler="continuous", max_num_seqs=4)
    # [0,1] both prefill -> A's only token @ 1 (done), B tok 1 @ 1; B decodes to tok 3 @ 3
    assert r.requests["finish_s"].tolist() == [1.0, 3.0]
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0]
    assert np.isnan(r.requests["tpot_s"].iloc[0])


# ------------------------------------------------------------------ chunked

@pytest.mark.parametrize("ff", [True, False])
def test_chunked_long_prompt_spans_iterations(ff):
    r = run([0.0], 10, 3, scheduler="chunked", max_num_seqs=4, max_num_batched_tokens=4,
            fast_forward=ff)
    # chunks 4, 4, 2 on [0,1] [1,2] [2,3] -> tok 1 @ 3; decodes [3,4] [4,5] -> tok 3 @ 5
    assert r.requests["first_token_s"].tolist() == [3.0]
    assert r.requests["finish_s"].tolist() == [5.0]
    if not ff:
        assert steps_rows(r) == [(0.0, 1, 4, 0, 1, 0), (1.0, 1, 4, 0, 1, 0), (2.0, 1, 2, 0, 1, 0),
                                 (3.0, 1, 0, 1, 1, 0), (4.0, 1, 0, 1, 1, 0)]


def test_chunked_prompt_shares_the_budget_with_a_running_decode():
    r = run([0.0, 1.0], [1, 7], [6, 2], scheduler="chunked", max_num_seqs=4,
            max_num_batched_tokens=4, fast_forward=False)
    # [0,1] A prefill 1 -> A tok 1 @ 1
    # [1,2] A decode + B chunk 3 (budget 4 - 1)   [2,3] A decode + B chunk 3
    # [3,4] A decode + B's last 1 -> B tok 1 @ 4
    # [4,5] A, B decode -> B done @ 5              [5,6] A decode -> A tok 6 @ 6 (done)
    assert r.requests["first_token_s"].tolist() == [1.0, 4.0]
    assert r.requests["finish_s"].tolist() == [6.0, 5.0]
    assert steps_rows(r, ["start_s", "num_seqs", "prefill_tokens", "decode_tokens"]) == [
        (0.0, 1, 1, 0), (1.0, 2, 3, 1), (2.0, 2, 3, 1), (3.0, 2, 1, 1), (4.0, 2, 0, 2),
        (5.0, 1, 0, 1)]


# ------------------------------------------------------------------ preemption

@pytest.mark.parametrize("ff", [True, False])
def test_continuous_preemption_timeline(ff):
    r = run([0.0, 0.0], 4, 7, scheduler="continuous", max_num_seqs=2, max_num_batched_tokens=16,
            block_size=4, num_gpu_blocks=4, fast_forward=ff, enable_prefix_caching=False)
    # blocks of 4 tokens, 4 blocks. A and B: prompt 4, output 7. No prefix caching: B's recompute
    # starts from nothing (with caching, see the next test).
    # [0,1] A, B prefill 4 (1 block each) -> tok 1 @ 1
    # [1,2]..[4,5] decodes at positions 5..8 (2 blocks each, 4 in use) -> tok 5 @ 5
    # t=5: A needs a 3rd block for position 9, none free -> B (latest admitted) preempted;
    #      [5,6] A alone, nobody admitted -> A tok 6 @ 6
    # t=6: B must recompute 4 + 5 = 9 tokens (3 blocks), only 1 free -> waits; [6,7] A tok 7, done @ 7
    # [7,8] B recompute prefill 9 -> B tok 6 @ 8;  [8,9] B decode -> tok 7 @ 9, done
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0]
    assert r.requests["finish_s"].tolist() == [7.0, 9.0]
    assert r.requests["preemptions"].tolist() == [0, 1]
    assert r.summary["preemptions"] == 1
    assert r.summary["iterations"] == 9
    if ff:
        assert steps_rows(r, ["start_s", "count", "num_seqs", "kv_blocks_used", "waiting"]) == [
            (0.0, 1, 2, 2, 0), (1.0, 4, 2, 4, 0), (5.0, 1, 1, 3, 1), (6.0, 1, 1, 3, 1),
            (7.0, 1, 1, 3, 0), (8.0, 1, 1, 3, 0)]
    else:
        assert steps_rows(r) == [
            (0.0, 2, 8, 0, 2, 0), (1.0, 2, 0, 2, 4, 0), (2.0, 2, 0, 2, 4, 0), (3.0, 2, 0, 2, 4, 0),
            (4.0, 2, 0, 2, 4, 0), (5.0, 1, 0, 1, 3, 1), (6.0, 1, 0, 1, 3, 1), (7.0, 1, 9, 0, 3, 0),
            (8.0, 1, 0, 1, 3, 0)]


@pytest.mark.parametrize("ff", [True, False])
def test_continuous_preemption_resumes_from_its_own_cached_blocks(ff):
    r = run([0.0, 0.0], 4, 7, scheduler="continuous", max_num_seqs=2, max_num_batched_tokens=16,
            block_size=4, num_gpu_blocks=4, fast_forward=ff)
    # The timeline above with prefix caching on (vLLM's default), as vLLM does it:
    # t=5: B (8 tokens computed: 2 full blocks) is preempted; its blocks go to the tail of the free
    #      queue, last block first, keeping their hashes: queue = [B2, B1]
    # [5,6] A takes a 3rd block from the head: B2 is evicted -> A tok 6 @ 6
    # t=6: B resumes with 4 + 5 = 9 tokens (3 blocks) but only B1 is free: the whole sequence must
    #      fit, so it waits; [6,7] A tok 7, done @ 7 (A's 3 blocks freed)
    # [7,8] B hits B1 (tokens 1-4) and computes the other 5 -> B tok 6 @ 8; [8,9] tok 7, done
    assert r.requests["finish_s"].tolist() == [7.0, 9.0]
    assert r.requests["preemptions"].tolist() == [0, 1]
    if not ff:
        assert steps_rows(r, ["start_s", "num_seqs", "prefill_tokens", "decode_tokens"])[5:] == [
            (5.0, 1, 0, 1), (6.0, 1, 0, 1), (7.0, 1, 5, 0), (8.0, 1, 0, 1)]


def test_chunked_admits_only_a_request_whose_whole_sequence_fits():
    """vLLM 0.32's scheduler_reserve_full_isl: a chunk fits, the whole prompt does not -> wait."""
    kw = dict(scheduler="chunked", max_num_seqs=2, max_num_batched_tokens=4, block_size=1,
              num_gpu_blocks=8, fast_forward=False, enable_prefix_caching=False)
    # A: prompt 2, output 5 (6 blocks at its last decode); B arrives at 1 with prompt 6.
    # [0,1] A prefill 2 -> tok 1 @ 1 (2 blocks). t=1: 6 free; B's whole prompt needs 6 blocks and
    # A's decode 1 more: B's first chunk (3 tokens) would fit, but B must wait for A.
    on = run([0.0, 1.0], [2, 6], [5, 2], **kw)
    # with the gate: B waits; [1,5] A decodes tok 2..5, done @ 5; [5,6] B chunk 4, [6,7] chunk 2
    # -> B tok 1 @ 7; [7,8] tok 2, done @ 8
    assert on.requests["first_token_s"].tolist() == [1.0, 7.0]
    assert on.requests["finish_s"].tolist() == [5.0, 8.0]
    assert on.requests["preemptions"].tolist() == [0, 0]
    assert steps_rows(on, ["start_s", "prefill_tokens", "decode_tokens", "kv_blocks_used"]) == [
        (0.0, 2, 0, 2), (1.0, 0, 1, 3), (2.0, 0, 1, 4), (3.0, 0, 1, 5), (4.0, 0, 1, 6),
        (5.0, 4, 0, 4), (6.0, 2, 0, 6), (7.0, 0, 1, 7)]
    off = run([0.0, 1.0], [2, 6], [5, 2], scheduler_reserve_full_isl=False, **kw)
    # without it (older vLLM V1) B joins at 1 with a 3-token chunk beside A's decode (6 blocks);
    # at 2 A's next block does not fit beside B's next chunk -> B preempted; it joins again at 3
    # and is preempted again at 4: two wasted chunks, the same finish times here
    assert off.requests["preemptions"].tolist() == [0, 2]
    assert steps_rows(off, ["start_s", "prefill_tokens", "decode_tokens", "kv_blocks_used"])[:5] == [
        (0.0, 2, 0, 2), (1.0, 3, 1, 6), (2.0, 0, 1, 4), (3.0, 3, 1, 8), (4.0, 0, 1, 6)]


@pytest.mark.parametrize("ff", [True, False])
def test_chunked_preempted_twice_during_recompute(ff):
    r = run([0.0, 0.0], 1, [6, 4], scheduler="chunked", max_num_seqs=2, max_num_batched_tokens=2,
            block_size=1, num_gpu_blocks=6, fast_forward=ff, enable_prefix_caching=False,
            scheduler_reserve_full_isl=False)  # B re-joins with a partial chunk (older vLLM V1)
    # 1-token blocks, 6 of them, budget 2. A: output 6, B: output 4, prompts 1.
    # [0,1] both prefill -> tok 1 @ 1;  [1,2] [2,3] both decode -> tok 3 @ 3, 6 blocks in use
    # t=3: A needs a block -> B preempted (gen 3); [3,4] A -> tok 4 @ 4
    # t=4: B re-admitted with a 1-token chunk of its 1 + 3 = 4 (budget 2 - A's 1); [4,5]
    # t=5: A needs a block -> B preempted again; [5,6] A -> tok 6 @ 6, done
    # [6,7] [7,8] B recomputes 2 + 2 -> tok 4 @ 8, done
    assert r.requests["finish_s"].tolist() == [6.0, 8.0]
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0]
    assert r.requests["preemptions"].tolist() == [0, 2]
    if not ff:
        assert steps_rows(r) == [
            (0.0, 2, 2, 0, 2, 0), (1.0, 2, 0, 2, 4, 0), (2.0, 2, 0, 2, 6, 0), (3.0, 1, 0, 1, 4, 1),
            (4.0, 2, 1, 1, 6, 0), (5.0, 1, 0, 1, 6, 1), (6.0, 1, 2, 0, 2, 0), (7.0, 1, 2, 0, 4, 0)]


def test_chunked_recompute_ending_in_one_token_is_a_prefill():
    r = run([0.0, 0.0], 1, 3, scheduler="chunked", max_num_seqs=2, max_num_batched_tokens=2,
            block_size=1, num_gpu_blocks=4, fast_forward=False, enable_prefix_caching=False)
    # [0,1] A, B prefill 1 -> tok 1 @ 1;  [1,2] both decode -> tok 2 @ 2 (4 blocks in use)
    # t=2: A needs a 3rd block -> B preempted (gen 2); [2,3] A -> tok 3 @ 3, done
    # [3,4] B recomputes 2 of its 1 + 2 = 3 tokens;  [4,5] the last 1 -> B tok 3 @ 5, done.
    # That last 1-token chunk finishes a recompute prefill: a prefill token, not a decode.
    assert r.requests["finish_s"].tolist() == [3.0, 5.0]
    assert r.requests["preemptions"].tolist() == [0, 1]
    assert steps_rows(r) == [
        (0.0, 2, 2, 0, 2, 0), (1.0, 2, 0, 2, 4, 0), (2.0, 1, 0, 1, 3, 1), (3.0, 1, 2, 0, 2, 0),
        (4.0, 1, 1, 0, 3, 0)]


@pytest.mark.parametrize("ff", [True, False])
def test_an_iteration_that_preempts_admits_nobody(ff):
    r = run([0.0, 0.0, 0.5], 1, [6, 5, 1], scheduler="continuous", policy="sjf", max_num_seqs=2,
            max_num_batched_tokens=8, block_size=1, num_gpu_blocks=6, fast_forward=ff)
    # sjf admits B (output 5) before A (output 6); C (output 1) arrives at 0.5 to two full seats.
    # [0,1] B, A prefill -> tok 1 @ 1;  [1,2] [2,3] decode -> tok 3 @ 3, all 6 blocks in use
    # t=3: B needs a block -> A (latest admitted, 3 blocks) preempted; C is first in line, a seat
    #      and 2 blocks are free, but this iteration admits nobody: [3,4] B alone -> tok 4 @ 4
    # t=4: C joins (ahead of A: output 1 < 6): [4,5] B tok 5 (done) + C prefill -> C done @ 5
    # t=5: A recomputes 1 + 3 tokens -> tok 4 @ 6; decodes -> tok 6 @ 8
    assert r.requests["first_token_s"].tolist() == [1.0, 1.0, 5.0]
    assert r.requests["finish_s"].tolist() == [8.0, 5.0, 5.0]
    assert r.requests["preemptions"].tolist() == [1, 0, 0]
    assert r.requests["queue_s"].tolist() == [0.0, 0.0, 3.5]
    if not ff:
        assert steps_rows(r) == [
            (0.0, 2, 2, 0, 2, 0), (1.0, 2, 0, 2, 4, 1), (2.0, 2, 0, 2, 6, 1), (3.0, 1, 0, 1, 4, 2),
            (4.0, 2, 1, 1, 6, 1), (5.0, 1, 4, 0, 4, 0), (6.0, 1, 0, 1, 5, 0), (7.0, 1, 0, 1, 6, 0)]


# ------------------------------------------------------------------ policies

POLICY_CASE = dict(arrival=[0.0] * 4, prompt=4, output=[4, 1, 3, 2], priority=[1, 3, 0, 2])


@pytest.mark.parametrize("scheduler", ["static", "continuous", "chunked"])
@pytest.mark.parametrize("policy, first, finish", [
    # one seat, so requests run one after another in queue order:
    # fcfs 0,1,2,3: [0,4] [4,5] [5,8] [8,10]
    ("fcfs", [1.0, 5.0, 6.0, 9.0], [4.0, 5.0, 8.0, 10.0]),
    # sjf (outputs 4,1,3,2) 1,3,2,0: [0,1] [1,3] [3,6] [6,10]
    ("sjf", [7.0, 1.0, 4.0, 2.0], [10.0, 1.0, 6.0, 3.0]),
    # priority (1,3,0,2) 2,0,3,1: [0,3] [3,7] [7,9] [9,10]
    ("priority", [4.0, 10.0, 1.0, 8.0], [7.0, 10.0, 3.0, 9.0]),
])
def test_policy_sets_admission_order(scheduler, policy, first, finish):
    c = POLICY_CASE
    r = run(c["arrival"], c["prompt"], c["output"], c["priority"], scheduler=scheduler,
            policy=policy, max_num_seqs=1, max_num_batched_tokens=16)
    assert r.requests["first_token_s"].tolist() == first
    assert r.requests["finish_s"].tolist() == finish


def test_sjf_later_short_request_jumps_the_queue():
    r = run([0.0, 0.0, 0.5], 2, [3, 5, 1], scheduler="continuous", policy="sjf", max_num_seqs=1,
            max_num_batched_tokens=8)
    # t=0: queue (by output) 0 (3), 1 (5) -> 0 runs [0,3]; request 2 (output 1) arrives at 0.5
    # t=3: 2 before 1 -> [3,4]; then 1 on [4,9]
    assert r.requests["first_token_s"].tolist() == [1.0, 5.0, 4.0]
    assert r.requests["finish_s"].tolist() == [3.0, 9.0, 4.0]


# ------------------------------------------------------------------ against the references

@st.composite
def iteration_level_cases(draw):
    n = draw(st.integers(1, 10))
    arrival = sorted(draw(st.lists(st.integers(0, 16), min_size=n, max_size=n)))
    prompt = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    chunked = draw(st.booleans())
    seqs = draw(st.integers(1, 5))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    longest = max(p + o - 1 for p, o in zip(prompt, output))
    budget = draw(st.integers(seqs, seqs + 24)) if chunked else max(seqs, longest) + draw(
        st.integers(0, 10))
    blocks = max(_blocks(p + o - 1, block_size) for p, o in zip(prompt, output))
    return dict(arrival=[a / 2 for a in arrival], prompt=prompt, output=output, chunked=chunked,
                max_num_seqs=seqs, budget=budget, block_size=block_size,
                num_blocks=blocks + draw(st.integers(0, 5)),
                policy=draw(st.sampled_from(["fcfs", "sjf", "priority"])),
                priority=draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)),
                reserve_full_isl=draw(st.booleans()))


def _run_case(case: dict, ff: bool, **more):
    """Simulate an iteration_level_cases case (unit cost) with `more` scenario keys."""
    return run(case["arrival"], case["prompt"], case["output"], case["priority"],
               scheduler="chunked" if case["chunked"] else "continuous", policy=case["policy"],
               max_num_seqs=case["max_num_seqs"], max_num_batched_tokens=case["budget"],
               block_size=case["block_size"], num_gpu_blocks=case["num_blocks"], fast_forward=ff,
               scheduler_reserve_full_isl=case["reserve_full_isl"], **more)


def _assert_same_requests(r, ref: dict) -> None:
    rq = r.requests
    assert rq["finish_s"].tolist() == ref["finish"]
    assert rq["first_token_s"].tolist() == ref["first"]
    assert rq["preemptions"].tolist() == ref["preemptions"]
    assert (rq["arrival_s"] + rq["queue_s"]).tolist() == ref["first_sched"]
    assert r.summary["iterations"] == len(ref["steps"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=iteration_level_cases(), ff=st.booleans())
def test_iteration_level_matches_reference(case, ff):
    ref = reference_iteration_level(**case)
    r = _run_case(case, ff, enable_prefix_caching=False)
    _assert_same_requests(r, ref)
    if not ff:  # one row per iteration; how tokens split into prefill/decode has its own test above
        cols = ["start_s", "num_seqs", "kv_blocks_used", "waiting"]
        got = [row + (p + d,) for row, p, d in zip(steps_rows(r, cols), r.steps["prefill_tokens"],
                                                   r.steps["decode_tokens"])]
        assert got == [tuple(s[c] for c in cols) + (s["prefill_tokens"] + s["decode_tokens"],)
                       for s in ref["steps"]]


@st.composite
def static_cases(draw):
    n = draw(st.integers(1, 10))
    arrival = sorted(draw(st.lists(st.integers(0, 40), min_size=n, max_size=n)))
    prompt = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    output = draw(st.lists(st.integers(1, 20), min_size=n, max_size=n))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    return dict(arrival=[a / 4 for a in arrival], prompt=prompt, output=output,
                max_num_seqs=draw(st.integers(1, 5)), block_size=block_size,
                num_blocks=_blocks(max(prompt) + max(output), block_size) + draw(st.integers(0, 30)),
                batch_timeout_s=draw(st.sampled_from([0.0, 0.5, 1.0, 2.5, 7.0])),
                policy=draw(st.sampled_from(["fcfs", "sjf", "priority"])),
                priority=draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=static_cases(), ff=st.booleans())
def test_static_matches_reference(case, ff):
    ref = reference_static(**case)
    r = run(case["arrival"], case["prompt"], case["output"], case["priority"], scheduler="static",
            policy=case["policy"], max_num_seqs=case["max_num_seqs"],
            block_size=case["block_size"], num_gpu_blocks=case["num_blocks"],
            batch_timeout_s=case["batch_timeout_s"], fast_forward=ff)
    rq = r.requests
    assert rq["finish_s"].tolist() == ref["finish"]
    assert rq["first_token_s"].tolist() == ref["first"]
    assert (rq["arrival_s"] + rq["queue_s"]).tolist() == ref["first_sched"]
    assert r.summary["iterations"] == len(ref["steps"])
    if not ff:
        cols = ["start_s", "num_seqs", "prefill_tokens", "padded_tokens"]
        assert steps_rows(r, cols) == [tuple(s[c] for c in cols) for s in ref["steps"]]


@st.composite
def windowed_cases(draw):
    """iteration_level_cases over a sliding-window model: a window, and the layer groups of
    sim/presets/models.KVLayout for a 4-layer model with 4 (one group), 2 (2 + 2) or 3 (1 + 3) windowed
    layers."""
    case = draw(iteration_level_cases())
    case["window"] = draw(st.integers(1, 24))
    sliding = draw(st.sampled_from([4, 2, 3]))
    case["groups"] = {4: (0, 1), 2: (1, 1), 3: (1, 3)}[sliding]
    case["sliding_layers"] = sliding
    g, bs = sum(case["groups"]), case["block_size"]
    case["num_blocks"] = g * max(_blocks(p + o - 1, bs) for p, o in zip(case["prompt"], case["output"])) \
        + draw(st.integers(0, 8))
    return case


WINDOWED_MODEL = {"name": "sw", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
                  "num_kv_heads": 2, "intermediate_size": 128, "vocab_size": 256}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=windowed_cases(), ff=st.booleans())
def test_sliding_window_matches_reference(case, ff):
    """The windowed cache and decode pool (freed blocks behind the window, bulk runs whose free
    count is not monotone, layer groups) against the per-request reference."""
    sliding = case.pop("sliding_layers")
    ref = reference_iteration_level(**case)
    model = {**WINDOWED_MODEL, "sliding_window": case["window"], "sliding_layers": sliding}
    r = _run_case(case, ff, model=model)
    _assert_same_requests(r, ref)
    used = [s["kv_blocks_used"] for s in ref["steps"]]
    slots = case["block_size"] * sum(used)  # every iteration lasts 1 s
    assert r.summary["kv_waste"] == pytest.approx(1 - sum(s["kv_tokens"] for s in ref["steps"]) / slots,
                                                  rel=1e-9, abs=1e-12)
    if not ff:
        assert r.steps["kv_blocks_used"].tolist() == used
    else:  # a run's row reports its last iteration
        ends = (r.steps["start_s"] + r.steps["count"] - 1).tolist()
        starts = [s["start_s"] for s in ref["steps"]]
        assert r.steps["kv_blocks_used"].tolist() == [used[starts.index(e)] for e in ends]
