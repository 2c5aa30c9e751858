"""The commands of `servesim`, each as what it is asked (a frozen request whose fields carry their
command-line spelling: sim/config/options.py) and what it does with it (a function that prints
through sim/reporting/console.py and ends in ScenarioError, exit 2, or CommandFailed, its own code).
`cli.py` only declares them to typer. A module here imports the simulator inside its function, not
at the top, so that building the command line (every `servesim` call, `--help` too) stays light."""
