"""Clocks and probes the trial child reads: memory (CUDA allocator, NVML, CPU RSS), FLOPs, MFU, env.

Every figure here is read from the device, the allocator or the kernel; nothing is estimated.
"""
from __future__ import annotations

import os
import platform
import resource
import socket
import statistics
import time

import torch

from harness import __version__

# Nominal dense peak TFLOP/s from NVIDIA datasheets (no sparsity), by precision class. Checked in
# order, so more specific names come first. Unknown devices and CPUs get no MFU, never a guess.
PEAK_TFLOPS = [
    ("H200", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}),
    ("H100 PCIe", {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0}),
    ("H100", {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}),
    ("A100", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}),
    ("L40S", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1}),
    ("L4", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0}),
    ("A10", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0}),
    ("RTX 4090", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2}),
    ("RTX 3090", {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0}),
    ("RTX A6000", {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8}),
    ("V100", {"fp32": 15.7, "tf32": 15.7, "bf16": 125.0}),  # no bf16 units: fp16 tensor-core peak
]


def sync(device: torch.device) -> None:
    """Wait for queued device work, so a clock read after it covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device) -> float:
    sync(device)
    return time.perf_counter()


def spread(values: list[float]) -> dict:
    """Median, p10, p90 and coefficient of variation of a list of measurements."""
    ordered = sorted(values)
    mean = statistics.fmean(ordered)
    cv = statistics.stdev(ordered) / mean if len(ordered) > 1 and mean > 0 else 0.0
    return {"median": statistics.median(ordered), "p10": _quantile(ordered, 0.1),
            "p90": _quantile(ordered, 0.9), "cv": cv, "n": len(ordered)}


def _quantile(ordered: list[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


# ---- CPU memory ---------------------------------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss_bytes() -> int:
    """The process's high-water resident memory (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vm_data_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("VmData missing from /proc/self/status")


def limit_cpu_memory(budget: int) -> None:
    """A real memory wall: allocations past `budget` above today's data segment fail with ENOMEM.

    RLIMIT_DATA (not RLIMIT_AS) because torch maps ~640 MiB of address space just to import.
    """
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data_bytes() + budget, hard))


def lift_cpu_memory_limit() -> None:
    """After an OOM the record still has to be written: give the memory back."""
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (hard, hard))


# ---- CUDA memory --------------------------------------------------------------------------------

def nvml_used_bytes(index: int) -> int | None:
    """Device memory in use as the driver sees it (every process, CUDA contexts included).

    `index` is the CUDA index; NVML numbers every GPU of the machine, so map it through
    CUDA_VISIBLE_DEVICES (indices or UUIDs; the launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID so
    both number GPUs alike).
    """
    try:
        import pynvml
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entry = visible.split(",")[index].strip() if visible else str(index)
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(entry))
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # no driver or no NVML: the allocator's figures still stand
        return None


def nvml_process_bytes(index: int) -> int | None:
    """Device memory NVML charges to this process (context included), or None where it cannot tell."""
    try:
        import pynvml
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        entry = visible.split(",")[index].strip() if visible else str(index)
        handle = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                  else pynvml.nvmlDeviceGetHandleByUUID(entry))
        mine = [p.usedGpuMemory for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
        return int(mine[0]) if mine and mine[0] is not None else None
    except Exception:  # no driver, no NVML, or a container that hides PIDs
        return None


def start_cuda(device: torch.device) -> dict:
    """Create the CUDA context and measure what it costs outside the caching allocator."""
    index = device.index or 0
    before = nvml_used_bytes(index)
    torch.cuda.set_device(index)
    torch.empty(1, device=device)  # forces context + library load
    torch.cuda.synchronize(device)
    after = nvml_used_bytes(index)
    reserved = torch.cuda.memory_reserved(device)
    context = max(after - before - reserved, 0) if before is not None and after is not None else None
    return {"context_bytes": context, "device_total": torch.cuda.get_device_properties(device).total_memory}


def limit_cuda_memory(device: torch.device, budget: int, context_bytes: int | None) -> None:
    """Cap the allocator so that allocator + context stay under `budget`: a real OutOfMemoryError."""
    total = torch.cuda.get_device_properties(device).total_memory
    usable = budget - (context_bytes or 0)
    torch.cuda.set_per_process_memory_fraction(max(min(usable / total, 1.0), 0.0), device)


def cuda_memory(device: torch.device, context_bytes: int | None) -> dict:
    stats = torch.cuda.memory_stats(device)
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "alloc_retries": stats.get("num_alloc_retries", 0),
        "num_ooms": stats.get("num_ooms", 0),
        "context_bytes": context_bytes,
        "nvml_used": nvml_used_bytes(device.index or 0),
        "nvml_process_used": nvml_process_bytes(device.index or 0),
        "device_total": torch.cuda.get_device_properties(device).total_memory,
    }


# ---- breakdown ----------------------------------------------------------------------------------

def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among `tensors` (views and shared storages counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        key = (storage.data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


def saved_activation_bytes(forward) -> int:
    """Run `forward()` and sum what autograd saves for backward: the activation memory it holds."""
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        forward()  # the graph (and what it saved) is dropped as soon as the result is
    return tensor_bytes(saved)


# ---- FLOPs and MFU ------------------------------------------------------------------------------

def _register_cpu_sdpa_flops() -> None:
    """FlopCounterMode does not know the CPU flash-attention kernels; teach it (same formulas)."""
    from torch.utils import flop_counter as fc
    aten = torch.ops.aten
    ops = [getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None),
           getattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None)]
    if None in ops or ops[0] in fc.flop_registry:
        return
    fc.register_flop_formula(ops[0])(lambda q, k, v, *a, out_shape=None, **kw: fc.sdpa_flop_count(q, k, v))
    fc.register_flop_formula(ops[1])(
        lambda g, q, k, v, *a, out_shape=None, **kw: fc.sdpa_backward_flop_count(g, q, k, v))


def count_flops(fwd_bwd) -> int:
    """FLOPs of one forward+backward, counted op by op from shapes by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode
    _register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        fwd_bwd()
    return int(counter.get_total_flops())


def peak_tflops(device_name: str, precision: str) -> float | None:
    kind = "bf16" if precision in ("bf16-mixed", "fp16-mixed", "bf16-true") else precision
    for name, peaks in PEAK_TFLOPS:
        if name in device_name:
            return peaks.get(kind)
    return None


# ---- environment ----------------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def env_stamp(device: torch.device) -> dict:
    """Where a record was measured, so it can be trusted (or not) later."""
    import psutil
    stamp = {
        "torch": torch.__version__, "python": platform.python_version(), "os": platform.platform(),
        "hostname": socket.gethostname(), "bench": __version__, "cpu": cpu_model(),
        "cpu_count": os.cpu_count(), "host_memory": psutil.virtual_memory().total,
        "cuda": torch.version.cuda, "driver": None,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        stamp.update(device=props.name, device_count=torch.cuda.device_count(), device_total=props.total_memory,
                     capability=f"{props.major}.{props.minor}", driver=_driver_version())
    else:
        stamp.update(device=stamp["cpu"], device_count=1, device_total=stamp["host_memory"])
    return stamp


def _driver_version() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None


