"""Planning: questions answered by many simulations. `servesim sweep` (a grid of scenario variants,
run in parallel, resumable) and `servesim plan` (the highest load meeting an SLO, the best engine
setting, the replicas and their cost). Built on the simulator core in sim/, never inside it."""
