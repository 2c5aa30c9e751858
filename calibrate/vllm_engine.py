"""`servesim validate --engine vllm`: the scenario's requests through real vLLM on the CPU.

    job.json  -> .vllm-venv/bin/python calibrate/vllm_driver.py job.json out.json   (vLLM's own venv)
    out.json  -> real/ in servesim's run schemas (requests.csv, steps.csv, summary.json, ...)
    real/     -> a step profile fitted on vLLM's own iterations (or --profile) -> the simulator

servesim and vLLM never share a process: vLLM pins transformers, numba and setuptools, and its
declared torchvision/torchaudio break transformers (calibrate/vllm_setup.sh says how the venv is
built). The driver imports only vLLM and the standard library.

Knobs, servesim -> vLLM (EngineArgs):
    scheduler chunked | continuous   enable_chunked_prefill True | False
    num_gpu_blocks N (derived)       num_gpu_blocks_override N + 1 (vLLM keeps one null block)
    max_num_seqs, max_num_batched_tokens, block_size, enable_prefix_caching: the same names
    model (a servesim ModelSpec)     config.json of a LlamaForCausalLM, weights load_format=dummy
                                     (a sliding window: every layer's, via layer_types)
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from sim.config.errors import ScenarioError
from sim.cost.batch import BatchStats
from sim.cost.registry import prefill_attention_work
from sim.runtime.metrics import REQUEST_COLUMNS, distribution
from sim.runtime.recorder import STEP_COLUMNS
from sim.scenario import Scenario
from sim.workload.generators import Workload

from .engine import EngineResult, check_engine_scenario, check_workload, num_blocks
from .real_run import REAL_RUN_FORMAT, RealRun, batch_stats, read_iterations

ROOT = Path(__file__).resolve().parent.parent
DRIVER = Path(__file__).resolve().parent / "vllm_driver.py"
SETUP = Path(__file__).resolve().parent / "vllm_setup.sh"
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention refuses other block sizes (16 included)
RAW_FILE = "vllm_raw.json"  # beside vllm.log in real/: the driver's out.json as it wrote it
# fit passes weighted by the previous prediction: single noisy iterations, not medians of repeats
# (calibrate/fit.py); 2 moved the fitted total within 1% of the measured one on the steady run
REWEIGHT = 2
DTYPE = "bfloat16"       # the CPU backend's default; AVX512-BF16 machines run it natively
# the model's dtype_bytes -> the dtype vLLM runs it in (a float32 config.json runs in float32, as
# `vllm serve --dtype float32` does; 2 bytes: bfloat16, the default above)
RUN_DTYPES = {4: "float32", 2: DTYPE}


def run_dtype(scenario: Scenario) -> str:
    return RUN_DTYPES.get(scenario.model.dtype_bytes, DTYPE)


def default_venv() -> Path:
    """$SERVESIM_VLLM_VENV, else .vllm-venv in the repository root (what vllm_setup.sh builds)."""
    return Path(os.environ.get("SERVESIM_VLLM_VENV") or ROOT / ".vllm-venv")


def venv_python(venv: Path) -> Path:
    py = Path(venv) / "bin" / "python"
    if not py.exists():
        raise ScenarioError(f"--vllm-venv {venv}: no vLLM virtualenv there; build it with "
                            f"`servesim validate SCENARIO --engine vllm --setup` or "
                            f"`bash calibrate/vllm_setup.sh` (~2 min, ~3.4 GB)")
    return py


def setup(venv: Path) -> None:
    """Build (or check) the vLLM venv with calibrate/vllm_setup.sh, its output passed through."""
    # absolute: the script works from the repository root, the user's path is from their cwd
    done = subprocess.run(["bash", str(SETUP), str(Path(venv).absolute())], cwd=ROOT)
    if done.returncode:
        raise ScenarioError(f"calibrate/vllm_setup.sh {venv}: failed (exit {done.returncode}); "
                            f"its output above says why")


def check_vllm_scenario(scenario: Scenario, workload: Workload | None = None) -> None:
    """What real vLLM (one CPU process) cannot run or what servesim cannot map onto it."""
    check_engine_scenario(scenario)  # iteration-level, one replica, TP 1
    e, m, where = scenario.engine, scenario.model, f"{scenario.source}: " if scenario.source else ""
    if e.speculative is not None or e.disaggregation is not None:
        which = "speculative" if e.speculative is not None else "disaggregation"
        raise ScenarioError(f"{where}engine.{which}: not validated against vLLM on the CPU (no "
                            f"draft model or second engine there); remove it for --engine vllm")
    if e.policy != "fcfs":
        raise ScenarioError(f"{where}engine.policy: --engine vllm maps fcfs only, got {e.policy!r}")
    if e.block_size % CPU_BLOCK_MULTIPLE:
        raise ScenarioError(f"{where}engine.block_size: vLLM's CPU attention needs a multiple of "
                            f"{CPU_BLOCK_MULTIPLE}, got {e.block_size}")
    if e.kv_cache_dtype != "auto":
        raise ScenarioError(f"{where}engine.kv_cache_dtype: --engine vllm runs auto only")
    if m.moe is not None or m.mla is not None or m.linear_weight_bytes is not None:
        raise ScenarioError(f"{where}model: --engine vllm builds a dense Llama from the model's "
                            f"shape; {m.name} is MoE, MLA or quantised")
    if m.sliding_layers and m.sliding_layers != m.num_layers:
        raise ScenarioError(f"{where}model: vLLM on the CPU runs without the hybrid KV-cache manager, "
                            f"so {m.name}'s mix of windowed and full layers would hold full KV there; "
                            f"--engine vllm validates a window on every layer")
    if workload is not None:
        check_workload(workload, where)
        longest = int((workload.prompt_tokens + workload.output_tokens).max())
        capacity = num_blocks(scenario) * e.block_size
        if longest > capacity and not m.sliding_layers:  # (a window's: check_servable's)
            raise ScenarioError(f"{where}engine.num_gpu_blocks: a request of {longest} tokens "
                                f"does not fit {num_blocks(scenario)} blocks of {e.block_size}")
        if e.scheduler == "continuous" and int(workload.prompt_tokens.max()) > e.max_num_batched_tokens:
            raise ScenarioError(f"{where}engine.max_num_batched_tokens: a prompt of "
                                f"{int(workload.prompt_tokens.max())} tokens exceeds it and "
                                f"continuous batching does not chunk prompts")


def model_config(scenario: Scenario) -> dict:
    """config.json of a LlamaForCausalLM with the scenario model's shape (random weights)."""
    m = scenario.model
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": m.hidden_size, "intermediate_size": m.intermediate_size,
            "num_hidden_layers": m.num_layers, "num_attention_heads": m.num_attention_heads,
            "num_key_value_heads": m.num_kv_heads, "head_dim": m.head_dim,
            "vocab_size": m.vocab_size, "max_position_embeddings": 131072,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": m.tie_word_embeddings, "attention_bias": m.attention_bias,
            "torch_dtype": run_dtype(scenario), "bos_token_id": 1, "eos_token_id": 2,
            **({} if not m.sliding_layers else {  # vLLM's Llama reads a window per layer from these
                "sliding_window": m.sliding_window, "layer_types": ["sliding_attention"] * m.num_layers})}


