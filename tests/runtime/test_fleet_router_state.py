"""Under autoscaling a routing rule keeps its own state while the serving set it routes over lasts
(issue 49: FleetRouter built a fresh rule on every arrival, dropping a policy's state)."""
from __future__ import annotations

from sim.runtime.autoscaler import FleetRouter


class Counting:
    """A plug-in rule with state: it sends the k-th request it routes to replica k mod n."""
    made = 0

    def __init__(self, n):
        self.n, self.seen = n, 0
        Counting.made += 1

    def attach(self, signals):
        pass

    def plan(self, num_requests):
        return None

    def choose(self, rid, loads):
        self.seen += 1
        return (self.seen - 1) % self.n


class Fleet:
    serving = [0, 1, 2]


def test_a_rules_state_lives_as_long_as_its_serving_set():
    fleet = Fleet()
    router = FleetRouter(Counting, fleet)
    picks = [router.choose(rid, [0, 0, 0, 0]) for rid in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2] and Counting.made == 1   # one rule, its counter kept
    fleet.serving = [0, 3]
    assert [router.choose(rid, [0, 0, 0, 0]) for rid in range(3)] == [0, 3, 0]
    fleet.serving = [0, 1, 2]  # back to the first set: its rule, state and all
    assert router.choose(9, [0, 0, 0, 0]) == 0 and router.rules[(0, 1, 2)].seen == 7
