"""Test-only workload that misbehaves on request (never shipped): fault injection for the harness.

`fault` is a workload param the search can vary, so a sweep hits chosen faults on chosen configs.
Faults fire on the `at_step`-th training forward (reference and FLOP-counting passes don't count),
in every process of a trial, or (`fault_rank`) in that rank of a multi-process trial only.
`desync` nudges the parameters of the rank it fires on: ranks whose gradients are averaged still
end up apart, as if they had not been. `steady_ms` makes every training forward sleep that long, so
its windows agree even beside a busy loop: for tests whose subject is not the timing (a study that
must reach its confirmation, a best that must exist) on a loaded CI machine. `ballast_kib` makes
every training forward hold that much memory per sample while it runs (activations without
their compute): with `steady_ms`, a workload whose throughput grows with the batch up to its wall.
`shared_mib` makes the build hold that much shared memory, resident but outside a CPU wall's count.
"""
import ctypes
import json
import mmap
import os
import random
import resource
import signal
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from harness.workloads import Workload

SHARED = []  # shared_mib's mappings, alive for the process
FAULTS = ("none", "segfault", "abort", "raise", "hang", "hang_start", "oom", "exit0", "spam", "grandchild",
          "inf", "build_error", "whoami", "desync", "library_oom", "sigterm")
# What torch raises when a CUDA library cannot get memory, word for word (pytorch
# aten/src/ATen/cuda/Exceptions.h: TORCH_CUDABLAS_CHECK, AT_CUDNN_CHECK; ProcessGroupNCCL's message
# with NCCL's last error), for `fault: library_oom` with `library: ...`.
LIBRARY_OOM = {
    "cublas": "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
    "cudnn": "cuDNN error: CUDNN_STATUS_ALLOC_FAILED",
    "nccl": ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled cuda error (run "
             "with NCCL_DEBUG=INFO for details), NCCL version 2.26.2\nncclUnhandledCudaError: Call to CUDA function "
             "failed.\nLast error:\nCuda failure 2 'out of memory'"),
    # an OOM only where the process already met its memory wall: alone, a plain error
    "cudnn_not_supported": ("cuDNN error: CUDNN_STATUS_NOT_SUPPORTED. This error may appear if you passed in a "
                            "non-contiguous input."),
}


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.fc(x))


class Net(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(width) for _ in range(depth)))
        self.out = nn.Linear(width, width)

    def forward(self, x):
        return self.out(self.blocks(x))


class Pairs(torch.utils.data.Dataset):
    def __init__(self, width, n=1024):
        self.width, self.n = width, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(self.width, generator=g)
        return x, torch.tanh(x.flip(0))


def refault_kib(steps: int = 10) -> int:
    """KiB page-faulted in by a steady training step of a small MLP (2 MiB activations per layer; the
    least of its last five steps): with glibc's own policy a step mostly reuses what the one before
    freed; with every 1 MiB+ block mapped afresh, each step faults in all of its 53 MiB again."""
    model = nn.Sequential(*(nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)))
    opt, x = torch.optim.AdamW(model.parameters()), torch.randn(1024, 512)
    faults = []
    for _ in range(steps):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return min(faults[-5:]) * os.sysconf("SC_PAGE_SIZE") // 1024


