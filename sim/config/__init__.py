"""The scenario's sections as plain, validated data (engine.speculative, disaggregation,
autoscaling, admission, routing, lora), the checks every reader shares, the one error type users
see and the command-line options' metadata. Nothing here imports anything above
sim/config/checks.py: the Scenario that is made of these sections, and checks names against the
plug-ins' registries, is sim/scenario.py; nothing here builds a replica or a cost model
(sim/build.py does)."""
