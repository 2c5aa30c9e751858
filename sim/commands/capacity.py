"""`servesim capacity`: the KV-cache memory budget of a model on a GPU (no simulation)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from sim.config.options import option


@dataclass(frozen=True)
class CapacityRequest:
    model: str | None = field(default=None, metadata=option(
        "A model preset (e.g. llama-3-8b) or a path to a Hugging Face config.json.", metavar="NAME",
        show_default=False))
    gpu: str | None = field(default=None, metadata=option("A hardware preset, e.g. h100-sxm.", metavar="NAME",
                                                          show_default=False))
    tp: int | None = field(default=None, metadata=option(
        "Tensor-parallel size (GPUs per replica). \\[default: 1]", "--tp", metavar="N", show_default=False))
    seq_len: int = field(default=4096, metadata=option(
        "Tokens per sequence (prompt + output) for the concurrent-sequences row.", metavar="N"))
    gpu_memory_utilization: float | None = field(default=None, metadata=option(
        "Fraction of GPU memory for the engine. \\[default: 0.9]", metavar="F", show_default=False))
    block_size: int | None = field(default=None, metadata=option(
        "Tokens per KV block. \\[default: 16]", metavar="N", show_default=False))
    max_num_batched_tokens: int | None = field(default=None, metadata=option(
        "Token budget per iteration (sets the activation reserve). \\[default: 8192]", metavar="N",
        show_default=False))
    pp: int | None = field(default=None, metadata=option(
        "Pipeline stages (the busiest stage's GPU is shown). \\[default: 1]", "--pp", metavar="N",
        show_default=False))
    dp: int | None = field(default=None, metadata=option(
        "Data-parallel ranks of a MoE model sharing one expert-parallel group (with --ep). \\[default: 1]",
        "--dp", metavar="N", show_default=False))
    ep: bool | None = field(default=None, metadata=option(
        "Expert parallelism: each routed expert whole on one GPU of the group. \\[default: off]", "--ep/--no-ep",
        show_default=False))
    scenario: Path | None = field(default=None, metadata=option(
        "Take the model, GPU and engine settings from this scenario (options above override them).",
        metavar="FILE", show_default=False))
    json: bool = field(default=False, metadata=option("Print the budget as JSON.", "--json"))


def capacity(r: CapacityRequest) -> None:
    """Print the budget as a table, or as JSON."""
    import json

    from sim.reporting.capacity import capacity_table
    from sim.reporting.console import esc, out, show

    title, rows = capacity_table(r.model, r.gpu, r.tp, r.seq_len, r.gpu_memory_utilization, r.block_size,
                                 r.max_num_batched_tokens, r.scenario, pp=r.pp, dp=r.dp, ep=r.ep)
    if r.json:
        out(json.dumps({key: value for key, _, value, _ in rows}, indent=2))
        return
    from rich.table import Table

    t = Table(title=esc(title), title_justify="left", show_header=False)
    t.add_column("")
    t.add_column("", justify="right")
    for _, label, _value, shown in rows:
        t.add_row(esc(label), esc(shown))
    show(t)
