"""Clocks and probes the trial child reads: memory (CUDA allocator, NVML through harness.nvml, CPU RSS),
FLOPs, MFU, env.

Every figure here is read from the device, the allocator or the kernel; nothing is estimated.
"""
from __future__ import annotations

import ctypes
import functools
import os
import platform
import resource
import socket
import statistics
import time

import torch

from harness import __version__, nvml
from harness.doctor import cpu_model  # one reading of it: the study's header and the records agree

# Nominal dense peak TFLOP/s from NVIDIA datasheets (no sparsity), by precision class, keyed by the
# exact device name NVML and CUDA report. Names differ by a suffix between parts with different peaks
# (H100 80GB HBM3 vs H100 NVL, L40 vs L40S), so nothing matches by substring; a device not listed
# here (A10G included: NVIDIA publishes no datasheet for it) and CPUs get no MFU, never a guess.
_H100_SXM = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4}
_NVL = {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5}  # H100 NVL / H200 NVL: 835/1671 TF with sparsity
_A100 = {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0}
_V100_SXM2 = {"fp32": 15.7, "tf32": 15.7, "bf16": 125.0}  # no bf16 or tf32 units: fp16 tensor-core peak
_V100_PCIE = {"fp32": 14.0, "tf32": 14.0, "bf16": 112.0}
PEAK_TFLOPS = {
    "NVIDIA H200": _H100_SXM,
    "NVIDIA H200 NVL": _NVL,
    "NVIDIA H100 80GB HBM3": _H100_SXM,
    "NVIDIA H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0},
    "NVIDIA H100 NVL": _NVL,
    "NVIDIA A100-SXM4-40GB": _A100,
    "NVIDIA A100-SXM4-80GB": _A100,
    "NVIDIA A100-PCIE-40GB": _A100,
    "NVIDIA A100 80GB PCIe": _A100,
    "NVIDIA L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.1},
    "NVIDIA L40": {"fp32": 90.5, "tf32": 90.5, "bf16": 181.0},
    "NVIDIA L4": {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0},
    "NVIDIA A10": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0},
    "NVIDIA GeForce RTX 4090": {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2},
    "NVIDIA GeForce RTX 3090": {"fp32": 35.6, "tf32": 35.6, "bf16": 71.0},
    "NVIDIA RTX A6000": {"fp32": 38.7, "tf32": 77.4, "bf16": 154.8},
    "Tesla V100-SXM2-16GB": _V100_SXM2,
    "Tesla V100-SXM2-32GB": _V100_SXM2,
    "Tesla V100-PCIE-16GB": _V100_PCIE,
    "Tesla V100-PCIE-32GB": _V100_PCIE,
}


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


def heap_bytes() -> int | None:
    """Bytes the C heap has handed out and not had back (glibc's mallinfo2: in use in its arenas plus its
    mmapped chunks): where a CPU tensor's storage lives. Unlike the resident size it drops when a
    tensor is freed, whatever the heap keeps cached; None without glibc 2.33."""
    try:
        mallinfo2 = _libc().mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return info.uordblks + info.hblkhd


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6")


def peak_rss_bytes() -> int:
    """The process's high-water resident memory: VmHWM, which reset_peak starts over. Not ru_maxrss,
    which keeps across exec the resident size of the parent it was forked from: a fresh trial started
    by a pytest holding 420 MiB had that as its peak's floor (403 MiB against 18 MiB forked)."""
    return _status_kib("VmHWM") * 1024


def vm_data_bytes() -> int:
    return _status_kib("VmData") * 1024


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} missing from /proc/self/status")


_soft_before_wall: int | None = None
"""RLIMIT_DATA's soft limit as this process had it before limit_cpu_memory; None while no wall is up (a
soft limit of the user's own, `ulimit -d`, is no wall of bench's)."""


def limit_cpu_memory(budget: int) -> None:
    """A real memory wall: allocations past `budget` above today's data segment fail with ENOMEM.

    RLIMIT_DATA (not RLIMIT_AS) because torch maps ~640 MiB of address space just to import.
    """
    global _soft_before_wall
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if _soft_before_wall is None:
        _soft_before_wall = soft
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data_bytes() + budget, hard))


def lift_cpu_memory_limit() -> None:
    """The wall taken down again, to the soft limit the process had before it: for work after the measured
    steps, and after an OOM, when the record still has to be written."""
    global _soft_before_wall
    if _soft_before_wall is None:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    resource.setrlimit(resource.RLIMIT_DATA, (_soft_before_wall, hard))
    _soft_before_wall = None


def cpu_memory_limited() -> bool:
    """Whether this process runs under bench's CPU memory wall (limit_cpu_memory)."""
    return _soft_before_wall is not None


