"""NVML without torch: the parent (bench sweep) and the trial child read GPUs the same way.

Every reading bench takes through NVML in the parent goes through here: the handle of a CUDA device
index (through CUDA_VISIBLE_DEVICES), how many GPUs are visible, a device's total memory and the
processes computing on it. Each answers 0 or None where NVML cannot tell (no driver, a container).
"""
import os


def handle(index: int):
    """NVML handle of CUDA device `index`. NVML numbers every GPU of the machine, so map the index
    through CUDA_VISIBLE_DEVICES (indices or UUIDs; the launcher sets CUDA_DEVICE_ORDER=PCI_BUS_ID
    so both number GPUs alike)."""
    import pynvml
    pynvml.nvmlInit()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    entry = visible.split(",")[index].strip() if visible else str(index)
    return (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
            else pynvml.nvmlDeviceGetHandleByUUID(entry))


def _index(device: str) -> int:
    return int(device.partition(":")[2] or 0)


def visible() -> int:
    """GPUs this process may use: NVML's count, narrowed by CUDA_VISIBLE_DEVICES; 0 without NVML."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) == "":
        return 0
    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no driver, no library: no GPU to use
        return 0
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return min(count, len(listed.split(","))) if listed else count


def total_memory(device: str) -> int | None:
    """Bytes of memory CUDA device `device` ("cuda:N") holds, or None where NVML cannot tell."""
    try:
        import pynvml
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle(_index(device))).total)
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
