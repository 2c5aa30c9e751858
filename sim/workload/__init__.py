"""What arrives and when: generated load, trace readers, multi-turn sessions and the per-request
arrays the run fills in."""
