"""servesim against Vidur in the same run (issue 19): the same requests, each simulator in a fresh
process, interleaved, on this machine.

    python bench/vidur_same_run.py [--requests 100000] [--rounds 3] [--home ~/.cache/servesim/vidur]

1. Vidur: `vidur==0.0.26` from PyPI into its own virtualenv under --home (once; ~1.3 GB). If that
   fails, the reason is printed and the bench stops (bench/sim_speed.py keeps the last measured
   same-machine figure, labelled).
2. Requests: issue 19's workload (bench/sim_speed.py's OVERRIDES: Llama-3-8B, H100, chunked,
   max_num_seqs 128, token budget 8192, Poisson 6 req/s, lognormal prompts and outputs), drawn once
   by servesim and written as a Vidur trace (Date, Time in s, PromptTokenCount,
   CompletionTokenCount). servesim draws the same requests from the same seed.
3. Vidur's profiles, generated: vidur 0.0.26 downloads measured profiles from Hugging Face, which
   this machine cannot reach, and the attention.csv files of Vidur's GitHub repository are large
   objects its public snapshot lacks. So servesim's roofline for the same model and GPU is
   tabulated at Vidur's own profiling grid (vidur/profiling/utils: token counts; chunk sizes x
   cached contexts; batch sizes x contexts), in Vidur's columns (milliseconds per layer), and put
   where Vidur reads a dataset offline (a Hugging Face cache, HF_HUB_OFFLINE=1). Both simulators
   price iterations from one model of the GPU; the table gives each one's simulated makespan and
   median TTFT and E2E, which should be close.
   Vidur's knobs are set to servesim's: one replica, TP 1, PP 1, Sarathi (chunked prefill) with
   chunk_size = max_num_batched_tokens, batch_size_cap = max_num_seqs, block_size 16, the same
   number of KV blocks; its predictions cover requests up to 8,192 tokens (its default is 2M).
4. Vidur's cold start (its random forests trained on the profiles with its default grid search,
   then its prediction grid; cached under --home, keyed by the profile's digest: 848 MB): timed
   once, on 200 requests. ~22 min the first time on the 2-core machine, seconds after.
5. Rounds, interleaved: `servesim run --quiet` (requests.csv, steps.csv, summary.json) and
   `python -m vidur.main` (request and batch metrics, no plots, no Chrome trace), each a fresh
   process, timed whole: CPU seconds (user + sys, the kernel's accounting of the child) and wall
   seconds. And the simulation alone: servesim's simulate() in thread CPU seconds (a
   bench/sim_speed.py child on the same requests), Vidur's between its 'Starting simulation' and
   'Simulation ended' log lines (wall, whole seconds; it simulates on one thread). Min and
   median of each; the ratios of the medians.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import product
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from bench.sim_speed import OVERRIDES  # noqa: E402
from sim.build import cost_model
from sim.cost.batch import BatchStats  # noqa: E402
from sim.scenario import load_scenario  # noqa: E402
from sim.workload.generators import build_workload  # noqa: E402

VIDUR = "vidur==0.0.26"
SCENARIO = ROOT / "scenarios/chat-llama3-8b-h100.yaml"
VIDUR_MODEL = "meta-llama/Llama-3-8B"   # Vidur's name for the same architecture
MAX_TOKENS = 8192                       # Vidur's prediction range: request and batch tokens
# Vidur's profiling grids (vidur/profiling/utils/__init__.py, 0.0.26), up to this workload's sizes
NUM_TOKENS = [1, 2, 4] + list(range(8, 1024, 8)) + list(range(1024, 2048 + 1, 16)) \
    + list(range(2048 + 32, 4096 + 1, 32)) + list(range(4096 + 64, MAX_TOKENS + 1, 64))
CHUNKS = list(range(32, 128 + 1, 32)) + list(range(256, 1024 + 1, 128)) + list(range(1536, MAX_TOKENS + 1, 512))
CONTEXTS = list(range(0, 1024 + 1, 32)) + list(range(1024 + 64, 4096 + 1, 64)) \
    + list(range(4096 + 256, MAX_TOKENS, 256))
BATCH_SIZES = list(range(1, 128 + 1))


def scenario(n: int):
    return load_scenario(SCENARIO, overrides=[*OVERRIDES, f"workload.num_requests={n}"])


# ---- 1. Vidur's virtualenv --------------------------------------------------------------------

def vidur_python(home: Path) -> Path:
    venv = home / "venv"
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([py, "-c", "import vidur.main"], capture_output=True).returncode == 0:
        return py
    print(f"installing {VIDUR} into {venv} (once)...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", venv], check=True)
    pip = subprocess.run([py, "-m", "pip", "install", "-q", VIDUR], capture_output=True, text=True)
    if pip.returncode:
        tail = (pip.stderr or pip.stdout).strip().splitlines()[-1:] or ["no output"]
        sys.exit(f"cannot install {VIDUR}: {tail[0]} (bench/sim_speed.py compares with the last "
                 "same-machine figure instead)")
    return py


# ---- 2. the requests, as a Vidur trace ---------------------------------------------------------

def write_trace(n: int, path: Path) -> dict:
    sc = scenario(n)
    w = build_workload(sc.workload, np.random.default_rng(sc.seed))
    pd.DataFrame({"Date": "servesim", "Time": w.arrival_s, "PromptTokenCount": w.prompt_tokens,
                  "CompletionTokenCount": w.output_tokens}).to_csv(path, index=False)
    longest = int((w.prompt_tokens + w.output_tokens).max())
    assert longest <= MAX_TOKENS, f"a request of {longest} tokens exceeds Vidur's range here"
    e = sc.engine
    return {"max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
            "block_size": e.block_size, "gpu_memory_utilization": e.gpu_memory_utilization,
            "num_blocks": sc.budget.num_gpu_blocks, "tokens": int(w.prompt_tokens.sum() + w.output_tokens.sum())}


# ---- 3. Vidur's profiles from servesim's roofline -----------------------------------------------

def profiles(tp: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Vidur's mlp.csv and attention.csv for this scenario's model and GPU, in ms per layer.

    Vidur sums per-layer operator times x layers. servesim's roofline prices an iteration as
    linear layers (with the iteration's CPU overhead) + attention. Here the linear part of T
    tokens goes to Vidur's mlp_up_proj (its other operators 0), the attention of a prefill chunk
    (cached context c, chunk p) to attn_prefill, that of b decodes at context c to attn_decode:
    each the roofline's seconds / layers. The roofline's per-sequence terms (CPU 5 us, logits
    ~1.5 us on this GPU) count sequences, Vidur's operators only tokens: T tokens are priced as
    min(T, 128) sequences, exact for decode batches and for a loaded mixed batch (128 sequences),
    up to 127 x 6.5 us = 0.8 ms over the roofline for a lone prefill (steps of 10-60 ms)."""
    sc = scenario(10)
    cost, m = cost_model(sc), sc.model
    layers = m.num_layers
    ms = 1e3 / layers

    def linear(tokens: int, seqs: int) -> float:
        return cost._linear_time(tokens, seqs)

    def step(stats: BatchStats) -> float:
        return float(cost.step_times(stats)[0])

    shape = {"n_head": m.num_attention_heads, "n_kv_head": m.num_kv_heads, "n_embd": m.hidden_size,
             "num_tensor_parallel_workers": tp}
    mlp = pd.DataFrame({"num_tokens": NUM_TOKENS, **shape, "n_expanded_embd": m.intermediate_size,
                        "use_gated_mlp": True, "vocab_size": m.vocab_size})
    mlp["time_stats.mlp_up_proj.median"] = [linear(t, min(t, 128)) * ms for t in NUM_TOKENS]
    for op in ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "mlp_down_proj",
               "mlp_act", "add", "post_attention_layernorm"):
        mlp[f"time_stats.{op}.median"] = 0.0
    rows = []
    for p in CHUNKS:  # chunked prefills: a chunk of p tokens after c cached ones (Vidur: c a multiple of p)
        for c in range(0, MAX_TOKENS - p + 1, p):
            t = step(BatchStats(prefill_lens=np.array([p]), prefill_contexts=np.array([c]))) - linear(p, 1)
            rows.append((1, p, c, t * ms, np.nan))
    for p in sorted(set(CONTEXTS[1:]) - set(CHUNKS)):  # whole prompts (not already a chunk at 0)
        t = step(BatchStats(prefill_lens=np.array([p]), prefill_contexts=np.array([0]))) - linear(p, 1)
        rows.append((1, p, 0, t * ms, np.nan))
    for b, c in product(BATCH_SIZES, CONTEXTS):
        t = step(BatchStats(num_decodes=b, decode_context_sum=b * c)) - linear(b, b)
        rows.append((b, 0, c, np.nan, t * ms))
    att = pd.DataFrame(rows, columns=["batch_size", "prefill_chunk_size", "kv_cache_size",
                                      "time_stats.attn_prefill.median", "time_stats.attn_decode.median"])
    for k, v in {**shape, "n_q_head": m.num_attention_heads, "block_size": sc.engine.block_size}.items():
        att[k] = v
    att["time_stats.attn_kv_cache_save.median"] = 0.0
    return mlp, att


