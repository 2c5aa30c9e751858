"""Speculative decoding (sim/schedulers/speculative.py): exact timelines with the unit cost model, the
acceptance law, costs, KV invariants under preemption, and config errors."""
from __future__ import annotations

import numpy as np
import pytest

from sim.build import cost_model
from sim.config.errors import ScenarioError
from sim.config.speculative import SpeculativeConfig
from sim.cost.batch import BatchStats
from sim.schedulers.speculative import accepted_tokens
from simhelpers import make_scenario, run


def spec(a, k=3, method="ngram", **more):
    return {"method": method, "num_speculative_tokens": k, "acceptance_rate": a, **more}


def test_full_acceptance_finishes_12_tokens_in_3_verifications_after_the_first():
    # unit cost, ngram (free draft): prefill [0, 1] samples token 1; each verification then gains
    # k + 1 = 4 tokens: 5, 9, 13 -> capped at 12 at the end of the third, t = 4
    r = run([0.0], 100, 12, scheduler="chunked", speculative=spec(1.0))
    rq = r.requests.iloc[0]
    assert rq["first_token_s"] == 1.0 and rq["finish_s"] == 4.0
    assert int(r.steps["count"].sum()) == 4
    # each iteration streams one chunk per sequence: 3 gaps of one iteration
    assert r.itl[0].tolist() == [1.0, 1.0, 1.0] and r.itl[1].tolist() == [1, 1, 1]
    assert rq["tpot_s"] == pytest.approx(3.0 / 11)


def test_zero_acceptance_is_plain_decoding_plus_verification_cost():
    plain = run([0.0], 100, 12, scheduler="chunked")
    zero = run([0.0], 100, 12, scheduler="chunked", speculative=spec(0.0))
    # one token per iteration either way: the same timeline under unit cost
    assert zero.requests["finish_s"].tolist() == plain.requests["finish_s"].tolist() == [12.0]
    # priced: every decode verifies k + 1 = 4 tokens and runs the EAGLE head, so each costs more
    plain_r = run([0.0], 100, 12, scheduler="chunked", cost_model="roofline")
    zero_r = run([0.0], 100, 12, scheduler="chunked", cost_model="roofline", speculative=spec(0.0, method="eagle"))
    assert int(zero_r.steps["count"].sum()) == int(plain_r.steps["count"].sum()) == 12
    assert zero_r.requests["finish_s"].iloc[0] > plain_r.requests["finish_s"].iloc[0]


def test_verification_and_draft_costs_are_added_to_the_target():
    sc = make_scenario(cost_model="roofline", scheduler="chunked", speculative=spec(0.5, method="eagle"))
    cost, target = cost_model(sc), cost_model(make_scenario(cost_model="roofline", scheduler="chunked"))
    verify = BatchStats(prefill_lens=np.full(8, 4), prefill_contexts=np.full(8, 500))
    with_draft = BatchStats(prefill_lens=verify.prefill_lens, prefill_contexts=verify.prefill_contexts,
                            draft_seqs=8, draft_context_sum=4000)
    head = target.step_times(BatchStats(num_decodes=8, decode_context_sum=4008))[0] / sc.model.num_layers
    assert cost.step_times(with_draft)[0] == pytest.approx(target.step_times(verify)[0] + 3 * head)
    ngram = cost_model(make_scenario(cost_model="roofline", scheduler="chunked", speculative=spec(0.5)))
    assert ngram.step_times(with_draft)[0] == pytest.approx(target.step_times(verify)[0])


@pytest.mark.parametrize("a", [(0.7, 0.7, 0.7), (0.9, 0.6, 0.3), (0.5, 0.5, 0.5, 0.5, 0.5)])
def test_mean_accepted_tokens_matches_the_formula(a):
    n = 200_000
    got = accepted_tokens(np.random.default_rng(7), a, n)
    expect = SpeculativeConfig("ngram", len(a), a).expected_tokens
    if len(set(a)) == 1:  # constant a: (1 - a^(k+1)) / (1 - a)
        assert expect == pytest.approx((1 - a[0] ** (len(a) + 1)) / (1 - a[0]))
    sd = got.std()
    assert abs(got.mean() - expect) < 4 * sd / np.sqrt(n)
    assert got.min() >= 1 and got.max() <= len(a) + 1


def test_simulated_tokens_per_verification_match_the_formula():
    # one long request: every verification but the last gains an uncapped draw
    r = run([0.0], 10, 20_000, scheduler="chunked", speculative=spec(0.6, k=4), num_gpu_blocks=4000)
    verifications = int(r.steps["count"].sum()) - 1
    expect = (1 - 0.6 ** 5) / (1 - 0.6)
    per = (20_000 - 1) / verifications
    assert per == pytest.approx(expect, rel=0.02)