def refused_memory() -> bool:
    """Whether this process has met its memory wall: a CPU wall is set (RLIMIT_DATA), or the CUDA
    caching allocator has refused an allocation (its num_ooms count), which libraries that allocate
    through it (cuDNN's workspaces) may report only as a failure to find a kernel."""
    if cpu_memory_limited():
        return True
    try:
        return bool(torch.cuda.is_initialized() and torch.cuda.memory_stats().get("num_ooms", 0))
    except RuntimeError:  # a CUDA error left the context unusable: no count to read
        return False


# ---- CUDA memory --------------------------------------------------------------------------------

def context_reading(device: torch.device, used_before: int | None) -> dict:
    """What the process holds on the device outside the caching allocator (CUDA context, cuBLAS,
    cuDNN and Triton modules, which load lazily): NVML's per-process figure minus the allocator's
    reserved bytes; without a per-process figure, the growth of device-wide use since start-up."""
    index = device.index or 0
    reserved = torch.cuda.memory_reserved(device)
    own = nvml.process_bytes(index)
    if own is not None:
        return {"bytes": max(own - reserved, 0), "source": "nvml per-process used - allocator reserved"}
    used = nvml.used_bytes(index)
    if used is not None and used_before is not None:
        return {"bytes": max(used - used_before - reserved, 0),
                "source": "nvml device used growth since start - allocator reserved"}
    return {"bytes": None, "source": "no context reading: NVML unavailable, so peak_memory is the "
                                     "allocator's reserved peak alone (context and libraries not counted)"}


def start_cuda(device: torch.device, used_before: int | None = None) -> dict:
    """Create the CUDA context, load cuBLAS and cuDNN, and measure what that costs outside the
    caching allocator. Libraries loaded later (Triton, more kernels) are caught by the re-read at
    the end of the trial (harness.trial). `used_before`: NVML's device-wide use read before anything
    in this process touched CUDA, where something did before this call (a rank's set_device)."""
    index = device.index or 0
    before = used_before if used_before is not None else nvml.used_bytes(index)
    torch.cuda.set_device(index)
    x = torch.ones(8, 8, device=device)
    x @ x  # cuBLAS handle and workspace
    if torch.backends.cudnn.is_available():
        torch.nn.functional.conv2d(x[None, None], torch.ones(1, 1, 3, 3, device=device))  # cuDNN handle
    del x
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    reading = context_reading(device, before)
    return {"nvml_used_at_start": before, "context_bytes": reading["bytes"], "context_source": reading["source"],
            "device_total": torch.cuda.get_device_properties(device).total_memory}


def release_cached(device: torch.device) -> None:
    """Give back memory freed but still held: the CUDA allocator's unused cached segments, glibc's
    free heap. Before a peak window starts, so that what one-off work left cached (cuDNN benchmark
    workspaces, autotuning buffers) is not counted as the window's."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        return
    try:
        _libc().malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the free heap stays, and counts
        pass


def reset_peak(device: torch.device) -> None:
    """Start the peak over: what ran before is not in the window that follows."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    try:  # Linux: "5" resets the resident high-water mark (VmHWM: peak_rss_bytes)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:  # not permitted here: the peak then includes the reference pass, as before
        pass


def limit_cuda_memory(device: torch.device, budget: int, context_bytes: int | None) -> None:
    """Cap the allocator so that allocator + context stay under `budget`: a real OutOfMemoryError.

    The cap (set_per_process_memory_fraction) covers what torch's caching allocator reserves and
    nothing else: the CUDA context, cuBLAS/cuDNN handles and workspaces outside the allocator, and
    NCCL's communicator buffers (cudaMalloc'd by NCCL itself, on its first collective) are outside it.
    So the cap is the budget less what this process holds outside the allocator, read at start
    (`context_bytes`) and read again after the first steps, when NCCL and lazily loaded kernels have
    taken theirs (harness.trial); the record's peak adds the larger reading back.
    """
    total = torch.cuda.get_device_properties(device).total_memory
    usable = budget - (context_bytes or 0)
    torch.cuda.set_per_process_memory_fraction(max(min(usable / total, 1.0), 0.0), device)


def alloc_retries(device: torch.device) -> int:
    """Times the caching allocator freed its cache and retried an allocation at the wall, since the process
    began (reset_peak_memory_stats leaves the count alone)."""
    return torch.cuda.memory_stats(device).get("num_alloc_retries", 0)


