"""A trial over several processes (`parallel: ddp | fsdp`): `python -m harness.distributed JOB RESULT`.

This child launches `nproc` ranks through torch's own elastic launcher (`elastic_launch`, what
`torchrun --standalone` runs), with the `spawn` start method, so every rank lives in this child's
process group and dies with it (the parent kills the group). Each rank is a harness.trial Trial
with its process group (gloo on CPU, NCCL on CUDA), its own device, its own shard of the data, and
its model wrapped between checkpointing and compile (harness.transforms): DDP, or FSDP2 in torchtitan's
order, the model built on the meta device, `fully_shard` on every repeated block and then on the root
(mixed precision through MixedPrecisionPolicy), materialised, and filled with rank 0's weights, so no
rank's device ever holds the whole model.

Every rank beats its own heartbeat; this child copies the stalest one to the parent's, so a rank
that hangs stops the trial's progress. Rank 0 gathers every rank's memory and writes the record:
global throughput (batch x accumulation x world size per step), the peak of the fullest rank, each
rank's own figures, and a check that the parameters agree across ranks after training. A failed
trial is reported by the rank that failed first, with that rank's log.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from harness import launch, measure, nvml, record, trial, transforms, workloads

# A collective that fails because another rank died: that rank's failure is the trial's, not this one's.
PEER_PHRASES = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited",
                "nccl communicator was aborted", "ncclremoteerror")
PEER_WAIT_S = 60  # a rank whose peer died waits this long to be stopped, so the launcher reports the peer


class Ranked:
    """What makes several processes one trial, whoever takes the steps (bench's loop or the user's
    Trainer): the meter's figures agreed across ranks, and rank 0's record merged with every rank's."""

    def __init__(self, job: dict, heartbeat: trial.Heartbeat):
        super().__init__(job, heartbeat)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.parallel = self.config["parallel"]
        self.precision_seen = None  # FSDP: the dtypes its weights had (watch_dtypes)

    def across_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def param_checksum(self) -> list[float]:
        """Sum and sum of squares of the full parameters (gathered one at a time under FSDP)."""
        total, squares = torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
        with torch.no_grad():
            for p in self.params:
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                total += full.double().sum().cpu()
                squares += full.double().square().sum().cpu()
        return [float(total), float(squares)]

    def run(self) -> dict:
        rec = super().run()
        mine = {"rank": self.rank, "peak_memory": rec["peak_memory"], "memory": rec["memory"],
                "status": rec["status"], "error": rec["error"], "params": self.param_checksum(),
                "threads": torch.get_num_threads()}
        ranks: list = [None] * self.world
        dist.all_gather_object(ranks, mine)
        return merged(rec, ranks, self.config, self.precision_seen)


