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
FSDP is refused with exit 2 (docs/distributed.md); a CPU FSDP2 smoke test shows that the
loop's loss module and train_step already give the DDP result under torch's fully_shard.
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
from conftest import EXAMPLES, ROOT, run_json
from safetensors.torch import load_file

TIMEOUT = 240
ACCELERATE_CONFIGS = ROOT / "examples" / "accelerate"

# Run on every rank (torchrun) or alone. `ddp`: lorapilot.train.train() as the train verb calls
# it, then every rank dumps its own trainable tensors (the run folder stays rank 0's alone).
# `fsdp2`: torch FSDP2 around lorapilot's loss module and train_step, the same data slicing as
# train(); the gathered adapter goes to fsdp2.safetensors.
WORKER = r'''
import sys
from pathlib import Path

from safetensors.torch import save_file

from lorapilot import train as T
from lorapilot.audit import build_adapter
from lorapilot.data.dataset import encode_records, formatter_for, prepare_data
from lorapilot.evaluate.stage import load_base
from lorapilot.spec import load_pilot

mode, pilot_path, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
pilot = load_pilot(pilot_path, sys.argv[4:])
spec, cfg = pilot.spec, pilot.spec.train
state = T.init_distributed() if T.launched_world_size() > 1 else None
rank = state.process_index if state else 0
_, model, tok = load_base(pilot)
prepared = prepare_data(pilot, tok)
fmt = formatter_for(pilot, tok)
train_ex = encode_records(fmt, spec.task, prepared.splits["train"], prepared.answer_budget)
val_ex = encode_records(fmt, spec.task, prepared.splits["val"], prepared.answer_budget)[:8]
pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
model, _ = build_adapter(model, spec.adapter, seed=cfg.seed)
out.mkdir(parents=True, exist_ok=True)

if mode == "ddp":
    result = T.train(model, train_ex, val_ex, cfg, out / "run", pad_id=pad_id, progress=False,
                     log=lambda m: None)
    assert result["world_size"] == (state.num_processes if state else 1), result
    mine = {n: p.detach().cpu().contiguous() for n, p in model.named_parameters() if p.requires_grad}
    save_file(mine, out / f"rank{rank}.safetensors")
else:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.fsdp import fully_shard

    acc = T._accelerator()
    world = acc.num_processes
    T.seed_everything(cfg.seed)
    loss_module = T._LossModule(model)
    layer_classes = set(model.get_base_model()._no_split_modules)
    for m in model.modules():
        if type(m).__name__ in layer_classes:
            fully_shard(m)
    fully_shard(loss_module)
    optimizer = T.make_optimizer(model, cfg)  # after sharding: the parameters are DTensors now
    scheduler = T.make_scheduler(optimizer, cfg.schedule, round(cfg.warmup_ratio * cfg.max_steps),
                                 cfg.max_steps)
    stream = T.MicroBatchStream([e.n_tokens for e in train_ex], cfg.micro_batch, cfg.seed)
    n_targets = [T.example_target_tokens(e) for e in train_ex]
    log = []
    for step in range(cfg.max_steps):  # train()'s slicing: one global list, a slice per rank
        global_mbs = [stream.next() for _ in range(cfg.grad_accum * world)]
        mine = [T.collate([train_ex[i] for i in mb], pad_id) for mb in global_mbs[rank::world]]
        targets = sum(n_targets[i] for mb in global_mbs for i in mb)
        r = T.train_step(loss_module, optimizer, scheduler, mine, targets, cfg.precision,
                         cfg.max_grad_norm, acc, loss_fn=T._call_module)
        log.append({"step": step + 1, "loss": r["loss"], "grad_norm": r["grad_norm"]})
    full = get_model_state_dict(loss_module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        names = {"model." + n for n, p in model.named_parameters() if p.requires_grad}
        save_file({k[len("model."):]: v.contiguous() for k, v in full.items() if k in names},
                  out / "fsdp2.safetensors")
        (out / "fsdp2_steps.json").write_text(__import__("json").dumps(log))

if state is not None:  # leave the group cleanly: a live gloo group at exit can abort
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
           and not k.startswith("ACCELERATE_")}
    return {**env, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT, env=_env(), cwd=cwd)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    return proc


def _torchrun(*args: str, nproc: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(_free_port()), *args]


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
    assert dist["rank0_host"] == rec["host"] and dist["torch"] == torch.__version__ and dist["accelerate"]
    assert out["distributed"] == dist
    assert rec["result"]["train"]["world_size"] == 2
    assert rec["environment"]["libraries"]["torch"]
    ddp_steps = _steps(runs[0])
    assert [s["step"] for s in ddp_steps] == [1, 2, 3]
    assert {"adapter_model.safetensors", "lorapilot.json"} <= {p.name for p in (runs[0] / "adapter").iterdir()}
    assert (runs[0] / "metrics.json").is_file() and (runs[0] / "predictions.jsonl").is_file()

    # The same global batch in one process: micro_batch 2 x grad_accum 2.
    single = run_json("train", str(pilot), "--set", "train.grad_accum=2", "--no-progress", env=_env(),
                      timeout=TIMEOUT)
    assert single["distributed"]["world_size"] == 1 and single["distributed"]["backend"] is None
    single_dir = pilot / "runs" / single["run_id"]
    for d, s in zip(ddp_steps, _steps(single_dir), strict=True):
        assert d["target_tokens"] == s["target_tokens"] and d["tokens"] == s["tokens"]
        assert d["loss"] == pytest.approx(s["loss"], abs=1e-5)
        assert d["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)  # a missing x world shows here
    _assert_same_tensors(_adapter(runs[0]), _adapter(single_dir), atol=1e-5)


def test_accelerate_launch_with_the_example_ddp_config(pilot):
    proc = _run([sys.executable, "-m", "accelerate.commands.launch",
                 "--config_file", str(ACCELERATE_CONFIGS / "ddp_multi_gpu.yaml"), "--num_processes", "2",
                 "-m", "lorapilot", "train", str(pilot), "--json", "--no-progress"])
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
    assert out["run_id"] == run_dir.name and out["status"] == "completed" and out["resumed_from"] == 1
    assert _train_runs(pilot) == [run_dir]
    rec = json.loads((run_dir / "run.json").read_text())
    assert rec["status"] == "completed" and len(rec["result"]["resumes"]) == 1
    _assert_same_tensors(_adapter(run_dir), load_file(run_dir / "checkpoints" / "step-1" / "adapter_model.safetensors"), atol=0)


def test_ddp_ranks_end_with_identical_adapters(pilot, tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    out = tmp_path / "ddp"
    _run(_torchrun(str(tmp_path / "worker.py"), "ddp", str(pilot), str(out)))
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


def test_fsdp2_cpu_smoke_gives_the_ddp_result(pilot, tmp_path):
    """torch 2.13's FSDP2 works on CPUs over gloo; around the loop's own loss module and
    train_step it gives the same adapter as one process over the same global batch."""
    (tmp_path / "worker.py").write_text(WORKER)
    _run(_torchrun(str(tmp_path / "worker.py"), "fsdp2", str(pilot), str(tmp_path / "fsdp")))
    _run([sys.executable, str(tmp_path / "worker.py"), "ddp", str(pilot), str(tmp_path / "single"),
          "train.grad_accum=2"])
    sharded = load_file(tmp_path / "fsdp" / "fsdp2.safetensors")
    single = load_file(tmp_path / "single" / "rank0.safetensors")
    _assert_same_tensors(sharded, single, atol=1e-5)
    fsdp_steps = json.loads((tmp_path / "fsdp" / "fsdp2_steps.json").read_text())
    for f, s in zip(fsdp_steps, _steps(tmp_path / "single" / "run"), strict=True):
        assert f["loss"] == pytest.approx(s["loss"], abs=1e-5)
        assert f["grad_norm"] == pytest.approx(s["grad_norm"], rel=1e-4)


def test_fsdp_is_refused_before_a_run_is_created(pilot):
    out = run_json("train", str(pilot), "--set", "train.distributed=fsdp", expect=2, env=_env())
    assert "train.distributed: fsdp" in out["error"] and "ddp" in out["error"]
    assert not _train_runs(pilot)
    # An accelerate FSDP config (examples/accelerate/fsdp.yaml) is refused the same way.
    out = run_json("train", str(pilot), expect=2, env={**_env(), "ACCELERATE_USE_FSDP": "true"})
    assert "FSDP" in out["error"] and "ddp_multi_gpu.yaml" in out["error"]
    assert not _train_runs(pilot)


def test_example_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    kinds = {}
    for name in ("single_gpu", "ddp_multi_gpu", "multi_node", "fsdp"):
        cfg = load_config_from_file(str(ACCELERATE_CONFIGS / f"{name}.yaml"))
        kinds[name] = str(cfg.distributed_type).split(".")[-1]
        assert cfg.mixed_precision == "no"  # lorapilot applies train.precision itself
    assert kinds == {"single_gpu": "NO", "ddp_multi_gpu": "MULTI_GPU", "multi_node": "MULTI_GPU", "fsdp": "FSDP"}
    multi = load_config_from_file(str(ACCELERATE_CONFIGS / "multi_node.yaml"))
    assert multi.num_machines > 1 and multi.rdzv_backend == "c10d" and multi.main_process_ip


def test_open_run_follower_writes_nothing(tmp_path):
    from lorapilot import registry

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