def cuda_memory(device: torch.device, start: dict) -> dict:
    """The allocator's peaks and the context re-read now: libraries loaded lazily during the trial
    (Triton, cuDNN kernels) grew it, so the larger of the start and end readings counts."""
    stats = torch.cuda.memory_stats(device)
    end = context_reading(device, start.get("nvml_used_at_start"))
    readings = [b for b in (start.get("context_bytes"), end["bytes"]) if b is not None]
    context_bytes = max(readings) if readings else None
    source = end["source"] if end["bytes"] is not None else start.get("context_source")
    return {
        "peak_allocated": torch.cuda.max_memory_allocated(device),
        "peak_reserved": torch.cuda.max_memory_reserved(device),
        "alloc_retries": stats.get("num_alloc_retries", 0) - start.get("alloc_retries_before", 0),
        "num_ooms": stats.get("num_ooms", 0),
        "context_bytes": context_bytes,
        "context_at_start": start.get("context_bytes"),
        "context_at_end": end["bytes"],
        "context_source": source,
        "nvml_used": nvml.used_bytes(device.index or 0),
        "nvml_process_used": nvml.process_bytes(device.index or 0),
        "device_total": torch.cuda.get_device_properties(device).total_memory,
    }


# ---- breakdown ----------------------------------------------------------------------------------

def tensor_bytes(tensors) -> int:
    """Bytes of distinct storages among `tensors` (views and shared storages counted once)."""
    seen, total = set(), 0
    for t in map(local, tensors):
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            continue
        key, size = storage_of(t)
        if key not in seen:
            seen.add(key)
            total += size
    return total


def local(t):
    """What this process holds of `t`: a DTensor's (FSDP's) local shard, any other value as it is."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_of(t) -> tuple[tuple, int]:
    """The tensor's storage as (a key that tells storages apart, its bytes): views of one storage count once."""
    storage = local(t).untyped_storage()
    return (storage.data_ptr(), local(t).device), storage.nbytes()


def saved_activation_bytes(forward, params=()) -> int:
    """Run `forward()` and sum what autograd saves for backward: the activation memory it holds."""
    with SavedActivations(params) as saved:
        forward()  # the graph (and what it saved) is dropped as soon as the result is
    return saved.bytes


WEIGHT_COPIES = {"ToCopyBackward0", "TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0",
                 "UnsafeViewBackward0", "AliasBackward0", "ReshapeAliasBackward0"}
"""The grad_fns of a cast or a view: what they save of a parameter is the parameter's size, not the batch's
(not an expand: a cast of `query.expand(B, ...)` is B copies)."""


class SavedActivations:
    """The bytes autograd saves for backward in one forward, counted as they are saved, holding nothing.

    Around someone else's step (a Trainer's) it counts its first micro-batch's forward: the backward's
    first read of a saved tensor ends the count. A saved tensor stays alive until the backward, so two
    of them never share an address and a storage is counted once. Layers save their weights for
    backward too (Linear keeps W to compute dX); those bytes are the weights, already counted, so
    saved tensors sharing storage with a parameter are left out, and so are a parameter's casts and
    views (autocast saves a bf16 copy of W: as large as the weight, whatever the batch, not an activation).
    """

    def __init__(self, params=()):
        params = list(params)
        self.weights = {storage_of(p)[0] for p in params}
        self.frozen = {(tuple(p.shape), p.dtype) for p in params if not p.requires_grad}
        self.saved: dict[tuple, int] = {}
        self.backward_began = False
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)

    def pack(self, t):
        if not self.backward_began and isinstance(t, torch.Tensor) and local(t).device.type != "meta":
            key, size = storage_of(t)
            if key not in self.weights and not self.of_a_weight(t):
                self.saved[key] = size
        return t

    def of_a_weight(self, t) -> bool:
        """`t` is a parameter through casts and views alone (autocast's cast weight, its transpose)."""
        fn = t.grad_fn
        if fn is None:  # a frozen parameter's autocast copy has no graph to trace: its shape, in another dtype
            return any(t.dtype != dtype and tuple(t.shape) in (shape, shape[::-1]) for shape, dtype in self.frozen)
        for _ in range(8):
            if fn is None or type(fn).__name__ not in WEIGHT_COPIES or len(fn.next_functions) != 1:
                return False
            fn = fn.next_functions[0][0]
            if hasattr(fn, "variable"):  # AccumulateGrad: a leaf, this one a parameter or not
                return storage_of(fn.variable)[0] in self.weights
        return False

    def unpack(self, t):
        self.backward_began = True
        return t

    def __enter__(self) -> "SavedActivations":
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    @property
    def bytes(self) -> int:
        return sum(self.saved.values())


