"""Features as plug-ins (issue 49): each one a sub-package whose `FEATURE` object meets the
`Feature` contract (sim/features/contract.py), listed once in sim/features/registry.py. The
scenario parser, the builder, `simulate()` and `servesim run` loop over the registry instead of
branching on each feature; a feature's conflicts with the rest of the scenario are data
(`Rule`s) that the parser checks and docs/features.md prints."""
