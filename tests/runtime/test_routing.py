"""engine.routing (sim/config/routing.py): routers that read stale signals, and the weighted
scorer rule (sim/runtime/routers.Weighted), on timelines and scores computed by hand. Unit step
costs: every iteration takes 1 s."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import yaml

import servesim
from sim.config.errors import ScenarioError
from sim.config.routing import RoutingConfig
from sim.runtime.routers import Weighted
from sim.simulate import simulate
from sim.workload.generators import Workload
from simhelpers import make_scenario, run


@pytest.mark.parametrize("ff", [True, False])
def test_a_stale_router_routes_on_the_old_signal(ff):
    """least_loaded, 2 replicas, each request 1 prompt token and 10 output tokens (a 10 s stay).
    Exact signals: 0 -> replica 0; 0.5: loads (1, 0) -> 1; 1.0: (1, 1) -> 0; 1.5: (2, 1) -> 1;
    2.5: (2, 2) -> 0. Scraped every 2 s (at 0, 2, 4, ...): the arrivals at 0 .. 1.5 all read the
    scrape at 0, loads (0, 0), and go to replica 0 (ties: the lower index); the one at 2.5 reads the
    scrape at 2, loads (4, 0), and goes to replica 1."""
    arrival, engine = [0.0, 0.5, 1.0, 1.5, 2.5], dict(scheduler="continuous", max_num_seqs=8, replicas=2,
                                                      router="least_loaded", fast_forward=ff)
    exact = run(arrival, 1, 10, **engine)
    stale = run(arrival, 1, 10, routing={"staleness_s": 2.0}, **engine)
    assert exact.requests["replica"].tolist() == [0, 1, 0, 1, 0]
    assert stale.requests["replica"].tolist() == [0, 0, 0, 0, 1]
    # replica 0: request 0 prefills on [0, 1]; 1 (0.5) and 2 (1.0, at the boundary) join [1, 2];
    # 3 (1.5) joins [2, 3]; replica 1 is idle when 4 comes: [2.5, 3.5]. Then 9 decode steps each.
    assert stale.requests["first_token_s"].tolist() == [1.0, 2.0, 2.0, 3.0, 3.5]
    assert stale.requests["finish_s"].tolist() == [10.0, 11.0, 11.0, 12.0, 12.5]


def test_a_scrape_that_never_comes_again_sends_everything_to_one_replica():
    """Staleness longer than the run: every arrival reads the scrape at 0 (all idle) -> replica 0,
    open loop and closed loop alike."""
    lengths = {"prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 4}}
    w = {"arrival": {"process": "poisson", "rate": 4.0}, "num_requests": 40, **lengths}
    engine = dict(scheduler="continuous", max_num_seqs=64, replicas=3, router="least_loaded",
                  routing={"staleness_s": 1e6})
    assert set(simulate(make_scenario(workload=w, **engine)).requests["replica"]) == {0}
    users = {"arrival": {"process": "closed_loop", "users": 4, "think_time": 0.5}, "num_requests": 40, **lengths}
    closed = simulate(make_scenario(workload=users, **engine))
    assert closed.summary["completed"] == 40 and set(closed.requests["replica"]) == {0}
    spread = simulate(make_scenario(workload=users, **{**engine, "routing": {"staleness_s": 0.0}}))
    assert len(set(spread.requests["replica"])) > 1


def _signals(hits: list[int], usage: list[float], prompt: int, block_size: int = 16):
    """Stand-in Signals: caches holding `hits` blocks of every prompt, KV usage as given."""
    class Cache:
        def __init__(self, hit):
            self.hit, self.prompt, self.block_size = hit, [prompt], block_size

        def lookup(self, rid, num_tokens):
            return [0] * self.hit

    return SimpleNamespace(caches=[Cache(h) for h in hits], kv_usage=lambda: usage)


def test_weighted_scores_by_hand():
    """loads (4, 2, 0), KV usage (0.5, 0.25, 0), replica 0 holds 3 of the prompt's 4 full blocks
    (64 tokens, block 16; 70 tokens have 4 full blocks too):
      prefix_affinity  (0.75, 0, 0)
      queue_depth      min-max over loads: ((4-4)/4, (4-2)/4, (4-0)/4) = (0, 0.5, 1)
      kv_utilization   1 - usage: (0.5, 0.75, 1)
    default weights 3/2/2: (2.25 + 0 + 1, 0 + 1 + 1.5, 0 + 2 + 2) = (3.25, 2.5, 4) -> replica 2;
    prefix_affinity 10: (7.5 + 1, 2.5, 4) = (8.5, 2.5, 4) -> replica 0."""
    for prompt in (64, 70):
        rule = Weighted(3)
        rule.attach(_signals([3, 0, 0], [0.5, 0.25, 0.0], prompt))
        assert rule.scores(0, [4, 2, 0]) == [3.25, 2.5, 4.0]
        assert rule.choose(0, [4, 2, 0]) == 2
        heavy = Weighted(3, RoutingConfig(weights=(("prefix_affinity", 10.0), ("queue_depth", 2.0),
                                                   ("kv_utilization", 2.0))))
        heavy.attach(_signals([3, 0, 0], [0.5, 0.25, 0.0], prompt))
        assert heavy.scores(0, [4, 2, 0]) == [8.5, 2.5, 4.0]
        assert heavy.choose(0, [4, 2, 0]) == 0
    even = Weighted(2)  # equal loads score 1 each; nothing cached; ties: the lower index
    even.attach(_signals([0, 0], [0.0, 0.0], 64))
    assert even.scores(0, [3, 3]) == [4.0, 4.0] and even.choose(0, [3, 3]) == 0
    short = Weighted(2)  # a prompt shorter than a block: no prefix score anywhere
    short.attach(_signals([0, 0], [0.5, 0.0], 10))
    assert short.scores(0, [1, 1]) == [3.0, 4.0]


def test_weighted_follows_the_cached_prefix_in_a_run():
    """The prefix_aware test's workload (tests/kv/test_prefix_cache._routed): 8 requests 10 s apart
    (each done before the next), prompts of 14 tokens whose first 12 (3 blocks of 4) are a system
    prompt A A B B A A B B, 2 replicas. With everything idle, queue and KV scores tie at each
    arrival, so prefix_affinity decides: 0 -> replica 0 (all tie); 1 finds A there; 2 (B, cached
    nowhere, a tie) -> 0; every later one finds its prefix on replica 0: prefix_aware's choices and
    hits (6 x 12 tokens of 8 x 14), where round_robin hits 4 x 12."""
    groups = ["A", "A", "B", "B", "A", "A", "B", "B"]
    w = Workload(arrival_s=np.arange(8) * 10.0, prompt_tokens=np.full(8, 14), output_tokens=np.full(8, 2),
                 priority=np.zeros(8, np.int64), prefix=[(((g,),), 12) for g in groups])
    sc = make_scenario(scheduler="chunked", block_size=4, max_num_seqs=8, max_num_batched_tokens=64,
                       replicas=2, router="weighted")
    r = simulate(sc, workload=w)
    assert r.requests["replica"].tolist() == [0] * 8
    assert r.summary["prefix_cache_hit_rate"] == 6 * 12 / (8 * 14)


def test_weighted_spreads_load_that_shares_nothing():
    """No prefix caching, queue_depth alone: the least loaded wins, ties to the lower index,
    exactly least_loaded's choices (tests/runtime/test_sim_engine: 0, 1, 0, 1, 0, 0)."""
    engine = dict(scheduler="continuous", max_num_seqs=8, replicas=2)
    out = [2, 10, 10, 10, 10, 10]
    weighted = run([0.0, 0.0, 0.0, 0.0, 2.5, 2.5], 1, out, router="weighted",
                   routing={"weights": {"queue_depth": 1}}, **engine)
    assert weighted.requests["replica"].tolist() == [0, 1, 0, 1, 0, 0]