def trigger(fault: str, device, library: str = "cublas") -> None:
    if fault == "library_oom":
        raise RuntimeError(LIBRARY_OOM[library])
    if fault == "segfault":
        ctypes.string_at(0)
    elif fault == "abort":
        os.abort()
    elif fault == "raise":
        raise RuntimeError("injected failure in the user's loss")
    elif fault == "hang":
        time.sleep(3600)
    elif fault == "oom":
        hoard = []
        while True:  # grows until the memory wall (RLIMIT_DATA or CUDA fraction) says no
            hoard.append(torch.ones(64 * 1024 * 1024 // 4, device=device))
    elif fault == "exit0":
        os._exit(0)
    elif fault == "sigterm":  # something on the machine (or the user's own code) terminates the trial
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(30)


BUILDS = []
"""Builds of the model in this process, on a device (not the FLOP count's meta copy)."""


def build(params: dict) -> Workload:
    fault, at = params.get("fault", "none"), int(params.get("at_step", 3))
    if params.get("fault_rank") is not None and os.environ.get("RANK") != str(params["fault_rank"]):
        fault = "none"
    width, depth = int(params.get("width", 32)), int(params.get("depth", 2))
    if fault == "build_error":
        raise ValueError("injected: this factory rejects its params")
    if params.get("ballast_kib"):  # each step's ballast mapped and unmapped, so the resident size is what it holds:
        # glibc's default would raise its mmap threshold after the first free (up to 32 MiB) and keep a
        # ballast under that in the heap, where a step's new one could land beside the last (batch 112: 28 MiB twice)
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD, fixed
    if fault == "hang_start":
        time.sleep(3600)
    if fault == "hang_rebuild" and not torch.empty(0).is_meta:  # a CPU trial builds again for its fp32 reference
        BUILDS.append(1)
        if len(BUILDS) == 2:
            time.sleep(3600)
    if params.get("pid_dir") and not torch.empty(0).is_meta:  # which processes a test expects gone afterwards
        with open(os.path.join(params["pid_dir"], f"rank{os.environ.get('RANK', 0)}.pid"), "w") as f:
            f.write(str(os.getpid()))
    if fault == "grandchild" and not torch.empty(0).is_meta:
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(params["pid_file"], "w") as f:
            f.write(str(proc.pid))
    if fault == "whoami" and not torch.empty(0).is_meta and not os.path.exists(params["pid_file"]):
        # how the trial process was started; the first build only (on a CPU the fp32 reference builds again)
        with open(params["pid_file"], "w") as f:
            json.dump({"pid": os.getpid(), "pgid": os.getpgrp(), "sid": os.getsid(0), "ppid": os.getppid(),
                       "threads": torch.get_num_threads(),
                       "refault_kib": refault_kib() if params.get("refault") else None}, f)
    if params.get("shared_mib") and not torch.empty(0).is_meta:
        # shared memory (a DataLoader worker's batches live in it) is resident but not in RLIMIT_DATA's count
        shared = mmap.mmap(-1, int(params["shared_mib"]) * 2**20, flags=mmap.MAP_SHARED)
        for _ in range(int(params["shared_mib"])):  # a MiB at a time: one 64 MiB bytes would be private
            shared.write(b"x" * 2**20)
        SHARED.append(shared)
    if fault == "spam":
        sys.stdout.write(("spam " * 200 + "\n") * 8000)  # ~8 MB of output
        sys.stdout.flush()
    calls, ballast = [0], []

    @torch.compiler.disable  # bookkeeping: compiled, its counter would be a guard that fails every call
    def bookkeeping(model, x):
        if torch.is_grad_enabled() and x.device.type != "meta":
            calls[0] += 1
            if calls[0] == 1 and params.get("first_step_mib"):  # one-off work of the first step, then freed
                torch.ones(int(params["first_step_mib"]) * 2**20 // 4, device=x.device).sum()
            if params.get("steady_ms"):  # a step that is mostly a sleep times steadily on a busy machine
                time.sleep(params["steady_ms"] / 1000)
            if params.get("slow_ms") and calls[0] == at:  # one step that something else on the machine slowed
                time.sleep(params["slow_ms"] / 1000)
            if params.get("ballast_kib"):  # written, so resident: the peak counts it
                ballast[:] = [torch.ones(x.shape[0] * int(params["ballast_kib"]) * 256, device=x.device)]
            if calls[0] == at:
                trigger(fault, x.device, params.get("library", "cublas"))
            if fault == "desync" and calls[0] == at:
                with torch.no_grad():
                    next(model.parameters()).add_(0.5)
        return float("inf") if fault == "inf" and calls[0] >= at else 1.0

    def loss(model, batch):
        x, y = batch
        scale = bookkeeping(model, x)
        out = F.mse_loss(model(x), y) * scale
        ballast.clear()
        return out

    model = Net(width, depth)
    if params.get("unseeded"):  # a factory whose weights differ from build to build (an unseeded RNG)
        with torch.no_grad():
            model.out.bias.add_(random.random())
    return Workload(model=model, dataset=Pairs(width), loss=loss, blocks=(Block,), lr=1e-3)
