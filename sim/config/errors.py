"""The one exception type users see: a bad scenario, trace or option, said in one line."""


class ServesimWarning(UserWarning):
    """Something the user should know about their input that does not stop the run (e.g. arrivals
    drawn from a benchmark's request rate); the CLI prints it as one `warning: ...` line."""


class ScenarioError(ValueError):
    """Bad user input. The message is one line naming the file, the key path (or trace line) and
    what is allowed; the CLI prints it and exits with code 2, no traceback."""
