"""servesim's version, from the installed package metadata (pyproject.toml is the one source)."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("servesim")
except PackageNotFoundError:  # run from a source tree that was never pip-installed
    __version__ = "0+unknown"
