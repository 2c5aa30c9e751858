"""docs/planner.md's bundled answers are what the five commands print now (bench/docs_figures.py)."""
from __future__ import annotations

from tests.simhelpers import bench_script


def _script():
    return bench_script("docs_figures")


def test_the_bundled_answers_table_is_what_the_plans_print_now():
    m = _script()
    quoted = m.quoted(m.DOC.read_text())
    assert quoted is not None, "docs/planner.md lost its bundled-answers block"
    new = m.table({c: m.run(c) for c in m.COMMANDS})
    stale = [line for line in new.splitlines() if line not in quoted.splitlines()]
    assert not stale, f"docs/planner.md's bundled answers are stale (python bench/docs_figures.py --write): {stale}"
    assert quoted == new


def test_a_row_reads_its_numbers_from_plan_json_and_search_json():
    """Hand-made plan.json / search.json values come out where the table shows them (so a stale row
    is caught by the comparison above, not hidden by a formatter that ignores its input)."""
    m = _script()
    curve = {"max_num_seqs": [{"max_num_seqs": 8, "sustained": 1.234}, {"max_num_seqs": 16, "sustained": 2.5}],
             "max_num_batched_tokens": [{"max_num_batched_tokens": 512, "sustained": 3.456}]}
    plan = {"load_search": {"unit": "req/s", "knob": "workload.arrival.rate", "answer": 2.5,
                            "estimate": {"load": 2.61, "interval_90": [2.551, 2.704]}},
            "recommendation": {"max_num_seqs": 16, "max_num_batched_tokens": 512, "per_replica_load": 3.456},
            "tradeoff": curve, "band": {"slower": 1.25, "faster": 0.5, "steps_slower": {"answer": 2.0},
                                        "steps_faster": {"answer": 5.0}},
            "cluster": {"target": 7.0, "replicas": 3, "point": {"bettable": {"probability": 0.934}}},
            "cost": {"usd_per_hour": 9.0, "usd_per_million_output_tokens": 0.1234}, "simulations": 41}
    text = m.plan_answer(plan)
    for piece in ("**2.50 req/s per replica**", "estimate 2.61 (2.55-2.70)",
                  "(max_num_seqs): 8: 1.23, 16: 2.50; (max_num_batched_tokens): 512: 3.46",
                  "chosen 16 / 512, **3.46 req/s**", "error band 2.00 req/s if real steps take +25.0%, 5.00 if -50.0%",
                  "3 replicas for 7.00 req/s", "P ~ 0.93", "$9.00/hour, $0.123 per million output tokens; 41 simulations"):
        assert piece in text, (piece, text)
    users = dict(plan, load_search={"unit": "users", "knob": "workload.arrival.users", "answer": 126})
    assert m.plan_answer(users).startswith("**126 users per replica** with the scenario's setting;")
    search = {"chosen": {"gpu": "h100-sxm", "gpus": 36, "replicas": 9, "tensor_parallel_size": 4, "usd_per_hour": 108.0},
              "candidates": [{"gpu": "h200", "tensor_parallel_size": 8, "status": "confirmed", "replicas": 2,
                              "usd_per_hour": 60.8, "cluster": {"point": {"bettable": {"probability": 0.5}}}},
                             {"gpu": "a100-80gb", "tensor_parallel_size": 2, "status": "dearer: x"}],
              "simulations": 250}
    assert m.search_answer(search) == ("**h100-sxm x 36 (9 replicas of TP4), $108.00/hour**; confirmed: h200 TP8 at 2 "
                                       "replicas ($60.80/hour, P ~ 0.50); 250 simulations")
