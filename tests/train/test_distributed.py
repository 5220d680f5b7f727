"""Distributed training on CPUs: torchrun / accelerate launch, 2 processes over gloo.

What DDP must guarantee, checked end to end:
- one run folder, written by rank 0 only, recording world size, backend and versions;
- exactly one JSON object on stdout (every rank runs the CLI);
- every rank ends with the same adapter;
- the result equals a single-process run over the same global batch. 2 ranks x micro_batch 2
  is compared with 1 process x micro_batch 2 x grad_accum 2 (not micro_batch 4: the
  length-grouped micro-batches are cut per micro_batch size, so micro_batch 4 would put
  other examples in each step). The logged grad_norm catches a missing world-size factor
  in the loss normalisation (DDP averages gradients over ranks), which Adam's scale
  invariance would mostly hide in the weights.
FSDP (`train.distributed: fsdp`, torch's fully_shard inside the same loop) must give the same
result, write the same files as a single process (gathered on every rank, written by rank 0)
and resume from its own checkpoints; an accelerate FSDP launcher config is refused (exit 2).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import EXAMPLES, ROOT, run_cli, run_json
from safetensors.torch import load_file

TIMEOUT = 240
ACCELERATE_CONFIGS = ROOT / "examples" / "accelerate"

# Run on every rank (torchrun) or alone: lorapilot.train.loop.train() as the train verb calls
# it, then
# every rank dumps its own trainable tensors (the run folder stays rank 0's alone).
WORKER = r"""
import sys
from pathlib import Path

from safetensors.torch import save_file

from lorapilot.train import distributed as D
from lorapilot.train.loop import train
from lorapilot.base.adapter import build_adapter
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.base.models import load_base
from lorapilot.spec import load_pilot

pilot_path, out = sys.argv[1], Path(sys.argv[2])
pilot = load_pilot(pilot_path, sys.argv[3:])
spec, cfg = pilot.spec, pilot.spec.train
state = D.init_distributed() if D.launched_world_size() > 1 else None
rank = state.process_index if state else 0
_, model, tok = load_base(pilot)
prepared = prepare_data(pilot, tok)
fmt = formatter_for(pilot, tok)
train_ex = encode_records(fmt, spec.task, prepared.splits["train"], prepared.answer_budget)
val_ex = encode_records(fmt, spec.task, prepared.splits["val"], prepared.answer_budget)[:8]
pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
model, _ = build_adapter(model, spec.adapter, seed=cfg.seed)
out.mkdir(parents=True, exist_ok=True)

result = train(model, train_ex, val_ex, cfg, out / "run", pad_id=pad_id, progress=False,
                 log=lambda m: None)
assert result.world_size == (state.num_processes if state else 1), result
mine = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
save_file(mine, out / f"rank{rank}.safetensors")

if state is not None:  # leave the group cleanly: a live gloo group at exit can abort
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "LOCAL_WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
        and not k.startswith("ACCELERATE_")
    }
    return {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=cwd)
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    )
    return proc


def _torchrun(*args: str, nproc: int = 2) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_port",
        str(_free_port()),
        *args,
    ]


def _one_json(stdout: str) -> dict:
    """stdout must be exactly one JSON object (the CLI contract), whatever the ranks printed."""
    return json.loads(stdout)


@pytest.fixture(scope="module")
def pilot_template(tmp_path_factory, tiny_model_dir) -> Path:
    """ticket-triage on the tiny model: fp32, 3 steps of micro_batch 2, no dropout."""
    pilot = tmp_path_factory.mktemp("dist") / "ticket-triage"
    shutil.copytree(EXAMPLES / "ticket-triage", pilot, ignore=shutil.ignore_patterns("runs"))
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"] = {"base": str(tiny_model_dir)}
    spec["adapter"]["dropout"] = 0.0
    spec["train"].update(precision="fp32", max_steps=3, micro_batch=2, grad_accum=1, lr=0.01)
    spec["eval"].update(batch_size=8, precision="fp32")
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return pilot


@pytest.fixture
def pilot(pilot_template, tmp_path) -> Path:
    dest = tmp_path / "ticket-triage"
    shutil.copytree(pilot_template, dest)
    return dest


def _train_runs(pilot: Path) -> list[Path]:
    return sorted((pilot / "runs").glob("train-*"))


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]


def _adapter(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "adapter" / "adapter_model.safetensors")


def _assert_same_tensors(a: dict, b: dict, atol: float) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=0, atol=atol), (k, float((a[k] - b[k]).abs().max()))