class RankTrial(Ranked, trial.Trial):
    """One rank of a trial in bench's loop: the Trial's phases, with the hooks that make the ranks one
    training run (its data shard, DDP or FSDP, gradient sync)."""

    def prepare(self) -> None:
        super().prepare()
        self.wl.dataset = self.my_shard(self.wl.dataset)

    def build_workload(self):
        """FSDP: the workload with its model on the meta device, so no rank ever holds the whole model
        (torchtitan's order: build on meta, fully_shard, materialise). Rank 0 also builds it on the CPU,
        seeded as a one-process trial is: its weights are broadcast into every rank's shards, one
        tensor at a time, and then dropped."""
        if self.parallel != "fsdp":
            return super().build_workload()
        self.full_state = None
        if self.rank == 0:
            source = workloads.build(self.job["workload"]).model
            self.full_state = {**source.state_dict(), **named_buffers(source)}
            del source
        with torch.device("meta"):
            return workloads.build(self.job["workload"])

    def my_shard(self, dataset):
        """This rank's contiguous part of the data: ranks train on different samples, so equal
        parameters afterwards show the gradients really were averaged."""
        per_rank, batch = len(dataset) // self.world, int(self.config["batch_size"])
        if per_rank < batch:
            raise trial.UserFacingError(
                f"each of {self.world} processes gets {per_rank} of the workload's {len(dataset)} samples, "
                f"fewer than batch_size {batch}; lower batch_size or give the workload more samples")
        return torch.utils.data.Subset(dataset, range(self.rank * per_rank, (self.rank + 1) * per_rank))

    def shard(self, model):
        if self.parallel == "ddp":
            from torch.nn.parallel import DistributedDataParallel
            self.ddp = DistributedDataParallel(model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
            return self.ddp
        return model  # FSDP: sharded as it was built (training_model)

    # -- FSDP: built on meta, sharded, materialised ------------------------------------------------
    def reference_pass(self, batch) -> dict | None:
        """DDP: the untouched model, as one process. FSDP: taken from the sharded model in training_model,
        on the dataset's first items."""
        return super().reference_pass(batch) if self.parallel != "fsdp" else None

    def training_model(self) -> torch.nn.Module:
        """FSDP: the reference loss on an fp32 sharded model, then the model that trains: the same one
        for fp32 and tf32, else a twin sharded under its own precision (the fp32 one is freed first)."""
        if self.parallel != "fsdp":
            return super().training_model()
        t0 = time.perf_counter()
        plain = self.precision in ("fp32", "tf32")
        fp32 = self.sharded_model("fp32")
        transforms.set_numerics("fp32", False)
        batch = transforms.to_device(self.sample_batch(self.wl.dataset, self.wl.collate), self.device, False)
        self.reference = self.fp32_loss(fp32, batch)  # not filed for reuse: no rank has the whole weights to key it
        transforms.set_numerics(self.precision, self.config.get("cudnn_benchmark", False))
        if not plain:
            del fp32
            gc.collect()  # FSDP's hooks hold the module in reference cycles
            model = self.sharded_model(self.precision)
        else:
            model = fp32
        self.full_state = None  # rank 0's CPU copy: every rank has its shards now
        # the first steps' window starts over: the fp32 shards and their reference pass are not in it
        measure.release_cached(self.device)
        measure.reset_peak(self.device)
        self.timing["reference_s"] = time.perf_counter() - t0
        self.memory["weights"] = measure.tensor_bytes(list(model.parameters()) + list(model.buffers()))  # this rank's shard
        self.eager = model
        return model

    def sharded_model(self, precision: str) -> torch.nn.Module:
        """A fresh meta build, checkpointed, fully_shard per block and root (mixed precision through
        FSDP2's MixedPrecisionPolicy, bf16-true as bf16 shards), materialised on this rank's device
        and filled from rank 0's weights (torch.distributed.checkpoint's broadcast_from_rank0)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        with torch.device("meta"):
            model = workloads.build(self.job["workload"]).model
        if precision == "bf16-true":
            model = model.to(torch.bfloat16)  # on meta: the shards are made bf16, no fp32 copy ever exists
        model = self.checkpointed(model)
        mesh = init_device_mesh(self.device.type, (self.world,))
        reshard = bool(self.config.get("reshard_after_forward", True))
        if precision in MIXED:  # batch norm keeps fp32 weights beside its fp32 running stats, as under autocast
            for norm in [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]:
                fully_shard(norm, mesh=mesh, reshard_after_forward=reshard)
        for block in [m for m in model.modules() if isinstance(m, self.wl.blocks)]:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mixed_precision(precision))
        # the rest (embeddings, head) as one group; its outputs in fp32, so the loss runs in fp32 as under autocast
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mixed_precision(precision, root=True))
        model.to_empty(device=self.device)
        full = self.full_state or {}
        keys = set(model.state_dict())
        with torch.no_grad():
            set_model_state_dict(model, {k: v for k, v in full.items() if k in keys},
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False))
            for name, buf in named_buffers(model).items():  # buffers are not sharded; non-persistent ones are not in a state dict
                if self.rank == 0:
                    buf.copy_(full[name])
                dist.broadcast(buf, src=0)
        self.precision_seen = watch_dtypes(model, self.wl.blocks)
        return model

    def precision_context(self):
        """FSDP: no autocast; FSDP2 all-gathers the weights in the compute dtype and reduces in fp32."""
        if self.parallel == "fsdp" and self.precision in MIXED:
            return contextlib.nullcontext()
        return super().precision_context()

    def sync_gradients(self, last: bool) -> None:
        """DDP averages gradients at the optimizer step's last micro-batch only, as no_sync() does;
        FSDP reduce-scatters every micro-batch, which keeps gradients sharded (torchtitan's default)."""
        if self.parallel == "ddp":
            self.ddp.require_backward_grad_sync = last



MIXED = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}


def mixed_precision(precision: str, root: bool = False):
    """FSDP2's mixed precision, as torchtitan sets it: weights all-gathered in the compute dtype (so
    the all-gather moves half the bytes, and no autocast copy of each layer's weights lives from
    forward to backward), gradients reduced in fp32, the fp32 shards stepped by the optimizer. The
    root's outputs are cast to fp32, so the workload's loss runs in fp32 as autocast would run it.
    Batch norms are sharded apart with fp32 weights (their running stats are fp32 buffers, which no
    policy casts), as FSDP1's MixedPrecision does by default (`_module_classes_to_ignore`)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy
    dtype = MIXED.get(precision)
    if dtype is None:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if root else None)


def watch_dtypes(model, blocks) -> dict:
    """The dtypes a first block's weight has at rest (the shard) and inside its forward (what
    FSDP all-gathered), read once by a forward hook: the record's proof of the precision used."""
    seen = {}
    block = next((m for m in model.modules() if isinstance(m, blocks)), model)
    weight = next(block.parameters())
    seen["sharded"] = str(weight.dtype)

    def note(module, args):
        seen.setdefault("in_forward", str(next(module.parameters()).dtype))
        handle.remove()
    handle = block.register_forward_pre_hook(note)
    return seen


