"""Lightning and Hugging Face projects measured inside their own Trainer, in real trial children:
the Trainer's precision, accumulation, schedulers, callbacks and clipping are what a trial times."""
import json
import shutil

import pytest
import yaml

from harness import apply
from harness import spec as specs
from tests.conftest import FAST_TRIAL, ROOT
from tests.test_own_models import run, trial

pytest.importorskip("lightning")
# A Trainer's set-up (imports, datamodule, placement) takes seconds on a busy 2-core machine
TRAINER_TRIAL = {**FAST_TRIAL, "timeout": "240s", "stall": "120s"}

SMALL_CHARLM = """\
# LightningCLI config (python -m lightning fit --config config.yaml)
model:
  class_path: charlm.CharLM
  init_args:
    vocab_size: 128
    block_size: 32
    dim: 32
    layers: 2
    heads: 2
    lr: 0.003              # peak of the warm-up + cosine schedule
data:
  class_path: charlm.CharData
  init_args:
    block_size: 32
    batch_size: 8          # per device
trainer:
  precision: 32-true
  accumulate_grad_batches: 1
  gradient_clip_val: 1.0
  max_epochs: 5
  callbacks:
    - class_path: probe.LearningRates
      init_args: {path: lrs.json}
"""

PROBE = """\
import json
import lightning as L

class LearningRates(L.Callback):
    '''The learning rate after every optimizer step, and the run length the schedule was built for.'''
    def __init__(self, path):
        self.path, self.lrs = path, []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        with open(self.path, "w") as f:
            json.dump({"lrs": self.lrs, "total": trainer.estimated_stepping_batches}, f)
"""


