"""NVML without torch: the parent (bench sweep) and the trial child read GPUs the same way."""
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