def test_weighted_routes_an_autoscaled_fleet(tmp_path):
    """The weighted rule over an autoscaled fleet's serving replicas (their signals only): every
    request served, and none on a replica before it serves (cold start 20 s from t=10)."""
    rows = ["0,1,60"] * 30 + ["40,1,10"] * 30
    (tmp_path / "t.csv").write_text("arrival_s,prompt_tokens,output_tokens\n" + "\n".join(rows) + "\n")
    raw = {"name": "fleet", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "unit",
           "engine": {"scheduler": "continuous", "max_num_seqs": 64, "router": "weighted",
                      "routing": {"staleness_s": 0.5},
                      "autoscaling": {"max_replicas": 3, "target_in_flight": 20, "interval_s": 10,
                                      "cold_start_s": 20}},
           "workload": {"trace": "t.csv"}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    result = servesim.run(str(tmp_path / "s.yaml"))
    rq = result.requests
    assert result.summary["completed"] == 60
    assert (rq["replica"][:30] == 0).all()             # before t=30 only replica 0 serves
    assert set(rq["replica"][30:]) == {1}              # at 40: replica 1 (idle, empty) scores highest
    assert result.summary["run"]["engine"]["routing"]["staleness_s"] == 0.5


@pytest.mark.parametrize("routing, router, message", [
    ({"weights": {"queue_depth": 1}}, "least_loaded", "engine.routing.weights: only the weighted router reads weights"),
    ({"weights": {"queue": 1}}, "weighted", "engine.routing.weights.queue: unknown key"),
    ({"weights": {"queue_depth": 0}}, "weighted", "engine.routing.weights: no scorer has a weight above 0"),
    ({"weights": {"queue_depth": -1}}, "weighted", "engine.routing.weights.queue_depth"),
    ({"staleness_s": 1e-4}, "least_loaded", "engine.routing.staleness_s: 0.0001 s; 0 (exact signals) or at least"),
    ({"staleness_s": -1}, "least_loaded", "engine.routing.staleness_s"),
    ({"stale": 1}, "least_loaded", "engine.routing.stale: unknown key"),
])
def test_routing_mistakes_are_refused(routing, router, message):
    with pytest.raises(ScenarioError, match=message.replace(".", r"\.").replace("(", r"\(").replace(")", r"\)")):
        make_scenario(replicas=2, router=router, routing=routing)


def test_stale_signals_with_disaggregated_pools_are_refused():
    with pytest.raises(ScenarioError, match="routing.staleness_s: stale routing signals with disaggregated"):
        make_scenario(scheduler="chunked", router="least_loaded", routing={"staleness_s": 0.05},
                      disaggregation={"prefill_replicas": 1, "decode_replicas": 2})


@pytest.mark.parametrize("router", ["least_loaded", "weighted"])
def test_a_run_with_routing_settings_reloads_as_the_same_run(tmp_path, router):
    """scenario.yaml of a run (weights written only for the weighted rule) simulates the same run."""
    w = {"arrival": {"process": "poisson", "rate": 20.0}, "num_requests": 60,
         "prompt_tokens": {"dist": "fixed", "value": 64}, "output_tokens": {"dist": "fixed", "value": 8}}
    raw = {"name": "r", "model": "llama-3-8b", "hardware": "h100-sxm", "cost_model": "roofline", "workload": w,
           "engine": {"replicas": 3, "router": router, "routing": {"staleness_s": 0.05}}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(raw))
    first = servesim.run(str(tmp_path / "s.yaml"))
    first.write(tmp_path / "out")
    again = servesim.run(str(tmp_path / "out" / "scenario.yaml"))
    assert again.requests["replica"].tolist() == first.requests["replica"].tolist()
    assert again.requests["finish_s"].tolist() == first.requests["finish_s"].tolist()
    written = first.summary["run"]["engine"]["routing"]
    assert written == ({"staleness_s": 0.05, "weights": {"prefix_affinity": 3.0, "queue_depth": 2.0,
                                                         "kv_utilization": 2.0}}
                       if router == "weighted" else {"staleness_s": 0.05})


@pytest.mark.parametrize("ff", [True, False])
def test_a_scrape_sees_the_iterations_that_end_at_its_instant(ff):
    """Scrapes at 0, 2, 4 ...; A (arriving at 0, 2 output tokens) runs on replica 0 and ends at
    2.0 exactly. C arrives at 2.0 and reads the scrape at 2.0, taken after A's last iteration:
    both replicas empty, the tie goes to replica 0 (a scrape taken before A's end would show
    replica 0 busy and send C to replica 1)."""
    r = run([0.0, 2.0], 1, [2, 3], scheduler="continuous", max_num_seqs=8, replicas=2, router="least_loaded",
            routing={"staleness_s": 2.0}, fast_forward=ff)
    assert r.requests["finish_s"].tolist()[0] == 2.0
    assert r.requests["replica"].tolist() == [0, 0]


def test_scrapes_skip_the_clock_no_arrival_reads(monkeypatch):
    """Every 1 ms over arrivals 1e6 s apart (open loop) or after 1e7 s of thinking (closed loop):
    a scrape per arrival and per millisecond of work, not 1e9 or 1e10 of them."""
    from sim.runtime.routers import Signals

    scrapes = []
    real = Signals.scrape
    monkeypatch.setattr(Signals, "scrape", lambda self: (scrapes.append(1), real(self))[1])
    fixed = {"prompt_tokens": {"dist": "fixed", "value": 8}, "output_tokens": {"dist": "fixed", "value": 4}}
    engine = dict(scheduler="continuous", max_num_seqs=8, replicas=2, router="least_loaded",
                  routing={"staleness_s": 0.001}, cost_model="roofline")
    sparse = {"arrival": {"process": "constant", "rate": 1e-6}, "num_requests": 4, **fixed}
    r = simulate(make_scenario(workload=sparse, **engine))
    assert r.summary["completed"] == 4 and len(scrapes) < 200
    scrapes.clear()
    users = {"arrival": {"process": "closed_loop", "users": 2, "think_time": 1e7, "think_dist": "fixed"},
             "num_requests": 6, **fixed}
    r = simulate(make_scenario(workload=users, **engine))
    assert r.summary["completed"] == 6 and len(scrapes) < 2000
