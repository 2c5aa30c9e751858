"""servesim's simulator: pure Python + numpy + SimPy (never torch or triton)."""