def job(scenario: Scenario, workload: Workload, model_dir: Path, clock: str) -> dict:
    e = scenario.engine
    longest = int((workload.prompt_tokens + workload.output_tokens).max())
    bs = e.block_size
    max_model_len = -(-longest // bs) * bs
    if not scenario.model.sliding_layers:  # (a window holds less than the sequence)
        max_model_len = min(max_model_len, num_blocks(scenario) * bs)
    if e.scheduler == "continuous":  # vLLM checks budget >= max_model_len without chunking
        max_model_len = min(max_model_len, e.max_num_batched_tokens)
    prefix = None
    if workload.prefix is not None:  # unit ids (ints, or tuples for generated system prompts) -> ints
        ids: dict = {}
        prefix = [None if p is None else [[ids.setdefault(u, len(ids) + 1) for u in p[0]], int(p[1])]
                  for p in workload.prefix]
    caching = e.enable_prefix_caching is not False  # None: the scheduler's default, on as in V1
    return {"model_dir": str(model_dir), "seed": scenario.seed, "clock": clock,
            "vocab_size": scenario.model.vocab_size, "prefix": prefix,
            "engine": {"block_size": bs, "num_gpu_blocks": num_blocks(scenario),
                       "max_num_seqs": e.max_num_seqs,
                       "max_num_batched_tokens": e.max_num_batched_tokens,
                       "enable_chunked_prefill": e.scheduler == "chunked",
                       "enable_prefix_caching": caching, "max_model_len": max_model_len,
                       "dtype": run_dtype(scenario)},
            "requests": [[float(a), int(p), int(o)] for a, p, o in
                         zip(workload.arrival_s, workload.prompt_tokens, workload.output_tokens)]}


def run_vllm(scenario: Scenario, workload: Workload, *, venv: Path | None = None, clock: str = "cpu",
             progress: Callable[[int, int], None] | None = None, log: Path | None = None) -> RealRun:
    """Run the workload through real vLLM in its venv; the result in servesim's schemas."""
    check_vllm_scenario(scenario, workload)
    py = venv_python(venv or default_venv())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # EngineCore in this thread: its CPU time is ours
           "TOKENIZERS_PARALLELISM": "false", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    with tempfile.TemporaryDirectory(prefix="servesim-vllm-") as tmp:
        tmp = Path(tmp)
        (tmp / "model").mkdir()
        (tmp / "model" / "config.json").write_text(json.dumps(model_config(scenario), indent=1))
        (tmp / "job.json").write_text(json.dumps(job(scenario, workload, tmp / "model", clock)))
        lines: list[str] = []
        with subprocess.Popen([str(py), str(DRIVER), str(tmp / "job.json"), str(tmp / "out.json")],
                              env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, cwd=tmp) as proc:
            for line in proc.stdout:
                if line.startswith("progress "):
                    done, total = map(int, line.split()[1:3])
                    if progress is not None:
                        progress(done, total)
                else:
                    lines.append(line)
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(lines))
        if proc.returncode or not (tmp / "out.json").exists():
            tail = [ln.strip() for ln in lines if ln.strip()][-1:] or ["(no output)"]
            raise ScenarioError(f"vLLM run failed (exit {proc.returncode}): {tail[0][-300:]}"
                                + (f"; full log: {log}" if log else ""))
        out = json.loads((tmp / "out.json").read_text())
        if log is not None:  # the driver's own record, for re-analysis (to_real_run reads it)
            shutil.move(tmp / "out.json", log.parent / RAW_FILE)
    return to_real_run(out, scenario, workload)


