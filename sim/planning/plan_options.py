"""What `servesim plan` is asked: PlanRequest, each field with how the command line spells it
(sim/config/options.py), so that the CLI's options, the notebook API (servesim.plan) and the job
(sim/planning/plan_request.py) read one declaration. Lists stay their comma-separated text here;
plan_request.py parses the mini-languages ("64,128,256", "off,eagle:3:0.7", "off,1:3", "on,off")."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import argument, option


@dataclass(frozen=True)
class PlanRequest:
    """`servesim plan`'s options as written (lists as their comma-separated text)."""
    scenario: Path = field(metadata=argument(
        "Scenario YAML: a generated workload (an arrival rate, or closed_loop users) or a trace replay (its load "
        "is workload.time_scale)."))
    slo: str | None = field(default=None, metadata=option(
        "The SLO: vLLM's metric names in ms, each at its own percentile or --slo's percentile= (default 99), e.g. "
        "[bold]ttft_ms=500,tpot_ms=50[/] or [bold]ttft_ms=500@p99,itl_ms=100@p95,e2el_ms=20000[/] (keys: ttft_ms, "
        "tpot_ms, itl_ms, e2el_ms, percentile). \\[default: the scenario's slo]",
        metavar="KEY=V,...", show_default=False))
    target_rate: float | None = field(default=None, metadata=option(
        "Size a cluster for this many requests/s (open-loop scenarios; a trace replay runs at time_scale = R / its "
        "native rate).", metavar="R", show_default=False))
    target_users: int | None = field(default=None, metadata=option(
        "Size a cluster for this many concurrent users (closed-loop scenarios).", metavar="N", show_default=False))
    gpu_hour_usd: float | None = field(default=None, metadata=option(
        "Price of one GPU-hour in USD, of the one GPU type planned (a search over several: --price). \\[default: "
        "the hardware preset's usd_per_hour]", metavar="USD", show_default=False))
    price: str | None = field(default=None, metadata=option(
        "USD per GPU-hour per GPU type, e.g. [bold]h100-sxm=2.5,h200=3.4[/] (the others keep their preset's price).",
        metavar="GPU=USD,...", show_default=False))
    emit: Path | None = field(default=None, metadata=option(
        "Also write what to deploy into DIR: vllm_serve.sh, engine_args.yaml (vllm serve MODEL --config) and "
        "k8s.yaml (a Deployment of the planned replicas + a Service).", metavar="DIR", show_default=False))
    out: Path | None = field(default=None, metadata=option(
        "Output directory for plan.md, plan.json and the plots. \\[default: runs/<scenario name>-plan]",
        "--out", "-o", metavar="DIR", show_default=False))
    overrides: tuple[str, ...] = field(default=(), metadata=option(
        "Override a scenario key, e.g. [bold]--set engine.scheduler=continuous[/]. Repeatable.",
        "--set", metavar="KEY=VALUE", show_default=False))
    seeds: int = field(default=4, metadata=option(
        "Seeds per load point near a target (2 first; up to twice as many while the 90% interval of the mean "
        "percentile straddles a target; 1 when the workload has no random component, e.g. a trace replay).",
        metavar="N"))
    resolution: float = field(default=0.02, metadata=option(
        "Relative step of the rate grid (a trace's time_scale grid): the answer is within this of the true "
        "boundary.", metavar="F"))
    horizon_s: float | None = field(default=None, metadata=option(
        "Simulated seconds of arrivals per run (generated open loop), at least --min-requests and what the SLO's "
        "percentile needs (a trace's length fixes its own). \\[default: 120]", metavar="S", show_default=False))
    confidence: float = field(default=0.9, metadata=option(
        "A confirmed cluster: a fresh run of it meets the SLO with at least this probability (a one-sided "
        "Student-t prediction bound over its seeds).", metavar="P"))
    headroom: float = field(default=1.0, metadata=option(
        "Plan for this share of the sustained load (0.8: replicas sized for target / 0.8).", metavar="F"))
    band: bool = field(default=True, metadata=option(
        "Where the step profile carries a held-out MAPE, also search with steps that much slower and faster.",
        "--band/--no-band"))
    max_num_seqs: str | None = field(default=None, metadata=option(
        "max_num_seqs candidates, e.g. 64,128,256 (taken as given, beyond the KV cap too). \\[default: 8..512 "
        "within the KV cap; with --gpus/--tp: the scenario's]", "--max-num-seqs", metavar="N,...", show_default=False))
    max_num_batched_tokens: str | None = field(default=None, metadata=option(
        "max_num_batched_tokens candidates, e.g. 2048,8192. \\[default: 512..16384 (chunked); with --gpus/--tp: "
        "the scenario's]", "--max-num-batched-tokens", metavar="N,...", show_default=False))
    gpus: str | None = field(default=None, metadata=option(
        "Search GPU types (hardware presets), e.g. [bold]h100-sxm,h200,a100-80gb,l40s[/]: ranks every "
        "configuration by cost (docs/planner.md).", metavar="NAME,...", show_default=False))
    tp: str | None = field(default=None, metadata=option(
        "Search tensor_parallel_size values, e.g. 1,2,4,8 (with or without --gpus).",
        metavar="N,...", show_default=False))
    schedulers: str | None = field(default=None, metadata=option(
        "Configuration search: schedulers to compare, e.g. chunked,continuous.",
        metavar="NAME,...", show_default=False))
    speculative: str | None = field(default=None, metadata=option(
        "Configuration search: speculative decoding candidates, off or METHOD:K:ACCEPTANCE[:DRAFT], e.g. "
        "off,eagle:3:0.7,ngram:4:0.5.", metavar="SPEC,...", show_default=False))
    disaggregation: str | None = field(default=None, metadata=option(
        "Configuration search: layouts to compare, off (aggregated) or P:D prefill and decode replicas per unit, "
        "e.g. off,1:3,2:2 (KV over NVLink).", metavar="off,P:D,...", show_default=False))
    prefix_caching: str | None = field(default=None, metadata=option(
        "Configuration search: enable_prefix_caching values to compare: on,off.", metavar="on,off", show_default=False))
    pp: str | None = field(default=None, metadata=option(
        "Configuration search: pipeline_parallel_size values to compare (stages per replica, each on its own --tp "
        "GPUs), e.g. 1,2.", metavar="N,...", show_default=False))
    dp: str | None = field(default=None, metadata=option(
        "Configuration search: data_parallel_size values to compare for a MoE model (DP attention, experts over "
        "every rank's GPUs: enable_expert_parallel), e.g. 1,8.", metavar="N,...", show_default=False))
    kv_offloading_size: str | None = field(default=None, metadata=option(
        "Configuration search: CPU KV tier sizes to compare, GiB per replica (vLLM's --kv-offloading-size; 0: "
        "none), e.g. 0,16,64.", metavar="GIB,...", show_default=False))
    all2all_backend: str | None = field(default=None, metadata=option(
        "Configuration search: the data-parallel ranks' all-to-all backends to compare, vLLM's --all2all-backend "
        "names (docs/planner.md), e.g. deepep_low_latency",
        "--all2all-backend", metavar="NAME,...", show_default=False))
    max_gpus: int | None = field(default=None, metadata=option(
        "Configuration search: at most this many GPUs in all.", metavar="N", show_default=False))
    budget_usd_per_hour: float | None = field(default=None, metadata=option(
        "Configuration search: at most this many USD per hour in all.", metavar="USD", show_default=False))
    power_cap_kw: float | None = field(default=None, metadata=option(
        "At most this many kW for the whole facility (modelled power, docs/energy.md): the search leaves out "
        "clusters over it; a plan says when its answer is over it.", metavar="KW", show_default=False))
    min_requests: int = field(default=1000, metadata=option(
        "Requests per run, at least (a stable p99 needs ~1000); a shorter trace gets a warning, it is not repeated.",
        metavar="N"))
    workers: int | None = field(default=None, metadata=option(
        "Worker processes. \\[default: all cores]", metavar="N", show_default=False))
    cluster: str | None = field(default=None, metadata=option(
        "Run the simulations on a running Dask distributed scheduler instead, e.g. [bold]tcp://host:8786[/] (needs "
        "servesim\\[cluster] here and on the workers); the same answers as a local plan.",
        metavar="ADDRESS", show_default=False))
    window_s: float | None = field(default=None, metadata=option(
        "A fleet plan (a scenario with engine.autoscaling): the SLO must hold in every window of this many seconds "
        "of arrivals. \\[default: 3600]", metavar="S", show_default=False))
    availability: float | None = field(default=None, metadata=option(
        "With the scenario's faults: section, also the spares (N+k) the planned cluster needs for the SLO met in "
        "this fraction of windows, e.g. 0.999 (a fleet plan: the min_replicas; docs/faults.md).",
        metavar="FRACTION", show_default=False))
    max_spares: int = field(default=4, metadata=option("With --availability: the most spares tried.", metavar="K"))
    fault_seeds: int = field(default=5, metadata=option(
        "With --availability: fault seeds per fleet; the worst must meet it.", metavar="N"))
    quiet: bool = field(default=False, metadata=option(
        "Print only the output directory: no progress, no table.", "--quiet", "-q"))

    @property
    def searches(self) -> bool:
        """A configuration search (any of the search options given), else a plan."""
        return any(v is not None for v in (self.gpus, self.tp, self.pp, self.dp, self.all2all_backend, self.schedulers,
                                           self.prefix_caching,
                                           self.speculative, self.disaggregation, self.kv_offloading_size))