def test_kv_blocks_stay_within_capacity_and_every_request_finishes_under_preemption():
    n = 40
    arrival = np.linspace(0, 5, n)
    r = run(arrival, 200, 300, scheduler="chunked", speculative=spec(0.8, k=4), num_gpu_blocks=200,
            block_size=16, max_num_seqs=32)
    assert r.requests["finish_s"].notna().all()
    assert (r.steps["kv_blocks_used"] <= 200).all()
    assert r.summary["preemptions"] > 0
    # a tokens-conserving run: every request generated exactly its output
    assert (r.requests["output_tokens"] == 300).all()


def test_the_same_seed_gives_the_same_run_and_another_seed_another():
    a = run(np.linspace(0, 2, 20), 100, 200, scheduler="chunked", speculative=spec(0.6))
    b = run(np.linspace(0, 2, 20), 100, 200, scheduler="chunked", speculative=spec(0.6))
    assert a.requests["finish_s"].tolist() == b.requests["finish_s"].tolist()
    sc = make_scenario(seed=1, scheduler="chunked", speculative=spec(0.6))
    from sim.simulate import simulate
    from simhelpers import make_workload
    c = simulate(sc, workload=make_workload(np.linspace(0, 2, 20), 100, 200))
    assert c.requests["finish_s"].tolist() != a.requests["finish_s"].tolist()


@pytest.mark.parametrize("engine, says", [
    ({"scheduler": "static", "speculative": spec(0.5)}, "the static scheduler has no speculative decoding"),
    ({"speculative": spec(0.5, method="medusa")}, "'medusa' is not one of draft, eagle, mtp, ngram"),
    ({"speculative": spec([0.5, 0.4])}, "2 values for num_speculative_tokens 3"),
    ({"speculative": spec(1.5)}, "acceptance_rate"),
    ({"speculative": spec(0.5, method="draft")}, "method draft needs the draft model"),
    ({"speculative": spec(0.5, draft_model="llama-2-7b")}, "only method draft takes a draft model"),
    ({"speculative": spec(0.5, method="draft", draft_model="gpt-9")}, "unknown preset 'gpt-9'"),
    ({"speculative": {"method": "eagle"}}, "num_speculative_tokens"),
])
def test_bad_speculative_config_is_one_clear_error(engine, says):
    with pytest.raises(ScenarioError) as e:
        make_scenario(**engine)
    assert says in str(e.value) and "engine.speculative" in str(e.value)


def test_a_draft_model_is_priced_with_its_own_cost_model():
    sc = make_scenario(cost_model="roofline", scheduler="chunked",
                       speculative=spec(0.7, method="draft", draft_model="llama-2-7b"))
    r = run([0.0], 100, 50, scheduler="chunked", cost_model="roofline",
            speculative=spec(0.7, method="draft", draft_model="llama-2-7b"))
    assert r.requests["finish_s"].notna().all()
    stats = BatchStats(prefill_lens=np.full(4, 4), prefill_contexts=np.full(4, 100), draft_seqs=4,
                       draft_context_sum=400)
    assert cost_model(sc).step_times(stats)[0] > cost_model(make_scenario(cost_model="roofline")).step_times(stats)[0]


def test_a_measured_draft_is_priced_by_its_kernel_time_alone():
    """The draft runs inside the target's iteration: the engine overheads (per-iteration terms,
    host floor) count once, on the target, not again for the draft."""
    from sim.cost.batch import BatchStats as Stats
    from sim.cost.registry import default_cost_model
    from sim.presets.hardware import HARDWARE_PRESETS
    from sim.presets.models import MODEL_PRESETS
    sc = make_scenario(cost_model=None, scheduler="chunked",
                       speculative=spec(0.7, method="draft", draft_model="llama-2-7b"))
    assert sc.cost_model.overheads.per_iteration_s > 0  # the fitted default adds per iteration
    draft = cost_model(sc).draft_cost
    bare = default_cost_model(MODEL_PRESETS["llama-2-7b"], HARDWARE_PRESETS["h100-sxm"], 1)
    stats = Stats(num_decodes=4, decode_context_sum=400)
    assert draft.step_times(stats)[0] == pytest.approx(
        bare.build(MODEL_PRESETS["llama-2-7b"], HARDWARE_PRESETS["h100-sxm"], 1).step_times(stats)[0]
        - bare.overheads.per_iteration_s, rel=1e-12)