def to_real_run(out: dict, scenario: Scenario, workload: Workload) -> RealRun:
    """The driver's out.json as a RealRun (servesim's requests/steps schemas, BatchStats per
    iteration for the cost model). Public for tests: the adapter runs on a committed fixture."""
    its = out["iterations"]
    prompt = workload.prompt_tokens
    n = len(workload)
    first_scheduled = np.full(n, np.nan)
    stats, rows = [], []
    for it in its:
        pre_len, pre_ctx, dec, dec_ctx = [], [], 0, 0
        for i, tokens, ctx in it["scheduled"]:
            if np.isnan(first_scheduled[i]):
                first_scheduled[i] = it["start_s"]
            if tokens == 1 and ctx >= prompt[i]:  # one token after the prompt: a decode
                dec += 1
                dec_ctx += ctx + 1                 # BatchStats: the new token included
            else:                                  # a prompt chunk, or a recompute after preemption
                pre_len.append(tokens)
                pre_ctx.append(ctx)
        stats.append(BatchStats(prefill_lens=np.array(pre_len, dtype=np.int64),
                                prefill_contexts=np.array(pre_ctx, dtype=np.int64),
                                num_decodes=dec, decode_context_sum=dec_ctx))
        rows.append((0, it["start_s"], it["end_s"] - it["start_s"], 1, len(it["scheduled"]),
                     sum(pre_len), dec, 0, it["kv_blocks_used"], num_blocks(scenario),
                     it.get("waiting", 0)))
    steps = pd.DataFrame(rows, columns=list(STEP_COLUMNS))
    reqs = out["requests"]
    times = [np.asarray(r["token_s"], dtype=np.float64) for r in reqs]
    for i, t in enumerate(times):
        if len(t) != workload.output_tokens[i]:
            raise ScenarioError(f"vLLM run: request {i} produced {len(t)} tokens, expected "
                                f"{workload.output_tokens[i]}")
    arrival = workload.arrival_s.astype(np.float64)
    first = np.array([t[0] for t in times])
    finish = np.array([t[-1] for t in times])
    out_tokens = workload.output_tokens
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out_tokens > 1, (finish - first) / (out_tokens - 1), np.nan)
    requests = pd.DataFrame({
        "request_id": np.arange(n), "arrival_s": arrival, "prompt_tokens": prompt,
        "output_tokens": out_tokens, "first_token_s": first, "finish_s": finish,
        "ttft_s": first - arrival, "tpot_s": tpot, "e2el_s": finish - arrival, "e2e_s": finish - arrival,
        "queue_s": first_scheduled - arrival,
        "preemptions": np.array([r["preemptions"] for r in reqs], dtype=np.int64), "replica": 0,
    }, columns=list(REQUEST_COLUMNS))
    step_s = steps["duration_s"].to_numpy(np.float64)
    gaps = np.concatenate([np.diff(t) for t in times]) if times else np.zeros(0)
    summary = summary_of(scenario, requests, steps, gaps)
    meta = {
        "format": REAL_RUN_FORMAT, "complete": True, "engine_kind": "vllm",
        "scenario": scenario.name, "source": str(scenario.source) if scenario.source else None,
        "seed": scenario.seed, "model": scenario.model.name,
        "engine": dataclasses.asdict(scenario.engine), "num_gpu_blocks": num_blocks(scenario),
        "requests": n, "device": "cpu", "device_name": "vLLM " + out["meta"].get("vllm", "?") + " (CPU)",
        "dtype": run_dtype(scenario), "attention": "vllm-cpu", "clock": out["meta"]["clock"],
        "iterations": len(its), "duration_s": float(finish.max()) if n else 0.0,
        "wall_s": out["meta"].get("wall_s"), "engine_overhead_ms": 0.0,
        "model_step_ms_mean": float(np.mean([it["model_s"] for it in its]) * 1e3) if its else 0.0,
        "vllm": out["meta"].get("vllm"), "torch": out["meta"].get("torch"), "triton": None,
        "profile": None, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    result = EngineResult(requests=requests, steps=steps, step_s=step_s, stats=stats, tokens=[],
                          duration_s=meta["duration_s"], summary=summary)
    return RealRun(result=result, workload=workload, meta=meta)


def summary_of(scenario: Scenario, requests: pd.DataFrame, steps: pd.DataFrame,
               gaps: np.ndarray) -> dict:
    """summary.json for a vLLM run: the keys `servesim run` writes that a real run can measure
    (ITL from every token's own timestamp; no MFU/MBU: the peaks are a GPU's)."""
    done = requests[requests["finish_s"].notna()]
    duration = float(done["finish_s"].max() - requests["arrival_s"].min()) if len(done) else 0.0
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)  # noqa: E731
    iterations = len(steps)
    return {
        "scenario": scenario.name, "engine": "vllm", "completed": int(len(done)),
        "duration_s": duration, "iterations": iterations,
        "request_throughput": per_s(len(done)),
        "output_throughput": per_s(float(done["output_tokens"].sum())),
        "total_token_throughput": per_s(float((done["prompt_tokens"] + done["output_tokens"]).sum())),
        "preemptions": int(requests["preemptions"].sum()),
        "ttft_ms": distribution(done["ttft_s"].to_numpy()),
        "tpot_ms": distribution(done["tpot_s"].to_numpy()),
        "itl_ms": distribution(gaps),
        "e2el_ms": distribution(done["e2el_s"].to_numpy()),
        "slot_utilization": float(steps["num_seqs"].sum() / (scenario.engine.max_num_seqs * iterations))
        if iterations else 0.0,
        "mfu": None, "mbu": None,
    }


