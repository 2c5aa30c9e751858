"""Calibration backend: a real model step on a paged KV cache (model.py), timed over a grid of
batch shapes (harness.py) and fitted into a step-cost profile YAML (fit.py) that sim/cost.py reads.

Needs torch (and triton on CUDA); sim/ never imports this package."""
