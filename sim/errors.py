"""The one exception type users see: a bad scenario, trace or option, said in one line."""


class ScenarioError(ValueError):
    """Bad user input. The message is one line naming the file, the key path (or trace line) and
    what is allowed; the CLI prints it and exits with code 2, no traceback."""
