"""The claims audit (sim/reporting/claims/): exact toy numbers, lower bounds, KV arithmetic, verdicts, and
docs/claims.md being what the generator writes."""
import math
import random
from pathlib import Path

import numpy as np
import pytest

from sim.presets.models import MODEL_PRESETS
from sim.reporting import claims

DOCS = Path(__file__).resolve().parents[2] / "docs" / "claims.md"


def figures(claim):
    return {f.label: f.simulated for f in claim.figures}


# ------------------------------------------------------------------ toy traces and exact numbers

def test_toy_traces_hold_the_generated_lengths():
    random.seed(0)
    assert claims.trace_lengths("toy8.csv").tolist() == [random.randint(50, 800) for _ in range(8)]
    expected = np.random.default_rng(0).integers(50, 800, size=20)
    assert claims.trace_lengths("toy20.csv").tolist() == expected.tolist()


def test_toy8_static_and_continuous_both_take_573_iterations():
    c = claims.toy_random_seed0()
    f = figures(c)
    assert f["static: iterations"] == f["continuous: iterations"] == 573
    assert f["static: slot utilisation"] == f["continuous: slot utilisation"] == pytest.approx(3274 / (8 * 573))
    assert round(100 * f["static: slot utilisation"], 1) == 71.4
    assert f["lower bound, any scheduler: max(longest, ceil(sum / 8))"] == 573
    assert c.verdict == "does not hold"


def test_toy20_static_2216_vs_continuous_1490():
    f = figures(claims.toy_default_rng())
    assert f["static (batches of 8, 8, 4): iterations"] == 2216 == 687 + 778 + 751
    assert f["continuous: iterations"] == 1490
    assert f["continuous: slot utilisation"] == pytest.approx(9045 / (8 * 1490))
    assert round(100 * f["continuous: slot utilisation"], 1) == 75.9
    assert f["lower bound, any scheduler: max(longest, ceil(sum / 8))"] == 1131


def test_fixed_lengths_500_vs_500():
    f = figures(claims.toy_fixed_lengths())
    assert f["static: iterations"] == f["continuous: iterations"] == 500
    assert f["static / continuous"] == 1.0
    assert f["lower bound: 100 x 50 / 10"] == 500


def test_lower_bound_steps():
    assert claims.lower_bound_steps([444, 480, 91, 315, 573, 547, 464, 360], 8) == 573   # longest binds
    assert claims.lower_bound_steps([50] * 100, 10) == 500                               # throughput binds
    assert claims.lower_bound_steps([1, 1, 1], 2) == 2                                   # ceil(3 / 2)
    # the printed numbers fall below the bounds
    assert 400 < claims.lower_bound_steps(claims.trace_lengths("toy8.csv"), 8)
    assert 395 < claims.lower_bound_steps(claims.trace_lengths("toy20.csv"), 8) == math.ceil(9045 / 8)


# ------------------------------------------------------------------ analytic helpers

def test_expected_static_utilization():
    assert claims.expected_static_utilization(50, 800, 1) == pytest.approx(1.0)
    # lengths 1 or 2, B = 2: E[max] = 1 + P(max > 1) = 1.75, E[mean] = 1.5
    assert claims.expected_static_utilization(1, 2, 2) == pytest.approx(1.5 / 1.75)
    # uniform on 1..N with N large tends to (B + 1) / (2B)
    for b in (2, 8, 32):
        assert claims.expected_static_utilization(1, 100_000, b) == pytest.approx((b + 1) / (2 * b), rel=1e-3)
    # 50..800 never reaches 50%: the limit is (50 + 800) / 1600
    assert claims.expected_static_utilization(50, 800, 10_000) > 850 / 1600 - 1e-3


def test_paged_tail_waste():
    assert claims.paged_tail_waste([16], [1], 16) == 0.0                  # exactly one full block
    assert claims.paged_tail_waste([1], [1], 16) == pytest.approx(15 / 16)
    # a request growing from 1 to 32 tokens: each iteration holds c tokens in ceil(c / 16) blocks
    held, slots = sum(range(1, 33)), sum(16 * math.ceil(c / 16) for c in range(1, 33))
    assert claims.paged_tail_waste([1], [32], 16) == pytest.approx(1 - held / slots)


# ------------------------------------------------------------------ KV bytes arithmetic

def test_kv_bytes_per_token_arithmetic():
    l7, l70 = MODEL_PRESETS["llama-2-7b"], MODEL_PRESETS["llama-2-70b"]
    assert claims.kv_bytes_per_token(l7) == 2 * 32 * 4096 * 2 == 512 * 1024
    assert claims.kv_bytes_per_token(l7) // l7.num_layers == 16 * 1024          # "16 KB": one layer
    assert claims.kv_bytes_per_token(l70) == 2 * 80 * 8 * 128 * 2 == 320 * 1024
    assert claims.kv_bytes_per_token(l70) * 4096 == 1.25 * 2**30
    f = figures(claims.kv_70b_40gb())
    assert f["GQA: batch of 32 such sequences"] == 40.0
    assert f["MHA (64 KV heads): one 4096-token sequence"] == 10.0
    assert f["MHA: batch of 4 such sequences"] == 40.0
    assert figures(claims.kv_16kb_per_token())["whole model / claim"] == 32.0


# ------------------------------------------------------------------ every claim, short run

@pytest.fixture(scope="module")
def short_claims():
    return claims.run_all(short=True)


def test_every_claim_has_an_allowed_verdict_and_a_full_record(short_claims):
    assert len(short_claims) == len(claims.CLAIMS)
    assert len({c.key for c in short_claims}) == len(short_claims)
    for c in short_claims:
        assert c.verdict in claims.VERDICTS, c.key
        assert c.claim and c.setting and c.conditions and c.figures, c.key
        assert c.basis in (claims.UNIT, claims.ESTIMATE, claims.ARITHMETIC), c.key
        assert all(np.isfinite(f.simulated) for f in c.figures), c.key
        # the setting names model, GPU and cost model
        assert "h100-sxm" in c.setting or c.basis == claims.ARITHMETIC, c.key
        assert c.basis != claims.ESTIMATE or "roofline" in c.setting, c.key


def test_short_render_names_every_claim(short_claims):
    text = claims.render(short_claims, short=True)
    assert "short run" in text
    for c in short_claims:
        assert f'<a id="{c.key}"></a>' in text and c.verdict in text


# ------------------------------------------------------------------ docs/claims.md is generated

def test_docs_claims_md_is_the_full_run_of_the_generator():
    text = DOCS.read_text()
    assert "short run" not in text
    assert "not measured on hardware" in text
    # the cheap claims re-rendered now must appear verbatim (the rest run for ~40 s)
    for fn in (claims.toy_random_seed0, claims.toy_default_rng, claims.toy_fixed_lengths,
               claims.uniform_static_utilization, claims.kv_16kb_per_token, claims.kv_70b_40gb):
        assert claims.render_claim(fn()) in text, f"docs/claims.md is stale ({fn.__name__}): " \
            "regenerate with python -m sim.reporting.claims --out docs/claims.md"
    assert text.count('<a id="') == len(claims.CLAIMS)


def test_python_m_sim_claims_writes_what_render_returns(tmp_path, short_claims):
    from sim.reporting.claims.__main__ import main
    out = tmp_path / "claims.md"
    main(["--out", str(out), "--short"])
    assert out.read_text() == claims.render(short_claims, short=True)