def test_torchrun_two_ranks_one_run_matching_single_process(pilot):
    proc = _run(_torchrun("-m", "lorapilot", "train", str(pilot), "--json", "--no-progress"))
    out = _one_json(proc.stdout)
    assert out["status"] == "completed" and out["steps"] == 3
    runs = _train_runs(pilot)
    assert [r.name for r in runs] == [out["run_id"]]  # rank 1 created no run of its own
    rec = json.loads((runs[0] / "run.json").read_text())
    assert rec["status"] == "completed"
    dist = rec["result"]["distributed"]
    assert dist["world_size"] == 2 and dist["backend"] == "gloo" and dist["mode"] == "ddp"
    assert (
        dist["rank0_host"] == rec["host"]
        and dist["torch"] == torch.__version__
        and dist["accelerate"]
    )
    assert out["distributed"] == dist
    assert rec["result"]["train"]["world_size"] == 2
    # each rank trains through its rows' shared prefix once, inside the module DDP wraps
    assert rec["result"]["train"]["prefix"]["path"] == "shared", rec["result"]["train"]["prefix"]
    assert rec["environment"]["libraries"]["torch"]
    ddp_steps = _steps(runs[0])
    assert [s["step"] for s in ddp_steps] == [1, 2, 3]
    assert {"adapter_model.safetensors", "lorapilot.json"} <= {
        p.name for p in (runs[0] / "adapter").iterdir()
    }
    assert (runs[0] / "metrics.json").is_file() and (runs[0] / "predictions.jsonl").is_file()

    # The same global batch in one process: micro_batch 2 x grad_accum 2.
    single = run_json(
        "train",
        str(pilot),
        "--set",
        "train.grad_accum=2",
        "--no-progress",
        env=_env(),
        timeout=TIMEOUT,
    )
    assert single["distributed"]["world_size"] == 1 and single["distributed"]["backend"] is None
    single_dir = pilot / "runs" / single["run_id"]
    for d, s in zip(ddp_steps, _steps(single_dir), strict=True):
        assert d["target_tokens"] == s["target_tokens"] and d["tokens"] == s["tokens"]
        assert d["loss"] == pytest.approx(s["loss"], abs=1e-5)
        assert d["grad_norm"] == pytest.approx(
            s["grad_norm"], rel=1e-4
        )  # a missing x world shows here
    _assert_same_tensors(_adapter(runs[0]), _adapter(single_dir), atol=1e-5)


def test_accelerate_launch_with_the_example_ddp_config(pilot):
    proc = _run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ACCELERATE_CONFIGS / "ddp_multi_gpu.yaml"),
            "--num_processes",
            "2",
            "-m",
            "lorapilot",
            "train",
            str(pilot),
            "--json",
            "--no-progress",
        ]
    )
    out = _one_json(proc.stdout)
    runs = _train_runs(pilot)
    assert [r.name for r in runs] == [out["run_id"]] and out["status"] == "completed"
    assert out["distributed"]["world_size"] == 2 and out["distributed"]["backend"] == "gloo"


def test_ddp_stop_at_limit_then_resume_keeps_one_run(pilot):
    """A limit stops both ranks with a checkpoint; --resume under torchrun finishes the same run
    (rank 0 picks the checkpoint, every rank loads it)."""
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["train"]["max_steps"] = 1
    spec["limits"]["time_hours"] = 1e-7  # reached during the first step
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = ["-m", "lorapilot", "train", str(pilot), "--json", "--no-progress"]
    _run(_torchrun(*cmd))
    (run_dir,) = _train_runs(pilot)
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "stopped_by_limit" and rec["result"]["distributed"]["world_size"] == 2
    assert (run_dir / "checkpoints" / "step-1").is_dir()
    out = _one_json(_run(_torchrun(*cmd, "--resume", run_dir.name)).stdout)
    assert (
        out["run_id"] == run_dir.name and out["status"] == "completed" and out["resumed_from"] == 1
    )
    assert _train_runs(pilot) == [run_dir]
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "completed" and len(rec["result"]["resumes"]) == 1
    _assert_same_tensors(
        _adapter(run_dir),
        load_file(run_dir / "checkpoints" / "step-1" / "adapter_model.safetensors"),
        atol=0,
    )


