"""Calibration backend: a real model step on a paged KV cache (model.py), timed (timing.py) over a
grid of batch shapes (grid.py) and fitted into a step-cost profile YAML (fit.py) that sim/cost/registry.py
reads; harness.py runs the whole pipeline.

Needs torch (and triton on CUDA); sim/ never imports this package."""
