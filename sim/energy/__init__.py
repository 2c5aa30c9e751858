"""Energy and power of a run: what its GPUs, hosts and facility draw, and what that costs
(sim/energy/power.py)."""