def hf_dataset(cache: Path, repo_id: str, files: dict[str, pd.DataFrame], config: dict) -> None:
    """Files where huggingface_hub's snapshot_download finds a dataset offline."""
    base = cache / f"datasets--{repo_id.replace('/', '--')}"
    rev = "0" * 40
    snap = base / "snapshots" / rev
    snap.mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(rev)
    (snap / "config.json").write_text(json.dumps(config))
    for name, df in files.items():
        df.to_csv(snap / name, index=False, compression="xz")


def prepare_profiles(home: Path) -> tuple[str, str]:
    mlp, att = profiles()
    digest = hashlib.sha256(pd.util.hash_pandas_object(pd.concat([mlp, att])).values.tobytes()).hexdigest()[:8]
    compute, network = f"servesim/roofline-llama-3-8b-h100-{digest}", "servesim/h100-dgx-none"
    cache = home / "cache"
    if not (cache / "profiling_data/compute" / f"datasets--{compute.replace('/', '--')}").exists():
        hf_dataset(cache / "profiling_data/compute", compute,
                   {"mlp.csv.xz": mlp, "attention.csv.xz": att}, {"model": VIDUR_MODEL, "device_sku": "h100"})
        # TP 1, PP 1: Vidur reads no collective timings, but looks the dataset up
        hf_dataset(cache / "profiling_data/network", network, {}, {"sku": "h100_dgx"})
    print(f"Vidur profiles: {len(mlp)} token counts, {att['prefill_chunk_size'].gt(0).sum()} prefill and "
          f"{att['prefill_chunk_size'].eq(0).sum()} decode attention points, servesim roofline ({compute})")
    return compute, network


