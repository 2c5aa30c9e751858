"""servesim's simulator: pure Python + numpy + SimPy (never torch or triton).

The modules of one simulated iteration are also compiled by mypyc at install (setup.py), and Python
then imports the extension built beside each .py. The .py files are the reference: they run instead
under SERVESIM_PURE_PYTHON=1, and whenever one of them differs from the source its extension was
built from (edited or checked out since: the extension would be stale), with a warning until
`pip install -e .` rebuilds. `compiled()` says which runs; tests/test_compiled.py holds both to the
same bytes.
"""
import hashlib
import os
import sys
import warnings
from importlib.machinery import SOURCE_SUFFIXES, FileFinder, SourceFileLoader
from pathlib import Path


class _SourceFirst:
    """A meta-path finder that finds sim's modules as their .py source only, so that no extension
    built beside one is imported."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if not name.startswith(__name__ + ".") or path is None:
            return None
        for entry in path:
            spec = FileFinder(entry, (SourceFileLoader, SOURCE_SUFFIXES)).find_spec(name, target)
            if spec is not None:
                return spec
        return None


def _edited(root: Path | None = None, digests: dict[str, str] | None = None) -> str | None:
    """A compiled module whose source is not the one its extension was built from, else None.
    `digests`: path under `root` -> SHA-256 of the source compiled (default: setup.py's record)."""
    if digests is None:
        try:
            from sim._compiled_sources import SHA256  # (written by setup.py when it compiles)
        except ImportError:
            return None  # nothing compiled
        digests = SHA256
    root = root or Path(__file__).resolve().parent.parent
    for path, digest in digests.items():
        source = root / path
        if not source.is_file() or hashlib.sha256(source.read_bytes()).hexdigest() != digest:
            return path
    return None


def _choose() -> None:
    if _SourceFirst in sys.meta_path:
        return
    if not os.environ.get("SERVESIM_PURE_PYTHON"):
        edited = _edited()
        if edited is None:
            return
        warnings.warn(f"servesim: {edited} changed since it was compiled: running the pure-Python "
                      f"simulator (`pip install -e .` compiles it again)", RuntimeWarning, stacklevel=3)
    sys.meta_path.insert(0, _SourceFirst)


_choose()


def compiled() -> bool:
    """Does this process run the mypyc-compiled simulator (else the pure-Python source)? Asked of
    the import system, which finds the engine's module without running it (`servesim --version`
    then imports neither numpy nor pandas)."""
    from importlib.util import find_spec

    spec = find_spec("sim.runtime.engine")
    return spec is not None and spec.origin is not None and not spec.origin.endswith(".py")
