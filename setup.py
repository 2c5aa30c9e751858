"""Build step: the simulator's hot loop compiled by mypyc (from mypy), the same Python source made
into C extensions beside it, ~1.7x faster here (bench/against.py pure). Everything else is pyproject.toml.

The .py files stay the reference. Without a working C compiler the build goes on and servesim runs
them as they are; SERVESIM_PURE_PYTHON=1 runs them where the extensions are built; a module edited
after the build makes servesim run the source, with a warning, until `pip install -e .` rebuilds
(sim/__init__.py, from the digests written below). tests/test_compiled.py holds both to the same
bytes. SERVESIM_NO_COMPILE=1 at install builds nothing.
"""
import hashlib
import os
from pathlib import Path

from setuptools import setup

# The modules of one simulated iteration (docs/simulator.md): each must pass mypy (pyproject's
# [tool.mypy]), since mypyc enforces their annotations at run time.
HOT = [
    "sim/runtime/engine.py",
    "sim/runtime/fast_forward.py",
    "sim/runtime/recorder.py",
    "sim/runtime/cluster.py",
    "sim/schedulers/iteration_level.py",
    "sim/schedulers/decode_pool.py",
    "sim/schedulers/window.py",
    "sim/schedulers/chunked.py",
    "sim/schedulers/continuous.py",
    "sim/kv/prefix_cache.py",
    "sim/cost/step_cost.py",
    "sim/cost/table_cost.py",
]
DIGESTS = Path("sim/_compiled_sources.py")  # (generated, git-ignored)


def compiled():
    if os.environ.get("SERVESIM_NO_COMPILE"):
        DIGESTS.unlink(missing_ok=True)
        return []
    from mypyc.build import mypycify
    extensions = mypycify(HOT, opt_level="3")
    for ext in extensions:
        ext.optional = True  # no working C compiler: a warning, and the pure-Python modules run
        if os.name != "nt":
            # a * b + c stays two roundings, as in Python: a C compiler may otherwise fuse it into
            # one FMA where the target has one (GCC does by default on arm64), and the compiled
            # floats would differ from the source's (tests/test_compiled.py)
            ext.extra_compile_args = [*ext.extra_compile_args, "-ffp-contract=off"]
    digests = {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in HOT}
    DIGESTS.write_text('"""Written by setup.py: the sources its extensions were compiled from."""\n'
                       f"SHA256 = {digests!r}\n")
    return extensions


setup(ext_modules=compiled())