# ---- 4-5. runs ----------------------------------------------------------------------------------

def vidur_cmd(py: Path, home: Path, trace: Path, knobs: dict, datasets: tuple[str, str], out: Path) -> list:
    rf = "--random_forrest_execution_time_predictor_config_"
    return [str(py), "-m", "vidur.main", "--seed", "0",
            "--replica_config_model_name", VIDUR_MODEL, "--replica_config_device", "h100",
            "--replica_config_network_device", "h100_dgx",
            "--replica_config_tensor_parallel_size", "1", "--replica_config_num_pipeline_stages", "1",
            "--replica_config_gpu_memory_utilization", str(knobs["gpu_memory_utilization"]),
            "--cache_config_block_size", str(knobs["block_size"]),
            "--cache_config_num_blocks", str(knobs["num_blocks"]),
            "--replica_scheduler_config_type", "sarathi",
            "--sarathi_scheduler_config_batch_size_cap", str(knobs["max_num_seqs"]),
            "--sarathi_scheduler_config_chunk_size", str(knobs["max_num_batched_tokens"]),
            "--request_generator_config_type", "trace_replay",
            "--trace_request_generator_config_trace_file", str(trace),
            "--trace_request_generator_config_date", "servesim",
            "--trace_request_generator_config_prefill_scale_factor", "1",
            "--trace_request_generator_config_decode_scale_factor", "1",
            "--trace_request_generator_config_time_scale_factor", "1",
            "--trace_request_generator_config_max_tokens", str(MAX_TOKENS),
            "--execution_time_predictor_config_type", "random_forrest",
            rf + "model_profiling_dataset", datasets[0], rf + "network_profiling_dataset", datasets[1],
            rf + "cache_dir", str(home / "cache"),
            rf + "prediction_max_tokens_per_request", str(MAX_TOKENS),
            rf + "prediction_max_prefill_chunk_size", str(knobs["max_num_batched_tokens"]),
            rf + "prediction_max_batch_size", str(knobs["max_num_seqs"]),
            "--no-metrics_config_store_plots", "--no-metrics_config_enable_chrome_trace",
            "--metrics_config_output_dir", str(out)]