# ---- a step profile from vLLM's own iterations ----

def iteration_rows(real: RealRun) -> pd.DataFrame:
    """Per real iteration: the profile's features (calibrate/fit.FEATURES) and its time in ms."""
    return _rows(real.result.stats, real.result.step_s)


def _rows(stats: list, step_s: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({
        "total_tokens": [b.total_tokens for b in stats],
        "decode_context_sum": [b.decode_context_sum for b in stats],
        "prefill_attention_work": [prefill_attention_work(b) if len(b.prefill_lens) else 0.0 for b in stats],
        "num_seqs": [b.num_seqs for b in stats],
        "step_ms": np.asarray(step_s, dtype=np.float64) * 1e3,
    })


def fit_profile(real: RealRun, scenario: Scenario, holdout: float = 0.2, seed: int = 0):
    """A step profile fitted on the run's own iterations (whole vLLM iterations: schedule, model,
    sampling, output processing). Returns (StepProfile, metadata dict, StepFit)."""
    return fit_rows(iteration_rows(real), scenario.model.name, real.meta,
                    f"{scenario.name}", holdout=holdout, seed=seed)


def fit_rows(rows: pd.DataFrame, model: str, meta: dict, what: str, holdout: float = 0.2,
             seed: int = 0):
    """The profile fit on iteration rows (`_rows`); the held-out error is measured on a random
    `holdout` share before the final fit on all of them."""
    from .fit import fit_step_model, heldout_error

    rows = rows[rows["step_ms"] > 0]
    if len(rows) < 20:
        raise ScenarioError(f"{len(rows)} iterations are too few to fit a step profile; run more "
                            f"requests or pass --profile")
    test = np.random.default_rng(seed).random(len(rows)) < holdout
    mape, worst = heldout_error(fit_step_model(rows[~test], time_column="step_ms", reweight=REWEIGHT),
                                rows[test], time_column="step_ms")
    fit = fit_step_model(rows, time_column="step_ms", reweight=REWEIGHT)
    engine = f"vLLM {meta.get('vllm')}" if meta.get("engine_kind") == "vllm" else "servesim engine"
    out = {"device": f"CPU: {engine} ({meta.get('clock')} clock)" if meta.get("device", "cpu") == "cpu"
           else f"{meta.get('device_name')}: {engine} ({meta.get('clock')} clock)",
           "model": model, "dtype": meta.get("dtype", DTYPE), "tensor_parallel_size": 1,
           "measured": True, "date": meta.get("date"),
           "heldout_mape": round(mape, 4), "heldout_max_error": round(worst, 4),
           "notes": f"fitted on {len(rows)} iterations of {what} ({int(test.sum())} held out for "
                    f"the error)"}
    return fit.profile(out), out, fit


def fit_runs(dirs: list[Path], model: str):
    """One profile from the iterations of several validate runs' real/ folders (their
    iterations.csv and run.json): for shapes no single workload covers (a light workload never
    runs large batches). Returns (StepProfile, metadata, StepFit)."""
    frames, metas, names = [], [], []
    for d in map(Path, dirs):
        d = d / "real" if (d / "real" / "run.json").is_file() else d
        if not (d / "run.json").is_file() or not (d / "iterations.csv").is_file():
            raise ScenarioError(f"--from-runs {d}: no run.json and iterations.csv there (expected "
                                f"the output folder of servesim validate, or its real/)")
        meta = json.loads((d / "run.json").read_text())
        if meta.get("model") != model:
            raise ScenarioError(f"--from-runs {d}: ran model {meta.get('model')!r}, not {model!r}")
        it = read_iterations(d)
        frames.append(_rows(batch_stats(it), it["step_s"].to_numpy()))
        metas.append(meta)
        names.append(str(meta.get("scenario")))
    kinds = {(m.get("engine_kind"), m.get("clock"), m.get("device")) for m in metas}
    if len(kinds) > 1:
        raise ScenarioError(f"--from-runs: the runs were measured differently ({sorted(map(str, kinds))}); "
                            f"fit one engine, clock and device at a time")
    return fit_rows(pd.concat(frames, ignore_index=True), model, metas[0], " + ".join(names))
