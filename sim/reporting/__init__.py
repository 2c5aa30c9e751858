"""Reporting: what is drawn and told from run folders. Plots (`servesim plot`), the analysis of run
folders they read, and the claims audit (`python -m sim.reporting.claims`). Reads run outputs and
calls the simulator core; the core never imports it."""