def named_buffers(model) -> dict:
    """Every buffer under the name a plain build gives it (checkpoint wrappers' prefix left out)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX
    return {name.replace(_CHECKPOINT_PREFIX, ""): b for name, b in model.named_buffers()}


def merged(rec: dict, ranks: list[dict], config: dict, dtypes: dict | None) -> dict:
    """Rank 0's record made the trial's: the fullest rank's peak, every rank's figures, agreement,
    and (FSDP) the dtypes its weights had (watch_dtypes)."""
    backend = dist.get_backend()
    rec = dict(rec, world_size=len(ranks), peak_memory=max(r["peak_memory"] for r in ranks),
               peak_memory_per_rank=[r["peak_memory"] for r in ranks])
    rec["memory"] = dict(rec["memory"], per_rank=[r["memory"] for r in ranks])
    rec["distributed"] = {"parallel": config["parallel"], "backend": backend, "world_size": len(ranks),
                          "reshard_after_forward": config.get("reshard_after_forward") if config["parallel"] == "fsdp" else None,
                          "gradient_sync": "every optimizer step" if config["parallel"] == "ddp" else "every micro-batch",
                          "threads_per_rank": [r["threads"] for r in ranks],
                          "mixed_precision": dtypes,
                          "param_checksums": [r["params"] for r in ranks]}
    bad = next((r for r in ranks if r["status"] != record.OK), None)
    if bad is not None and rec["status"] == record.OK:
        rec.update(status=bad["status"], error=dict(bad["error"], message=f"rank {bad['rank']}: {bad['error']['message']}"))
    apart = next((r["rank"] for r in ranks if r["params"] != ranks[0]["params"]), None)
    if apart is not None and rec["status"] == record.OK:
        rec.update(status=record.DIVERGED, error={"type": "diverged", "message": (
            f"rank {apart}'s parameters differ from rank 0's after training: the gradients were not synchronised")})
    return rec


# ---- a rank ----------------------------------------------------------------------------------------

def rank_main(job_path: str, workdir: str) -> None:
    """One rank (the elastic launcher spawns it with RANK, LOCAL_RANK, WORLD_SIZE and the rendezvous set)."""
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    job = json.loads(Path(job_path).read_text())
    cuda = job["device"].startswith("cuda")
    job = dict(job, device=f"cuda:{local}" if cuda else "cpu", heartbeat=str(rank_beat(workdir, rank)),
               # before set_device below creates this rank's CUDA context: the context is then counted
               # where NVML has no per-process figure (measure.context_reading)
               nvml_used_at_start=nvml.used_bytes(local) if cuda else None)
    hb = trial.Heartbeat(job["heartbeat"])
    hb.beat("start")
    out = Path(workdir) / f"rank{rank}.json"
    try:
        if cuda:
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if cuda else "gloo")
        record.write_atomic(out, rank_class(job)(job, hb).run())
        hb.beat("done")
        dist.destroy_process_group()
        return  # a normal return: the launcher waits for every rank's return value
    except Exception as exc:
        result, code = trial.failed(job, exc)
        peer = is_peer_failure(exc)
        record.write_atomic(out, dict(result, peer_failed=peer))
    sys.stdout.flush()
    sys.stderr.flush()
    if peer:  # let the launcher see the rank that failed first; it stops this one
        time.sleep(PEER_WAIT_S)
    os._exit(code)


def rank_class(job: dict) -> type:
    """A rank of bench's loop, or of the user's Trainer, whose own strategy shares the model (harness.trainer)."""
    if job["workload"].get("loop") == "trainer":
        from harness.trainer import TrainerRank
        return TrainerRank
    return RankTrial


def is_peer_failure(exc: BaseException) -> bool:
    while exc is not None:
        if any(p in str(exc).lower() for p in PEER_PHRASES):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def rank_beat(workdir, rank: int) -> Path:
    return Path(workdir) / f"heartbeat.rank{rank}.json"


# ---- the launcher ----------------------------------------------------------------------------------

def relay_heartbeats(out: str, workdir: Path, nproc: int, stop: threading.Event) -> None:
    """Copy the stalest rank's heartbeat to the parent's, once every rank has beaten: one stuck rank
    is a stuck trial (harness.launch.watch)."""
    while not stop.wait(launch.POLL_S):
        beats = [launch.read_heartbeat(rank_beat(workdir, r)) for r in range(nproc)]
        if all(beats):
            stalest = min(beats, key=lambda b: b["time"])
            tmp = out + ".tmp"
            Path(tmp).write_text(json.dumps(dict(stalest, rank=beats.index(stalest))))
            os.replace(tmp, out)


def rank_log(workdir: Path, rank: int) -> str:
    """A rank's output as the launcher kept it (stdout, then stderr)."""
    files = sorted((workdir / "ranks").glob(f"*/attempt_*/{rank}/stdout.log")) + \
        sorted((workdir / "ranks").glob(f"*/attempt_*/{rank}/stderr.log"))
    return "".join(f.read_text(errors="replace") for f in files)