def test_ddp_ranks_end_with_identical_adapters(pilot, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "ddp"
    _run(_torchrun(str(tmp_path / "worker.py"), str(pilot), str(out)))
    rank0, rank1 = load_file(out / "rank0.safetensors"), load_file(out / "rank1.safetensors")
    assert rank0 and rank0.keys() == rank1.keys()
    for k in rank0:
        assert torch.equal(rank0[k], rank1[k]), k  # DDP: identical gradients, identical steps
    assert any(v.abs().max() > 0 for k, v in rank0.items() if "lora_B" in k)  # it did train
    # Only rank 0 wrote the run folder, and its adapter is the ranks' adapter.
    saved = load_file(out / "run" / "adapter" / "adapter_model.safetensors")
    assert len(saved) == len(rank0)
    for k, v in rank0.items():
        assert torch.equal(saved[k.replace(".default.", ".")], v), k


def test_fsdp_matches_single_process_writes_its_files_and_resumes(pilot):
    """torchrun + train.distributed: fsdp, sharded with torch's fully_shard: one run recording
    fsdp / 2 / gloo, the same steps, validation losses, adapter and checkpoint files as one
    process over the same global batch; then a kill -9 after the step-1 checkpoint and --resume
    end with the uninterrupted run's adapter.

    micro_batch 4 cuts the 108 validation examples into 27 chunks, so one rank runs a padding
    forward (a rank skipping it would hang the other); max_grad_norm 0.1 makes clipping act on
    the sharded gradients (the logged norms are about 0.4). Tolerance 1e-5, as for DDP: the
    gradient norm is summed from shards in another order (measured 1e-7 apart), which moves
    the clip factor and so the weights by float32 rounding (measured 1.5e-8)."""
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["train"].update(
        distributed="fsdp", max_steps=2, micro_batch=4, max_grad_norm=0.1, save_every=1
    )
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    cmd = ["-m", "lorapilot", "train", str(pilot), "--json", "--no-progress"]
    out = _one_json(_run(_torchrun(*cmd)).stdout)
    assert out["status"] == "completed" and out["steps"] == 2
    (run_dir,) = _train_runs(pilot)
    rec = json.loads((run_dir / "run.json").read_text())
    dist = rec["result"]["distributed"]
    assert (dist["mode"], dist["requested"], dist["world_size"], dist["backend"]) == (
        "fsdp",
        "fsdp",
        2,
        "gloo",
    )
    assert out["distributed"] == dist and rec["result"]["train"]["world_size"] == 2
    # AdamW's fused kernel steps FSDP's sharded tensors (torch's default loops over them)
    assert out["optimizer"] == {"name": "adamw", "implementation": "fused"}
    assert (run_dir / "metrics.json").is_file()  # rank 0 evaluated the reloaded adapter
    # each rank trains through its rows' shared prefix once, inside the module FSDP shards
    assert rec["result"]["train"]["prefix"]["path"] == "shared", rec["result"]["train"]["prefix"]
    assert rec["result"]["train"]["prefix"]["shared_micro_batches"] > 0

    # fsdp without a launcher: one process, unsharded, with a note; here the reference run.
    proc = run_cli(
        "train",
        str(pilot),
        "--set",
        "train.grad_accum=2",
        "--json",
        "--no-progress",
        env=_env(),
        timeout=TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "train.distributed is fsdp but one process was launched" in proc.stderr
    single = json.loads(proc.stdout)
    assert (single["distributed"]["mode"], single["distributed"]["world_size"]) == ("none", 1)
    single_dir = pilot / "runs" / single["run_id"]
    for f, s in zip(_steps(run_dir), _steps(single_dir), strict=True):
        assert f["target_tokens"] == s["target_tokens"] and f["loss"] == pytest.approx(
            s["loss"], abs=1e-5
        )
        assert f["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4) and f["grad_norm"] > 0.1
    val = [json.loads(line) for line in (run_dir / "val.jsonl").read_text().splitlines()]
    single_val = [json.loads(line) for line in (single_dir / "val.jsonl").read_text().splitlines()]
    assert [v["step"] for v in val] == [v["step"] for v in single_val] == [0, 2]
    assert [v["val_loss"] for v in val] == pytest.approx(
        [v["val_loss"] for v in single_val], abs=1e-6
    )
    adapter = _adapter(run_dir)
    _assert_same_tensors(adapter, _adapter(single_dir), atol=1e-5)
    # The checkpoint is the single-process format: same files, tensors, optimizer layout.
    ckpt, single_ckpt = run_dir / "checkpoints" / "step-2", single_dir / "checkpoints" / "step-2"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(p.name for p in single_ckpt.iterdir())
    _assert_same_tensors(
        load_file(ckpt / "optimizer.safetensors"),
        load_file(single_ckpt / "optimizer.safetensors"),
        atol=1e-5,
    )
    state, single_state = (json.loads((c / "state.json").read_text()) for c in (ckpt, single_ckpt))
    for key in (
        "param_names",
        "optimizer",
        "scheduler",
        "step",
        "epoch",
        "batch_index",
        "data_hash",
    ):
        assert state[key] == single_state[key], key

    # A kill -9 after the step-1 checkpoint leaves: status running (its pid gone), no step-2
    # checkpoint, no adapter. --resume loads step 1 into the shards and trains step 2.
    shutil.rmtree(run_dir / "checkpoints" / "step-2")
    shutil.rmtree(run_dir / "adapter")
    rec["status"] = "running"
    (run_dir / "run.json").write_text(json.dumps(rec))
    out = _one_json(_run(_torchrun(*cmd, "--resume", run_dir.name)).stdout)
    assert (
        out["run_id"] == run_dir.name and out["status"] == "completed" and out["resumed_from"] == 1
    )
    assert _train_runs(pilot) == sorted([run_dir, single_dir])
    assert [s["step"] for s in _steps(run_dir)] == [1, 2]
    _assert_same_tensors(_adapter(run_dir), adapter, atol=0)  # resuming is exact


def test_accelerate_fsdp_config_is_refused_before_a_run_is_created(pilot):
    # examples/accelerate/fsdp.yaml sets this: accelerate would wrap the model its own way.
    out = run_json("train", str(pilot), expect=2, env={**_env(), "ACCELERATE_USE_FSDP": "true"})
    assert "FSDP" in out["error"] and "train.distributed: fsdp" in out["error"]
    assert not _train_runs(pilot)


def test_example_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {}
    for name in ("single_gpu", "ddp_multi_gpu", "multi_node", "fsdp"):
        cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
        kinds[name] = str(cfg.distributed_type).split(".")[-1]
        assert cfg.mixed_precision == "no"  # lorapilot applies train.precision itself
    assert kinds == {
        "single_gpu": "NO",
        "ddp_multi_gpu": "MULTI_GPU",
        "multi_node": "MULTI_GPU",
        "fsdp": "FSDP",
    }
    multi = load_config_from_file(str(ACCELERATE_CONFIGS / "multi_node.yaml"))
    assert multi.num_machines > 1 and multi.rdzv_backend == "c10d" and multi.main_process_ip


def test_open_run_follower_writes_nothing(tmp_path):
    from lorapilot.records import registry

    with registry.open_run(tmp_path, "train") as lead:
        with registry.open_run(tmp_path, "train", run_id=lead.id, write=False) as follower:
            follower.update(anything=1)
        assert follower.record.status == "completed"
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [lead.id]
    rec = json.loads((tmp_path / "runs" / lead.id / "run.json").read_text())
    assert "anything" not in rec["result"] and rec["status"] == "completed"
    with pytest.raises(ValueError):
        with registry.open_run(tmp_path, "train", write=False):
            pass


def test_ddp_on_a_4bit_base_matches_one_process(pilot):
    """QLoRA under torchrun (gloo, 2 ranks): each rank loads the base quantized to NF4 on its
    own device; one run, audited with its quantization state, with the same losses as one
    process over the same global batch."""
    spec = yaml.safe_load((pilot / "pilot.yaml").read_text())
    spec["model"]["quantization"] = {"bits": 4, "compute_dtype": "fp32"}
    (pilot / "pilot.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    out = _one_json(_run(_torchrun("-m", "lorapilot", "train", str(pilot), "--json",
                                   "--no-progress")).stdout)  # fmt: skip
    assert out["status"] == "completed" and out["distributed"]["world_size"] == 2
    assert out["update_audit"]["ok"] and out["update_audit"]["quant_state"]["tensors"] > 0
    assert out["base_identity"]["quantization"]["bits"] == 4
    assert [r.name for r in _train_runs(pilot)] == [out["run_id"]]
    single = run_json("train", str(pilot), "--set", "train.grad_accum=2", "--no-progress",
                      env=_env(), timeout=TIMEOUT)  # fmt: skip
    ddp_steps, one_steps = (
        _steps(pilot / "runs" / out["run_id"]),
        _steps(pilot / "runs" / single["run_id"]),
    )
    for d, s in zip(ddp_steps, one_steps, strict=True):
        assert d["target_tokens"] == s["target_tokens"]
        assert d["loss"] == pytest.approx(s["loss"], abs=1e-5)