def timed(cmd: list, env: dict | None = None) -> tuple[float, float, str]:
    """(CPU s, wall s, output) of one child process; the CPU seconds are the kernel's for it and
    its own children (Vidur's training forks workers)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd[:4]))} ...\n{p.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, p.stdout + p.stderr


def outcome(name: str, out: Path, log: str) -> tuple[float, float, float]:
    """(simulated makespan s, median TTFT s, median E2E s) of one run: the two simulators model
    the same requests on the same GPU model, so these should be close (not equal: Vidur's
    random forests smooth the roofline's tables, its Sarathi scheduler is not vLLM V1's)."""
    if name == "servesim":
        r = pd.read_csv(out / "requests.csv", usecols=["ttft_s", "e2el_s"])
        return (json.loads((out / "summary.json").read_text())["duration_s"], r.ttft_s.median(), r.e2el_s.median())
    v = pd.read_csv(next(out.rglob("request_metrics.csv")), usecols=["prefill_e2e_time", "request_e2e_time"])
    end = float(re.search(r"Simulation ended at: ([0-9.]+)s", log).group(1))
    return end, v.prefill_e2e_time.median(), v.request_e2e_time.median()


def vidur_simulation_s(log: str) -> float:
    """Seconds between Vidur's 'Starting simulation' and 'Simulation ended' log lines (they carry
    whole seconds: +-1 s)."""
    def at(event: str) -> float:
        m = re.search(r"(\d\d):(\d\d):(\d\d) simulator\.py:\d+\] " + event, log)
        if m is None:
            sys.exit(f"no '{event}' line in Vidur's log")
        h, mi, sec = map(int, m.groups())
        return 3600 * h + 60 * mi + sec
    return (at("Simulation ended") - at("Starting simulation")) % 86400


def trace_of(tmp: Path, head: int) -> Path:
    """The first `head` requests of the trace, for the cold start."""
    path = tmp / f"trace-{head}.csv"
    pd.read_csv(tmp / "trace.csv", nrows=head).to_csv(path, index=False)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--home", type=Path, default=Path.home() / ".cache/servesim/vidur",
                    help="Vidur's virtualenv, profiles and trained predictors")
    args = ap.parse_args()
    if args.requests < 200 or args.rounds < 1:  # (the cold start replays the first 200 requests)
        ap.error("--requests must be at least 200 and --rounds at least 1")
    args.home.mkdir(parents=True, exist_ok=True)
    py = vidur_python(args.home)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONHASHSEED": "0"}
    datasets = prepare_profiles(args.home)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        trace = tmp / "trace.csv"
        knobs = write_trace(args.requests, trace)
        print(f"requests: {args.requests} ({knobs['tokens']} tokens), KV cache {knobs['num_blocks']} blocks "
              f"of {knobs['block_size']}, max_num_seqs {knobs['max_num_seqs']}, "
              f"budget {knobs['max_num_batched_tokens']}")
        cold = timed(vidur_cmd(py, args.home, trace_of(tmp, 200), knobs, datasets,
                               tmp / "vidur-cold"), env)
        print(f"Vidur cold start (trains on the profiles, or finds them trained under {args.home}) "
              f"with 200 requests: {cold[1]:.1f} s wall, {cold[0]:.1f} s CPU", flush=True)
        servesim = [sys.executable, str(ROOT / "cli.py"), "run", str(SCENARIO), "--quiet",
                    *[a for o in OVERRIDES for a in ("--set", o)], "--set", f"workload.num_requests={args.requests}"]
        phase = [sys.executable, str(ROOT / "bench/sim_speed.py"), "--child", str(args.requests), "--no-pandas"]
        runs: dict[str, list] = {"servesim": [], "vidur": []}
        seen: dict[str, tuple] = {}
        for r in range(args.rounds):
            for name in ("servesim", "vidur") if r % 2 == 0 else ("vidur", "servesim"):
                out = tmp / f"{name}-{r}"
                if name == "servesim":
                    cpu, wall, log = timed(servesim + ["--out", str(out)], env)
                    child = timed(phase, env)[2].splitlines()
                    sim_s = json.loads(next(x for x in reversed(child) if x.startswith("{")))["simulate"][0]
                else:
                    cpu, wall, log = timed(vidur_cmd(py, args.home, trace, knobs, datasets, out), env)
                    sim_s = vidur_simulation_s(log)
                runs[name].append((cpu, wall, sim_s))
                seen[name] = outcome(name, out, log)
                shutil.rmtree(out, ignore_errors=True)
                print(f"round {r + 1}/{args.rounds} {name:>8}: {cpu:8.2f} s CPU {wall:8.2f} s wall, "
                      f"simulation {sim_s:7.2f} s", flush=True)
    print(f"\n{'':>10}{'process: CPU s':>18}{'wall s':>18}{'simulation s':>18}{'req/s':>8}"
          f"{'makespan s':>12}{'TTFT p50 ms':>13}{'E2E p50 s':>11}")
    print(f"{'':>10}{'min / median':>18}{'min / median':>18}{'min / median':>18}{'(CPU)':>8}")
    med = {}
    for name, xs in runs.items():
        a = np.array(xs)
        med[name] = np.median(a, axis=0)
        cols = "".join(f"{f'{lo:.2f} / {m:.2f}':>{w}}" for lo, m, w in zip(a.min(axis=0), med[name], (18, 18, 18)))
        print(f"{name:>10}{cols}{args.requests / med[name][0]:>8.0f}{seen[name][0]:>12.1f}"
              f"{seen[name][1] * 1e3:>13.1f}{seen[name][2]:>11.3f}")
    x = med["vidur"] / med["servesim"]
    print(f"servesim is {x[0]:.1f}x Vidur in process CPU seconds, {x[1]:.1f}x in wall seconds, {x[2]:.1f}x in "
          f"the simulation alone (medians of {args.rounds} rounds, {args.requests} requests, this run)")
    print("process: the whole command (start, read, simulate, write); simulation: servesim's simulate() "
          "(thread CPU s, bench/sim_speed.py --child), Vidur's from its 'Starting simulation' to its "
          "'Simulation ended' log lines (wall s, whole seconds; one thread)")


if __name__ == "__main__":
    main()
