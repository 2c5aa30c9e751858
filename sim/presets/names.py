"""The names people type for a preset: aliases, Hugging Face repository ids, and "did you mean".

A scenario's `model:` or `hardware:` string (and `--set model=...`, `--gpu ...`) is looked up as
written, then normalised (case, spaces and underscores as hyphens), then among the aliases below
and each model preset's checkpoints on the Hub. A name still unknown is refused with the closest
preset names (difflib, as for keys).
"""
from __future__ import annotations

import difflib

from sim.config.errors import ScenarioError

# model preset -> the Hugging Face repositories of its checkpoints (the first is what `vllm serve`
# loads for it: sim/planning/vllm_command.py); a repository whose config.json has the preset's shape
HF_REPOS: dict[str, tuple[str, ...]] = {
    "llama-2-7b": ("meta-llama/Llama-2-7b-chat-hf", "meta-llama/Llama-2-7b-hf"),
    "llama-2-13b": ("meta-llama/Llama-2-13b-chat-hf", "meta-llama/Llama-2-13b-hf"),
    "llama-2-70b": ("meta-llama/Llama-2-70b-chat-hf", "meta-llama/Llama-2-70b-hf"),
    # (Llama 3.1's 8B and 70B have Llama 3's shapes; they differ in RoPE scaling and context length)
    "llama-3-8b": ("meta-llama/Meta-Llama-3-8B-Instruct", "meta-llama/Meta-Llama-3-8B",
                   "meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B",
                   "meta-llama/Meta-Llama-3.1-8B-Instruct", "meta-llama/Meta-Llama-3.1-8B"),
    "llama-3-70b": ("meta-llama/Meta-Llama-3-70B-Instruct", "meta-llama/Meta-Llama-3-70B",
                    "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B",
                    "meta-llama/Llama-3.3-70B-Instruct", "meta-llama/Meta-Llama-3.1-70B-Instruct"),
    "mistral-7b": ("mistralai/Mistral-7B-Instruct-v0.1", "mistralai/Mistral-7B-v0.1"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
    "qwen2.5-32b": ("Qwen/Qwen2.5-32B-Instruct", "Qwen/Qwen2.5-32B"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
    "llama-3.1-70b-fp8": ("nvidia/Llama-3.1-70B-Instruct-FP8",),
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1"),
    "gpt-oss-20b": ("openai/gpt-oss-20b",),
    "gpt-oss-120b": ("openai/gpt-oss-120b",),
    "qwen3-next-80b-a3b": ("Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"),
}
MODEL_ALIASES = {"llama-3.1-8b": "llama-3-8b", "llama-3.1-70b": "llama-3-70b", "llama-3.3-70b": "llama-3-70b",
                 "llama3-8b": "llama-3-8b", "llama3-70b": "llama-3-70b", "mixtral": "mixtral-8x7b"}
# what nvidia-smi, cloud consoles and spec sheets call them
HARDWARE_ALIASES = {
    "h100": "h100-sxm", "h100-sxm5": "h100-sxm", "h100-80gb": "h100-sxm", "h100-80gb-hbm3": "h100-sxm",
    "nvidia-h100-80gb-hbm3": "h100-sxm", "h100-sxm5-80gb": "h100-sxm",
    "h200-sxm": "h200", "h200-141gb": "h200", "nvidia-h200": "h200",
    "a100": "a100-80gb", "a100-sxm4-80gb": "a100-80gb", "a100-80gb-sxm": "a100-80gb",
    "nvidia-a100-sxm4-80gb": "a100-80gb",
    "l40s-48gb": "l40s", "nvidia-l40s": "l40s", "b200-sxm": "b200", "nvidia-b200": "b200",
    "b300-sxm": "b300", "rtx-pro-6000-blackwell": "rtx-pro-6000",
    "mi300x-192gb": "mi300x", "instinct-mi300x": "mi300x", "instinct-mi325x": "mi325x", "instinct-mi355x": "mi355x",
}


def _normal(name: str) -> str:
    return "-".join(name.strip().lower().replace("_", " ").split())


def resolve(name: str, presets, aliases: dict[str, str], repos: dict[str, tuple[str, ...]] | None,
            where: str, what: str) -> str:
    """The preset `name` means; ScenarioError with the closest names where none."""
    if name in presets:
        return name
    key = _normal(name)
    if key in presets:
        return key
    if key in aliases:
        return aliases[key]
    for preset, ids in (repos or {}).items():
        if any(key == _normal(r) or key == _normal(r.split("/")[-1]) for r in ids):
            return preset
    known = sorted(set(presets) | set(aliases))
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    raise ScenarioError(f"{where}: unknown {what} {name!r}{hint}; presets: {', '.join(sorted(presets))}")


def model_preset(name: str, presets, where: str) -> str:
    return resolve(name, presets, MODEL_ALIASES, HF_REPOS, where, "preset")


def hardware_preset(name: str, presets, where: str, what: str = "preset") -> str:
    return resolve(name, presets, HARDWARE_ALIASES, None, where, what)
