"""The README's worked plan is what `servesim plan` prints now (bench/readme_example.py)."""
from __future__ import annotations

from tests.simhelpers import bench_script


def _example():
    return bench_script("readme_example")


def test_the_readmes_worked_plan_is_what_the_plan_prints_now():
    ex = _example()
    quoted = ex.quoted(ex.README.read_text())
    assert quoted is not None, "README.md lost its worked-plan block"
    assert quoted == ex.excerpt(ex.run_plan()), "README.md's worked plan is stale: python bench/readme_example.py --write"


def test_the_excerpt_reads_its_numbers_from_plan_json():
    """Hand-made plan.json values come out where the README shows them (so a stale block is caught
    by the comparison above, not hidden by a formatter that ignores its input)."""
    ex = _example()
    plan = {"slo_label": "p99 TTFT <= 1 ms", "load_search": {"unit": "req/s", "answer": 1.234},
            "recommendation": {"max_num_seqs": 7, "max_num_batched_tokens": 99, "per_replica_load": 2.5,
                               "vllm_serve": "vllm serve x"},
            "cluster": {"target": 3.0, "replicas": 2, "point": {"passes": 3, "seeds": 4}},
            "band": {"slower": 1.25, "faster": 0.5, "steps_slower": {"answer": 2.0}, "steps_faster": {"answer": 5.0}},
            "cost": {"usd_per_hour": 6.0, "usd_per_million_output_tokens": 0.1234}}
    text = ex.excerpt(plan)
    assert "1.23 req/s per replica" in text and "max_num_seqs 7, max_num_batched_tokens 99: 2.50 req/s" in text
    assert "replicas for 3.00 req/s" in text and "2, the whole cluster simulated (3/4 seeds meet)" in text
    assert "2.00 req/s if real steps take +25.0%, 5.00 if -50.0%" in text
    assert "$6.00/hour, $0.123 per million" in text and text.endswith("vllm serve x")