class Gradients:
    """The bytes of the gradients one backward accumulates into `params`, read as each is accumulated
    (torch's post-accumulate-grad hook): around someone else's step, before it zeroes them."""

    def __init__(self, params):
        self.grads: dict[tuple, int] = {}
        self.handles = [p.register_post_accumulate_grad_hook(self.seen) for p in params if p.requires_grad]

    def seen(self, p) -> None:
        if p.grad is not None:
            key, size = storage_of(p.grad)
            self.grads[key] = size

    def close(self) -> int:
        for handle in self.handles:
            handle.remove()
        return sum(self.grads.values())


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


CONV_OPS = ("convolution", "convolution_backward")


def count_flops(fwd_bwd) -> dict:
    """FLOPs of one forward+backward, counted op by op from shapes by torch's FlopCounterMode: in all,
    and those of convolutions (cuDNN runs an fp32 convolution in TF32: `peak_tflops`)."""
    from torch.utils.flop_counter import FlopCounterMode
    _register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        fwd_bwd()
    by_op = counter.get_flop_counts().get("Global", {})
    conv = sum(n for op, n in by_op.items() if getattr(op, "__name__", str(op)).split(".")[0] in CONV_OPS)
    return {"total": int(counter.get_total_flops()), "conv": int(conv)}


def peak_tflops(device_name: str, precision: str, conv_share: float = 0.0, conv_tf32: bool = False) -> float | None:
    """The device's dense peak for the precision. fp32 with cuDNN's TF32 on (torch's default) runs its
    convolutions (`conv_share` of the FLOPs) at the TF32 peak and the rest at fp32's: the peak is that
    mix's, so a convolutional model's fp32 MFU is not 7-8x too high on an A100 or H100."""
    kind = "bf16" if precision in ("bf16-mixed", "fp16-mixed", "bf16-true") else precision
    peaks = PEAK_TFLOPS.get(device_name.strip(), {})
    peak = peaks.get(kind)
    if peak and kind == "fp32" and conv_tf32 and conv_share > 0 and peaks.get("tf32"):
        return 1 / (conv_share / peaks["tf32"] + (1 - conv_share) / peak)
    return peak


# ---- environment ----------------------------------------------------------------------------------

def cpu_bf16() -> bool | None:
    """Whether this CPU has bf16 instructions (AVX512-BF16 or AMX), where torch can tell (x86); else None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    probes = [getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")]
    return any(probe() for probe in probes) if all(probes) else None


def cpu_bf16_speedup(width: int = 512, rows: int = 64, repeats: int = 5) -> float:
    """How much faster a linear layer's forward and backward run under bf16 autocast than in fp32 on
    this CPU (fp32 time / bf16 time, the best of `repeats` each; ~20 ms): above 1 where the CPU has
    fast bf16 kernels (AMX, some AVX-512 bf16 parts), below where autocast's casts cost more than its
    kernels save. CPUs with the same bf16 flags differ here, so the planner's prior is this
    where under 1 (a faster layer leaves it at no change: harness.model.priors), not the flags."""
    layer = torch.nn.Linear(width, width)
    x = torch.randn(rows, width, requires_grad=True)

    def fp32():
        layer(x).sum().backward()

    def bf16():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
        y.float().sum().backward()

    def best(step) -> float:
        step()  # first call: oneDNN builds its kernels
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        return min(times)

    return best(fp32) / best(bf16)


def env_stamp(device: torch.device, tf32: dict) -> dict:
    """Where a record was measured, so it can be trusted (or not) later: the machine, and the
    settings outside the config that shape a measurement (allocator, launch blocking, compile
    threads, TF32 mode)."""
    import psutil
    import torch._inductor.config as inductor
    stamp = {
        "torch": torch.__version__, "python": platform.python_version(), "os": platform.platform(),
        "hostname": socket.gethostname(), "bench": __version__, "cpu": cpu_model(),
        "cpu_count": os.cpu_count(), "host_memory": psutil.virtual_memory().total,
        "cuda": torch.version.cuda, "driver": None, "device_count": nvml.machine_gpus(),
        "allocator_conf": os.environ.get("PYTORCH_ALLOC_CONF") or os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "cuda_launch_blocking": os.environ.get("CUDA_LAUNCH_BLOCKING") == "1",
        "compile_threads": inductor.compile_threads, "tf32": tf32,
        "fork_fallback": os.environ.get("BENCH_FORK_FALLBACK"),  # harness.zygote: forked unsafely, re-exec'd fresh
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        stamp.update(device=props.name, device_total=props.total_memory,
                     capability=f"{props.major}.{props.minor}", driver=nvml.driver_version())
    else:
        # without bf16 instructions autocast converts in software: the planner's prior then expects bf16 slow
        stamp.update(device=stamp["cpu"], device_total=stamp["host_memory"], cpu_bf16=cpu_bf16())
    return stamp