def lightning_project(tmp_path, monkeypatch, config=SMALL_CHARLM, **spec):
    folder = tmp_path / "charlm"
    shutil.copytree(ROOT / "examples" / "lightning", folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "config.yaml").write_text(config)
    (folder / "probe.py").write_text(PROBE)
    raw = yaml.safe_load((folder / "sweep.yaml").read_text())
    raw.update(trial=dict(TRAINER_TRIAL), **spec)
    (folder / "sweep.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(folder)
    return folder


def test_a_lightning_module_that_leans_on_its_trainer_trains_in_a_trial_under_bf16_and_accumulation(
        tmp_path, monkeypatch):
    folder = lightning_project(tmp_path, monkeypatch, search={"batch_size": [8], "precision": ["bf16-mixed"]})
    record = trial("batch_size=8", "precision=bf16-mixed", "accumulation=2")
    assert record["status"] == "ok", record.get("error")
    assert record["adapter"]["loop"] == "lightning.Trainer"  # the record says where it ran
    trainer = record["adapter"]["trainer"]
    assert trainer["precision"] == "bf16-mixed" and trainer["accumulate_grad_batches"] == 2
    assert trainer["gradient_clip_val"] == 1.0 and "logs nothing" in trainer["logger"]  # the user's setting kept, logging off
    assert record["adapter"]["trainer_args_set_by_bench"] == ["accumulate_grad_batches", "max_epochs", "precision"]
    # configure_optimizers read self.trainer.estimated_stepping_batches; the per-step LambdaLR warmed up
    # through the user's own callback (from the config's class_path), one reading per micro-batch
    probe = json.loads((folder / "lrs.json").read_text())
    assert probe["total"] == 1_000_000
    lrs = probe["lrs"]
    assert len(lrs) >= record["loss"]["steps"]
    assert lrs[-1] > lrs[0] > 0
    # the first step's loss is the fp32 reference's batch, un-divided by the accumulation
    assert record["loss"]["first"] == pytest.approx(record["loss"]["reference"], rel=0.05)
    assert record["timing"]["measured_steps"] >= 2 and record["throughput"] > 0 and record["peak_memory"] > 0
    # its memory taken apart over one more of the Trainer's steps: fp32 gradients of every weight (no buffers),
    # AdamW's two moments, the saved activations of one micro-batch under autocast
    parts = record["memory"]["breakdown"]
    assert parts["gradients"] == parts["weights"] > 0
    assert parts["optimizer"] == pytest.approx(2 * parts["gradients"], rel=0.01)
    assert 0 < parts["activations"] < record["peak_memory"]


def test_the_lightning_cli_config_is_the_baseline_with_no_apply_keys(tmp_path, monkeypatch):
    lightning_project(tmp_path, monkeypatch, config=SMALL_CHARLM.replace("batch_size: 8 ", "batch_size: 24 "))
    spec = specs.load("sweep.yaml")
    assert [m.key for m in spec.apply.keys["batch_size"]] == ["data.init_args.batch_size"]
    assert [m.key for m in spec.apply.keys["layers"]] == ["model.init_args.layers"]
    assert spec.apply.lr.key == "model.init_args.lr"
    current = apply.read_current(spec.apply)
    assert current == {"batch_size": 24, "accumulation": 1, "precision": "fp32", "layers": 2}
    # 64 cannot make the effective batch of 32: dropped, and said
    assert spec.notes == ("search.batch_size: 64 left out: it does not divide effective_batch 32 (times each nproc)",)



@pytest.mark.usefixtures("all_cores")  # two processes, a core each
def test_a_lightning_project_trains_over_two_processes_in_its_trainers_own_ddp(tmp_path, monkeypatch):
    lightning_project(tmp_path, monkeypatch, search={"batch_size": [8], "nproc": [1, 2], "parallel": ["ddp"]})
    record = trial("batch_size=8", "nproc=2", "parallel=ddp")
    assert record["status"] == "ok", record.get("error")
    assert record["adapter"]["loop"] == "lightning.Trainer"
    trainer = record["adapter"]["trainer"]
    assert trainer["strategy"] == "ddp" and trainer["devices"] == 2  # nproc and parallel as the Trainer's own
    assert record["world_size"] == 2 and record["distributed"]["parallel"] == "ddp"
    first, second = record["distributed"]["param_checksums"]
    assert first == second and first[1] > 0  # the replicas ended equal (and non-empty): the ranks trained one model
    assert record["timing"]["measured_steps"] >= 2 and record["throughput"] > 0
    assert len(record["peak_memory_per_rank"]) == 2


def test_fsdp_inside_the_trainer_is_refused_at_load_saying_what_to_do(tmp_path, monkeypatch):
    lightning_project(tmp_path, monkeypatch, search={"batch_size": [8], "nproc": [2], "parallel": ["ddp", "fsdp"]})
    result = run("sweep", "sweep.yaml", "--device", "cpu")
    assert result.exit_code == 2
    assert "search.parallel: fsdp inside the Trainer is not supported yet" in result.output
    assert "workload.loop: bench" in result.output and "Traceback" not in result.output


BROKEN = """\
import torch.nn.functional as F
from charlm import CharLM


class Broken(CharLM):
    def training_step(self, batch, batch_idx):
        x, y = batch
        vocab = self.trainer.datamodule.vocab_size  # CharData has .vocab, not .vocab_size
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())
"""


def test_a_sweep_whose_trials_all_fail_alike_stops_naming_the_users_line(tmp_path, monkeypatch):
    config = SMALL_CHARLM.replace("charlm.CharLM", "broken.Broken")
    config = config.replace("    batch_size: 8          # per device\n", "")
    folder = lightning_project(tmp_path, monkeypatch, config=config, trials=8, sampler="grid",
                               search={"batch_size": [4, 8], "precision": ["fp32", "bf16-mixed"], "layers": [1, 2]})
    (folder / "broken.py").write_text(BROKEN)
    result = run("sweep", "sweep.yaml", "--device", "cpu")
    assert result.exit_code == 2, result.output
    # before the first trial: the knob the config does not hold, with the key looked for
    assert ("note: your current config: batch_size: looked for data.init_args.batch_size in config.yaml, "
            "not there; the baseline takes batch_size 4") in result.output
    stop = next(line for line in result.output.splitlines() if "stopped:" in line)
    assert "the first 3 trials all failed with AttributeError:" in stop and "vocab_size" in stop
    assert f"(at {folder / 'broken.py'}:8)" in stop and "fix it there and re-run" in stop
    rows = json.loads(run("report", "--format", "json").output)
    assert [r["status"] for r in rows] == ["error"] * 3
    text = run("report").output
    assert "no trial trained: AttributeError:" in text and "no measured config fits" not in text


def hf_project(tmp_path, monkeypatch, **search):
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "hf"
    shutil.copytree(ROOT / "examples" / "hf", folder)
    raw = yaml.safe_load((folder / "sweep.yaml").read_text())
    raw.update(trial=dict(TRAINER_TRIAL))
    raw["search"].update(search)
    (folder / "sweep.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(folder)
    return folder


def test_a_transformers_model_trains_in_transformers_trainer_with_the_users_training_arguments(tmp_path, monkeypatch):
    hf_project(tmp_path, monkeypatch)
    record = trial("batch_size=4", "precision=bf16-mixed", "accumulation=2", "checkpointing=full")
    assert record["status"] == "ok", record.get("error")
    assert record["adapter"]["loop"] == "transformers.Trainer"
    assert record["adapter"]["checkpointing"] == "TrainingArguments.gradient_checkpointing (non-reentrant)"
    assert "per_device_train_batch_size" in record["adapter"]["training_args_set_by_bench"]
    assert "learning_rate" not in record["adapter"]["training_args_set_by_bench"]  # the user's, kept
    assert record["loss"]["first"] == pytest.approx(record["loss"]["reference"], rel=0.05)
    assert record["tokens_per_s"]["median"] == pytest.approx(64 * record["throughput"])


def test_a_trainer_s_step_is_taken_apart_as_bench_s_own_loop_takes_its_step_apart(tmp_path, monkeypatch):
    """The breakdown counted over one more of transformers.Trainer's steps (the gradients as autograd
    accumulates them, the first micro-batch's saved activations) is the one bench's own loop measures on
    the same model, batch and knobs; and it is a measurement: checkpointing cuts the activations."""
    folder = hf_project(tmp_path, monkeypatch)
    inside = trial("batch_size=4", "accumulation=2")
    ckpt = trial("batch_size=4", "accumulation=2", "checkpointing=full")["memory"]["breakdown"]
    raw = yaml.safe_load((folder / "sweep.yaml").read_text())
    raw["workload"]["loop"] = "bench"
    (folder / "sweep.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    own = trial("batch_size=4", "accumulation=2")["memory"]["breakdown"]
    parts = inside["memory"]["breakdown"]
    assert parts["weights"] == own["weights"] > 0
    assert parts["gradients"] == own["gradients"]
    assert 0.99 * parts["weights"] < parts["gradients"] < parts["weights"]  # fp32, every weight trained; a buffer
    assert parts["optimizer"] == pytest.approx(2 * parts["gradients"], rel=0.01)  # AdamW's two moments
    assert parts["activations"] == pytest.approx(own["activations"], rel=0.05)
    assert ckpt["activations"] < 0.5 * parts["activations"]
    assert parts["activations"] < inside["peak_memory"]


@pytest.mark.usefixtures("all_cores")  # two processes, a core each
def test_a_transformers_model_trains_over_two_processes_in_its_trainers_own_ddp(tmp_path, monkeypatch):
    hf_project(tmp_path, monkeypatch, nproc=[1, 2], parallel=["ddp"])
    record = trial("batch_size=4", "nproc=2", "parallel=ddp")
    assert record["status"] == "ok", record.get("error")
    assert record["adapter"]["loop"] == "transformers.Trainer" and record["world_size"] == 2
    first, second = record["distributed"]["param_checksums"]
    assert first == second and first[1] > 0  # transformers' DDP kept the replicas equal
    assert record["tokens_per_s"]["median"] == pytest.approx(64 * record["throughput"])
