"""What a user applies from a plan (`servesim plan --emit DIR`): the `vllm serve` command as a
script, the same engine arguments as a YAML file that `vllm serve MODEL --config FILE` reads, and a
Kubernetes Deployment + Service running the planned replicas.

    files = deploy_files(command, replicas=3, tensor_parallel_size=2, name="chat")
    # {"vllm_serve.sh": ..., "engine_args.yaml": ..., "k8s.yaml": ...}

Everything is derived from the one `vllm serve` line the plan prints (sim/planning/vllm_command.py),
so the three files and the printed command cannot disagree. The manifest uses vLLM's published
OpenAI-compatible server image and its /health endpoint; GPUs per pod = tensor_parallel_size.
A disaggregated plan (a proxy and a KV connector between two pools) gets its commands only.
"""
from __future__ import annotations

import re
import shlex
from typing import Any

import yaml

IMAGE = "vllm/vllm-openai:latest"  # pin the tag your cluster runs; servesim models vLLM 0.32
PORT = 8000                        # vllm serve's default


def engine_args(command: str) -> tuple[str, dict[str, Any]]:
    """'vllm serve MODEL --a 1 --flag --no-b' -> (MODEL, {"a": "1", "flag": True, "b": False}):
    the arguments as `vllm serve --config` reads them (option names without the dashes)."""
    words = shlex.split(command)
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        raise ValueError(f"not a vllm serve command: {command!r}")
    model, rest, args = words[2], words[3:], {}
    i = 0
    while i < len(rest):
        key = rest[i].removeprefix("--")
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            args[key] = _value(rest[i + 1])
            i += 2
        elif key.startswith("no-"):
            args[key[3:]] = False
            i += 1
        else:
            args[key] = True
            i += 1
    return model, args


def _value(text: str) -> Any:
    """A number where the text is one (YAML then writes 4096, 0.9), else the text."""
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*(e-?\d+)?", text):
        return float(text)
    return text


def deploy_files(command: str, replicas: int, tensor_parallel_size: int, name: str) -> dict[str, str]:
    """File name -> text. `command`: the plan's vllm serve line (two commented lines when
    disaggregated: then only the script)."""
    script = "#!/usr/bin/env bash\n# One replica of the planned configuration (servesim plan). " \
             f"Planned: {replicas} replica(s) of {tensor_parallel_size} GPU(s).\nset -euo pipefail\n"
    if not command.startswith("vllm serve"):  # disaggregated pools: a proxy and a KV connector
        return {"vllm_serve.sh": script + command + "\n"}
    model, args = engine_args(command)
    app = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:50] or "servesim"
    labels = {"app": app}
    container = {
        "name": "vllm",
        "image": IMAGE,
        "command": ["vllm", "serve"],
        "args": shlex.split(command)[2:] + ["--port", str(PORT)],
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": tensor_parallel_size},
                      "requests": {"nvidia.com/gpu": tensor_parallel_size}},
        # weights load and CUDA graphs compile before /health answers: minutes for a big model
        "startupProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10,
                         "failureThreshold": 90},
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10},
        "livenessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 30},
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # tensor parallel workers share it
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": app, "labels": dict(labels)},  # (copies: no YAML anchors in the file)
        "spec": {"replicas": replicas, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)},
                              "spec": {"containers": [container],
                                       "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": app, "labels": dict(labels)},
        "spec": {"selector": dict(labels), "ports": [{"port": PORT, "targetPort": PORT, "name": "http"}]},
    }
    header = (f"# servesim plan: {replicas} replica(s) x {tensor_parallel_size} GPU(s), behind one Service.\n"
              f"# The image tag is a placeholder: pin the vLLM version you run.\n")
    return {
        "vllm_serve.sh": script + command + "\n",
        "engine_args.yaml": f"# vllm serve {model} --config engine_args.yaml\n"
                            + yaml.safe_dump(args, sort_keys=False),
        "k8s.yaml": header + yaml.safe_dump_all([deployment, service], sort_keys=False),
    }
