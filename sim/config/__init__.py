"""A scenario as plain, validated data: the YAML sections (engine, SLO, speculative decoding,
disaggregated pools), the checks every reader shares and the one error type users see. Nothing
here builds a replica or a cost model (sim/build.py does)."""
