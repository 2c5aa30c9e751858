#!/usr/bin/env bash
# The whole GPU session in one call: kernel tests, kernel bench, calibration of Llama-3-8B and the
# real half of a validation, every log and artifact under $OUT. Run from the repository root on
# the GPU machine (torch + triton + typer + rich, no simpy, nothing pip-installed):
#
#   bash calibrate/gpu_campaign.sh                  # all stages, within CAMPAIGN_BUDGET_S (570 s)
#   bash calibrate/gpu_campaign.sh calibrate validate   # some stages, in this order
#
# Stages: env, kernels (pytest tests/calibration/test_kernels.py tests/calibration/test_calibrate.py), bench
# (python3 -m bench.kernels), calibrate (cli.py calibrate --model llama-3-8b --device cuda),
# validate (cli.py validate scenarios/validate-llama3-8b-h100.yaml --real-only; uses the fresh
# profile when the calibrate stage wrote one). Each stage runs under `timeout`: its own cap, and
# never past the session budget minus a reserve for packing, so later stages still get time when an
# earlier one hangs.
#
# What comes back (the device tool returns at most 8 files, 2 folders deep), in $OUT:
#   SUMMARY.md                   stage, exit code, seconds, and the key lines of each log
#   campaign.tar.gz              everything: logs/, bench/*.csv, profile/h100-llama-3-8b.{yaml,csv},
#                                val-h100/real/* (the --real-only run), env.txt, junit XML
#   h100-llama-3-8b.yaml, .csv   the profile and its measurements, for calibrate/profiles/
# The archive is rewritten after every stage, so a call cut short still returns what finished.
#
# Afterwards, where simpy is installed (tar xzf campaign.tar.gz -C /tmp/h100):
#   servesim validate scenarios/validate-llama3-8b-h100.yaml \
#       --profile /tmp/h100/profile/h100-llama-3-8b.yaml --compare-only /tmp/h100/val-h100
set -u
cd "$(dirname "$0")/.."                       # the repository root
OUT=${OUT:-$PWD/campaign_out}
PY=${PYTHON:-python3}
BUDGET=${CAMPAIGN_BUDGET_S:-570}              # the device tool's per-call limit is 600 s
RESERVE=20                                    # seconds kept for packing after the last stage
MODEL=${CAMPAIGN_MODEL:-llama-3-8b}
DEVICE=${CAMPAIGN_DEVICE:-cuda}               # cpu + tiny + validate-tiny-cpu.yaml: a smoke test
SCENARIO=${CAMPAIGN_SCENARIO:-scenarios/validate-llama3-8b-h100.yaml}
STAGES=("$@")
[ ${#STAGES[@]} -eq 0 ] && STAGES=(env kernels bench calibrate validate)

WORK=$(mktemp -d /tmp/campaign.XXXXXX)
mkdir -p "$OUT" "$WORK/logs" "$WORK/bench" "$WORK/profile"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
START=$(date +%s)
SUMMARY="$OUT/SUMMARY.md"
PROFILE="$WORK/profile/h100-$MODEL.yaml"
[ "$DEVICE" = cuda ] || PROFILE="$WORK/profile/$DEVICE-$MODEL.yaml"

{
  echo "# servesim GPU campaign"
  echo
  echo "started $(date -u +%FT%TZ), stages: ${STAGES[*]}, budget ${BUDGET} s"
  echo
  echo "| stage | exit | seconds | cap s |"
  echo "| --- | --- | --- | --- |"
} > "$SUMMARY"

pack() {  # rewrite the archive and the summary's notes; cheap, so after every stage
  tar czf "$OUT/campaign.tar.gz.tmp" -C "$WORK" . && mv "$OUT/campaign.tar.gz.tmp" "$OUT/campaign.tar.gz"
  if [ -f "$PROFILE" ]; then
    cp "$PROFILE" "$OUT/" && cp "${PROFILE%.yaml}.csv" "$OUT/" 2>/dev/null
  fi
}

# run_stage NAME CAP COMMAND...: run under timeout (min of CAP and what the budget has left)
run_stage() {
  local name=$1 cap=$2; shift 2
  local now left limit t0 rc
  now=$(date +%s); left=$((BUDGET - RESERVE - (now - START)))
  limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 15 ]; then
    echo "| $name | skipped: budget spent | 0 | $cap |" >> "$SUMMARY"
    return 0
  fi
  echo "== $name (limit ${limit} s): $*" | tee -a "$WORK/logs/$name.log"
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >> "$WORK/logs/$name.log" 2>&1
  rc=$?
  [ $rc -eq 124 ] && rc="124 (timed out)"
  echo "| $name | $rc | $(( $(date +%s) - t0 )) | $limit |" >> "$SUMMARY"
  echo "== $name: exit $rc" | tee -a "$WORK/logs/$name.log"
  tail -n 3 "$WORK/logs/$name.log"
  pack
}

stage_env() {
  {
    date -u +%FT%TZ; uname -a; nvidia-smi || true
    "$PY" - <<'EOF'
import importlib, sys
print("python", sys.version.split()[0])
for name in ("torch", "triton", "numpy", "pandas", "scipy", "yaml", "typer", "rich", "simpy",
             "matplotlib", "pytest"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(name, "MISSING", type(e).__name__)
import torch
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    free, total = torch.cuda.mem_get_info()
    print("gpu", p.name, "sms", p.multi_processor_count, "free/total GB",
          round(free / 1e9, 1), round(total / 1e9, 1))
else:
    print("NO CUDA DEVICE")
EOF
  } > "$WORK/env.txt" 2>&1
  cat "$WORK/env.txt"
}

for stage in "${STAGES[@]}"; do
  case $stage in
    env)
      stage_env > "$WORK/logs/env.log" 2>&1
      echo "| env | $? | - | - |" >> "$SUMMARY"
      grep -E "^(gpu|NO CUDA|torch|triton|simpy|numpy) " "$WORK/env.txt"
      pack ;;
    kernels)
      # test_calibrate.py includes the CPU end-to-end calibration of `tiny`; both files import
      # no simpy (test_real_engine.py and test_validate.py need the simulator: laptop only)
      run_stage kernels 150 "$PY" -m pytest -q -p no:cacheprovider -rfEs \
        --junitxml="$WORK/logs/kernels-junit.xml" tests/calibration/test_kernels.py tests/calibration/test_calibrate.py ;;
    bench)
      run_stage bench 100 "$PY" -m bench.kernels --out "$WORK/bench" ;;
    calibrate)
      run_stage calibrate 270 "$PY" cli.py calibrate --model "$MODEL" --device "$DEVICE" \
        --out "$PROFILE" ;;
    validate)
      prof=()
      [ -f "$PROFILE" ] && prof=(--profile "$PROFILE")
      run_stage validate 180 "$PY" cli.py validate "$SCENARIO" --device "$DEVICE" --real-only \
        "${prof[@]}" --out "$WORK/val-h100" ;;
    *)
      echo "unknown stage '$stage'; allowed: env kernels bench calibrate validate" >&2
      exit 2 ;;
  esac
done

{
  echo
  echo "finished $(date -u +%FT%TZ) after $(( $(date +%s) - START )) s"
  echo
  echo "## Key lines"
  for f in "$WORK"/logs/*.log; do
    [ -f "$f" ] || continue
    echo
    echo "### $(basename "$f" .log)"
    echo '```'
    grep -E "passed|failed|error|Error|profile:|held-out|real engine:|target|MAPE|limits|GB/s|TFLOP|skipped|Traceback|CUDA|needs|^(gpu|torch|triton|simpy|numpy) " "$f" \
      | grep -v "^== " | tail -n 25
    echo '```'
  done
} >> "$SUMMARY"
pack
cat "$SUMMARY"
ls -la "$OUT"
