"""NVML without torch: the one module that talks to the driver, for the parent (bench sweep, doctor)
and the trial child alike.

The handle of a CUDA device index (through CUDA_VISIBLE_DEVICES), how many GPUs are visible, a
device's total and used memory, this process's share, the processes computing on it, and doctor's
survey (drivers, processes, clock events). Each answers 0 or None where NVML cannot tell (no driver,
a container).
"""
from __future__ import annotations

import os

import psutil

from harness import units

# NVML's clock-event ("throttle") reasons: name -> (bit in nvml.h, what it means). The bits are fixed
# by the driver ABI, so they are spelled out here rather than looked up under names that changed
# between nvidia-ml-py releases.
CLOCK_EVENTS = {
    "GpuIdle": (0x1, "idle"),
    "ApplicationsClocksSetting": (0x2, "application clocks set below the maximum"),
    "SwPowerCap": (0x4, "software power cap"),
    "HwSlowdown": (0x8, "hardware slowdown"),
    "SyncBoost": (0x10, "sync boost with other GPUs"),
    "SwThermalSlowdown": (0x20, "software thermal slowdown"),
    "HwThermalSlowdown": (0x40, "hardware thermal slowdown"),
    "HwPowerBrakeSlowdown": (0x80, "hardware power brake"),
    "DisplayClockSetting": (0x100, "display clock setting"),
}


def handle(index: int):
    """NVML handle of CUDA device `index`. NVML numbers every GPU of the machine, so map the index
    through CUDA_VISIBLE_DEVICES (indices or UUIDs; the launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID
    so both number GPUs alike)."""
    import pynvml
    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entry = visible.split(",")[index].strip() if visible else str(index)
    return (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if units.is_whole(entry)
            else pynvml.nvmlDeviceGetHandleByUUID(entry))


def _index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def visible() -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES; 0 without NVML."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    count = machine_gpus()  # 0 without a driver or the library: no GPU to use
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(count, len(listed.split(","))) if listed else count


def total_memory(device: str) -> int | None:
    """Bytes of memory CUDA device `device` ("cuda:N") holds, or None where NVML cannot tell."""
    try:
        import pynvml
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle(_index(device))).total)
    except Exception:
        return None


def device_name(device: str) -> str | None:
    """NVML's name of CUDA device `device`'s model (e.g. "NVIDIA H100 80GB HBM3"), or None without NVML."""
    try:
        import pynvml
        return str(pynvml.nvmlDeviceGetName(handle(_index(device))))
    except Exception:
        return None


def compute_processes(device: str) -> int:
    """Other processes computing on CUDA device `device` (bench's own, this process and its children,
    left out); 0 on a CPU or where NVML cannot tell."""
    if not device.startswith("cuda"):
        return 0
    try:
        import psutil
        import pynvml
        ours = {os.getpid(), *(child.pid for child in psutil.Process().children(recursive=True))}
        return sum(1 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(_index(device))) if p.pid not in ours)
    except Exception:  # no NVML (driver, container): the load and steal still count
        return 0


def used_bytes(index: int) -> int | None:
    """Device memory in use as the driver sees it (every process, CUDA contexts included)."""
    try:
        import pynvml
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle(index)).used)
    except Exception:  # no driver or no NVML: the allocator's figures still stand
        return None


def process_bytes(index: int) -> int | None:
    """Device memory this process holds as the driver sees it, or None when NVML cannot say
    (no NVML, or a container whose PIDs NVML reports as host PIDs)."""
    try:
        import pynvml
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle(index)):
            if proc.pid == os.getpid() and proc.usedGpuMemory is not None:
                return int(proc.usedGpuMemory)
    except Exception:
        pass
    return None


def machine_gpus() -> int:
    """GPUs in the machine as NVML counts them (CUDA_VISIBLE_DEVICES not applied: a trial sees only
    its own); 0 without a driver."""
    try:
        import pynvml
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return 0


def driver_version() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else version
    except Exception:
        return None


# ---- doctor's survey ------------------------------------------------------------------------------

def survey() -> dict:
    """The driver's view for `bench doctor`: every GPU, who else is on it, and whether its clocks are
    held back; `available: False` with the reason where NVML cannot answer."""
    try:
        import pynvml
    except ImportError:
        return {"available": False, "reason": "nvidia-ml-py is not installed"}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": f"no NVIDIA driver ({exc})"}
    try:
        return {
            "available": True,
            "driver": pynvml.nvmlSystemGetDriverVersion(),
            "cuda_driver": _cuda_version(pynvml.nvmlSystemGetCudaDriverVersion()),
            "devices": [_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())],
        }
    except pynvml.NVMLError as exc:
        return {"available": False, "reason": f"the NVIDIA driver did not answer ({exc})"}
    finally:
        pynvml.nvmlShutdown()


def _cuda_version(number: int) -> str:
    """NVML gives the CUDA version the driver supports as 1000*major + 10*minor."""
    return f"{number // 1000}.{number % 1000 // 10}"


def _device(pynvml, index: int) -> dict:
    device = pynvml.nvmlDeviceGetHandleByIndex(index)
    memory = _memory_info(pynvml, device)
    capability = "{}.{}".format(*pynvml.nvmlDeviceGetCudaComputeCapability(device))
    return {
        "index": index,
        "name": pynvml.nvmlDeviceGetName(device),
        "memory_total": memory.total,
        "memory_used": memory.used,
        "memory_free": memory.free,
        "capability": capability,
        "processes": _optional(pynvml, lambda: _processes(pynvml, device), []),
        "clock_events": _optional(pynvml, lambda: _clock_events(pynvml, device), []),
    }


def _memory_info(pynvml, device):
    """Version 2 keeps the driver's own reservation out of `used`; older drivers only have version 1."""
    try:
        return pynvml.nvmlDeviceGetMemoryInfo(device, version=pynvml.nvmlMemory_v2)
    except (AttributeError, pynvml.NVMLError):
        return pynvml.nvmlDeviceGetMemoryInfo(device)


def _optional(pynvml, read, default):
    """Some readings are unsupported on some GPUs (MIG slices, vGPUs): then they are left empty."""
    try:
        return read()
    except pynvml.NVMLError:
        return default


def _processes(pynvml, device) -> list[dict]:
    seen = {}
    readers = (pynvml.nvmlDeviceGetComputeRunningProcesses, pynvml.nvmlDeviceGetGraphicsRunningProcesses)
    for read in readers:
        for proc in read(device):
            seen.setdefault(proc.pid, {"pid": proc.pid, "name": _process_name(proc.pid),
                                       "used_memory": proc.usedGpuMemory})
    return sorted(seen.values(), key=lambda p: p["pid"])


def _process_name(pid: int) -> str:
    # In a container NVML reports host PIDs, which are often not visible here.
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "(not visible from here)"


def _clock_events(pynvml, device) -> list[str]:
    # nvidia-ml-py renamed "throttle reasons" to "clock events"; older releases have only the first.
    read = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        pynvml.nvmlDeviceGetCurrentClocksThrottleReasons
    mask = read(device)
    return [name for name, (bit, _) in CLOCK_EVENTS.items() if mask & bit]
