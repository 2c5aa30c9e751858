"""The shape of sim/ (docs/simulator.md, "Layout"): layers that import only downward, no import
circle between any two modules, no torch or triton, and the lint and type checks CI holds the code to.

The import graph comes from grimp (the engine of import-linter): every `import` the source holds,
function-level ones included, `if TYPE_CHECKING:` ones excluded (annotations only, never run)."""
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]

# Highest first: a module may import from its own layer and the layers below it, never above.
# sim/scenario.py validates the plug-ins' names against their registries (schedulers, routers,
# cost models), so it sits above them; the config sections it is made of (sim/config/) sit at the bottom.
LAYERS = (
    "sim.commands",
    "sim.reporting",
    "sim.planning",
    "sim.simulate",
    "sim.build",
    "sim.scenario",
    "sim.features",
    "sim.runtime",
    "sim.schedulers",
    "sim.cost",
    "sim.workload",
    "sim.kv",
    "sim.config.speculative | sim.config.disaggregation | sim.config.autoscaling | sim.config.admission"
    " | sim.config.routing | sim.config.lora | sim.config.knobs",
    "sim.presets",
    "sim.files | sim.outputs",
    "sim.config.checks",
    "sim.config.errors | sim.config.options",
)


@pytest.fixture(scope="module")
def graph():
    return grimp.build_graph("sim", exclude_type_checking_imports=True, include_external_packages=True)


def test_layers_import_only_downward(graph):
    layers = [grimp.Layer(*(name.strip() for name in layer.split("|")), independent=False) for layer in LAYERS]
    illegal = graph.find_illegal_dependencies_for_layers(layers=layers)
    found = sorted(f"{d.importer} imports {d.imported}: " + "; ".join(
        f"{'/'.join(sorted(r.heads))} -> {' -> '.join((*r.middle, '/'.join(sorted(r.tails))))}" for r in d.routes)
        for d in illegal)
    assert not found, "imports that point up a layer:\n" + "\n".join(found)


def test_every_module_sits_in_a_layer(graph):
    """A new package or top-level module must be placed in LAYERS (else the layer test ignores it)."""
    named = [n.strip() for layer in LAYERS for n in layer.split("|")]
    outside = ("sim.version", "sim._compiled_sources", "sim.config")  # (sim.config: the package's docstring)
    loose = [m for m in graph.modules if m.startswith("sim.") and m not in outside
             and not any(m == n or m.startswith(n + ".") for n in named)]
    assert not loose, f"modules in no layer: {loose}"


def test_config_imports_nothing_above_it(graph):
    """sim/config/ is plain data: its modules import nothing of sim/ but sim/config/ itself (issue
    49: config/ once imported the cost, presets, runtime, schedulers and workload layers above it)."""
    config = {m for m in graph.modules if m == "sim.config" or m.startswith("sim.config.")}
    up = sorted(f"{m} imports {i}" for m in config for i in graph.find_modules_directly_imported_by(m)
                if i.startswith("sim") and i not in config)
    assert not up, "\n".join(up)


def test_functions_stay_short():
    """Issue 49's bounds, held: no function in sim/ over 80 lines, simulate() under 60 (a function
    that grew past them once assembled the summary branch by branch)."""
    import ast

    long = []
    for path in sorted((ROOT / "sim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                limit = 59 if (path.name, node.name) == ("simulate.py", "simulate") else 80
                if lines > limit:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {lines} lines (at most {limit})")
    assert not long, "\n".join(long)


def test_no_import_circle(graph):
    """No two modules import each other, however indirectly (a circle is what made 12 lazy imports
    necessary before the redesign)."""
    circles = []
    for module in sorted(m for m in graph.modules if m.startswith("sim")):
        for imported in graph.find_modules_directly_imported_by(module):
            if imported.startswith("sim") and imported != module and graph.chain_exists(imported, module):
                chain = graph.find_shortest_chain(imported, module)
                circles.append(f"{module} -> {' -> '.join(chain)}")
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_sim_never_imports_torch_or_triton(graph):
    for package in ("torch", "triton"):
        if package in graph.modules:
            assert not graph.find_downstream_modules(package) & {m for m in graph.modules if m.startswith("sim")}


def test_the_ruff_rules_hold():
    """ruff's rules as pyproject.toml [tool.ruff] sets them, over sim/, cli.py, calibrate/, kernels/,
    bench/ and tests/ (the pinned ruff of the test extra)."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' brings it")
    run = subprocess.run([ruff, "check", "--no-cache", "--quiet", "."], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_mypy_is_clean_over_sim_the_cli_and_the_api(tmp_path):
    """mypy with pyproject.toml's [tool.mypy] over every module of sim/, cli.py and servesim.py (not
    only the compiled ones, which setup.py checks as it compiles them)."""
    run = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path), "sim", "cli.py", "servesim.py"],
                         cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