def outcome(workdir: Path, failure) -> dict:
    """The trial's record: rank 0's when every rank returned, else that of the rank that failed first."""
    if failure is None:
        return record.read(workdir / "rank0.json") or launch.failure(
            record.CRASH, "NoResult", "every rank returned, but rank 0 wrote no record", rank_log(workdir, 0))
    rank, why = failure
    log = rank_log(workdir, rank)
    rec = launch.classify(why.exitcode, record.read(workdir / f"rank{rank}.json"), None, log)
    error = rec.get("error") or {}
    rec["error"] = dict(error, rank=rank, message=f"rank {rank}: {error.get('message')}",
                        log_tail=log[-4000:])  # a fatal error's stack starts some way up: faulthandler lists modules last
    return rec


def launch_ranks(job_path: Path, workdir: Path, nproc: int):
    """Run the ranks; None when all returned, else (rank, ProcessFailure) of the first to fail."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0",  # torchrun --standalone
                          max_restarts=0, monitor_interval=0.1, start_method="spawn", role="rank",
                          logs_specs=DefaultLogsSpecs(log_dir=str(workdir / "ranks"), redirects=Std.ALL, tee=Std.ALL))
    try:
        elastic_launch(config, rank_main)(str(job_path), str(workdir))
    except ChildFailedError as exc:
        return exc.get_first_failure()
    return None


def main(argv: list[str]) -> int:
    job_path, result_path = Path(argv[0]), Path(argv[1])
    job = json.loads(job_path.read_text())
    trial.die_with_parent()
    trial.Heartbeat(job.get("heartbeat")).beat("start")
    nproc, workdir = int(job["config"].get("nproc", 1)), result_path.parent
    # torchrun gives each rank one thread; a rank gets its share of the cores, unless the user said
    os.environ.setdefault("OMP_NUM_THREADS", str(max(len(os.sched_getaffinity(0)) // nproc, 1)))
    stop = threading.Event()
    relay = threading.Thread(target=relay_heartbeats, args=(job["heartbeat"], workdir, nproc, stop), daemon=True)
    relay.start()
    failure = launch_ranks(job_path, workdir, nproc)
    stop.set()
    relay.join()
    result = outcome(workdir, failure)
    record.write_atomic(result_path, result)
    sys.stdout.flush()
    os._exit(record.EXIT_OK if failure is None else record.EXIT_OOM if result["status"] == record.OOM else 1)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
