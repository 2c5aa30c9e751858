"""`servesim plan --emit DIR` (sim/planning/deploy.py): files a user applies, derived from the one
vllm serve line, each parsed and checked for the fields its reader requires (no kubectl here)."""
import shlex
from pathlib import Path

import yaml
from typer.testing import CliRunner

from cli import app
from sim.planning.deploy import deploy_files, engine_args

ROOT = Path(__file__).resolve().parents[2]
LINE = ("vllm serve meta-llama/Meta-Llama-3-8B-Instruct --tensor-parallel-size 2 --max-num-seqs 128 "
        "--max-num-batched-tokens 4096 --gpu-memory-utilization 0.9 --block-size 16 --enable-chunked-prefill "
        "--no-enable-prefix-caching --speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 4}'")


def check_manifest(text: str, replicas: int, gpus: int, line: str) -> None:
    """A Deployment and a Service with the fields Kubernetes requires, wired to each other."""
    docs = list(yaml.safe_load_all(text))
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    dep, svc = docs
    for d in docs:
        assert d["apiVersion"] and d["metadata"]["name"]
    spec = dep["spec"]
    assert spec["replicas"] == replicas
    assert spec["selector"]["matchLabels"] == spec["template"]["metadata"]["labels"] == svc["spec"]["selector"]
    (c,) = spec["template"]["spec"]["containers"]
    assert c["name"] and c["image"] and c["resources"]["limits"]["nvidia.com/gpu"] == gpus
    assert c["command"] + c["args"][:-2] == shlex.split(line) and c["args"][-2:] == ["--port", "8000"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert svc["spec"]["ports"][0]["targetPort"] == c["ports"][0]["containerPort"] == 8000
    mounts = {m["name"] for m in c["volumeMounts"]}
    assert mounts <= {v["name"] for v in spec["template"]["spec"]["volumes"]}


def test_the_engine_args_and_the_manifest_say_what_the_command_says():
    model, args = engine_args(LINE)
    assert model == "meta-llama/Meta-Llama-3-8B-Instruct"
    assert args == {"tensor-parallel-size": 2, "max-num-seqs": 128, "max-num-batched-tokens": 4096,
                    "gpu-memory-utilization": 0.9, "block-size": 16, "enable-chunked-prefill": True,
                    "enable-prefix-caching": False,
                    "speculative-config": '{"method": "ngram", "num_speculative_tokens": 4}'}
    files = deploy_files(LINE, replicas=3, tensor_parallel_size=2, name="Chat Llama3")
    assert yaml.safe_load(files["engine_args.yaml"]) == args
    assert files["vllm_serve.sh"].rstrip().endswith(LINE)
    check_manifest(files["k8s.yaml"], 3, 2, LINE)
    assert yaml.safe_load_all(files["k8s.yaml"]).__next__()["metadata"]["name"] == "chat-llama3"
    disaggregated = "# 1 x prefill: vllm serve m --kv-transfer-config '{}'\n# 3 x decode: vllm serve m"
    assert list(deploy_files(disaggregated, 1, 1, "x")) == ["vllm_serve.sh"]


def test_plan_emit_writes_the_files_of_its_answer(tmp_path):
    emit = tmp_path / "deploy"
    result = CliRunner().invoke(app, ["plan", str(ROOT / "scenarios" / "quickstart.yaml"), "--slo", "ttft_ms=500",
                                      "--target-rate", "10", "--seeds", "1", "--no-band", "--min-requests", "300",
                                      "--horizon-s", "10", "--resolution", "0.1",  # (a small plan: its files are tested)
                                      "--out", str(tmp_path / "plan"), "--emit", str(emit), "--quiet"])
    assert result.exit_code == 0, result.output
    import json

    rec = json.loads((tmp_path / "plan" / "plan.json").read_text())["recommendation"]
    assert sorted(p.name for p in emit.iterdir()) == ["engine_args.yaml", "k8s.yaml", "vllm_serve.sh"]
    # the launch script runs as ./vllm_serve.sh: executable wherever it is readable (the umask's say)
    import os
    import stat
    script, config = (emit / "vllm_serve.sh").stat().st_mode, (emit / "k8s.yaml").stat().st_mode
    assert script & stat.S_IXUSR and not config & stat.S_IXUSR
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(script) == 0o777 & ~umask and stat.S_IMODE(config) == 0o666 & ~umask
    check_manifest((emit / "k8s.yaml").read_text(), rec["replicas"], rec["tensor_parallel_size"], rec["vllm_serve"])


def test_an_emit_folder_that_is_a_file_is_refused_by_its_own_flag_before_planning(tmp_path):
    (tmp_path / "file").write_text("mine\n")
    result = CliRunner().invoke(app, ["plan", str(ROOT / "scenarios" / "quickstart.yaml"), "--slo", "ttft_ms=500",
                                      "--out", str(tmp_path / "plan"), "--emit", str(tmp_path / "file")])
    assert result.exit_code == 2
    assert result.stderr.strip() == f"error: --emit {tmp_path / 'file'}: exists and is not a directory"
    assert (tmp_path / "file").read_text() == "mine\n" and not (tmp_path / "plan").exists()
