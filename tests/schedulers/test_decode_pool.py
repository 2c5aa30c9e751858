"""The decode pool's block-opening counts: the Python walk (`slots_opened`, `new_blocks_now`, read
by every decode run) against the numpy arrays (`new_blocks_at`, `phase_count`) and against a
member-by-member count, through random joins, leaves and runs."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.schedulers.decode_pool import DecodePool
from sim.workload.request import RequestTable
from simhelpers import make_workload

N = 40  # requests


def _table(rng: np.random.Generator) -> RequestTable:
    """Requests with their prompts computed and one token sampled, ready to decode."""
    workload = make_workload([0.0] * N, rng.integers(1, 300, N), rng.integers(2, 400, N))
    req = RequestTable.from_workload(workload)
    req.computed[:] = req.prompt
    req.generated[:] = 1
    return req


def _by_member(pool: DecodePool, req, count: int) -> list[int]:
    """Blocks opened in iterations 1..count, cumulative, member by member: a member holding c
    tokens computes position c + j in iteration j, opening a block when that is a multiple of
    block_size."""
    bs, per = pool.block_size, [0] * count
    for rid in pool.members:
        c = pool.computed(rid)
        for j in range(1, count + 1):
            per[j - 1] += (c + j) % bs == 0
    return np.cumsum(per).tolist()


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), block_size=st.sampled_from([1, 4, 16]),
       ops=st.lists(st.tuples(st.sampled_from(["join", "leave", "run"]), st.integers(1, 40)),
                    min_size=1, max_size=40))
def test_the_walked_openings_equal_numpy_and_a_count_by_member(seed, block_size, ops):
    rng = np.random.default_rng(seed)
    req = _table(rng)
    pool, outside = DecodePool(req, block_size), list(range(N))
    for op, k in ops:
        if op == "join" and outside:
            pool.join(outside.pop(k % len(outside)))
        elif op == "leave" and pool.members:
            rid = list(pool.members)[k % len(pool.members)]
            pool.leave(rid)
            outside.append(rid)
        elif op == "run" and pool.members:
            outside += pool.advance(min(k, pool.steps_to_next_finish()))
        assert pool.new_blocks_now() == int(pool.phase_count[pool.clock % block_size])
        for count in (1, k):
            opened, slots = pool.slots_opened(count, block_size)
            cumulative = pool.new_blocks_at(1, count).cumsum()
            assert slots == (cumulative * block_size).tolist()
            assert opened == int(cumulative[-1]) == _by_member(pool, req, count)[-1]
            assert cumulative.tolist() == _by_member(pool, req, count)


def test_new_blocks_at_over_a_long_run_equals_a_count_by_member():
    """Past the take() path (runs ending beyond _WRAP_TAKE_MAX steps of a phase: numpy's "wrap"
    reduced each index by repeated subtraction, quadratic in the run), the counts repeated: the
    same as a member-by-member count."""
    from sim.schedulers.decode_pool import _WRAP_TAKE_MAX
    req = _table(np.random.default_rng(7))
    pool = DecodePool(req, 16)
    for rid in range(0, N, 3):
        pool.join(rid)
    pool.advance(5)
    count = _WRAP_TAKE_MAX + 1000
    assert pool.new_blocks_at(1, count).cumsum().tolist() == _by_member(pool, req, count)
