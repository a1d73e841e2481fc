"""`bench doctor`: what this machine is, what it supports, and what would spoil a measurement.

The CLI process never imports torch (a wedged CUDA context must never hurt it), so torch's view of
the machine comes from a child, `python -m harness.doctor --probe`, that prints one JSON object.
NVML (through harness.nvml), psutil and the disk are asked in-process: they are light and create no CUDA context.

    facts = collect(Path("results"))     # plain JSON-serialisable dict
    warnings(facts)                      # list of sentences, empty when all is well
    render(facts)                        # a rich renderable for the terminal
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from harness.nvml import CLOCK_EVENTS, survey
from harness.units import gib

GiB = 1024**3
# How long doctor watches the machine to see what else is running, and the CPU share (of one core)
# from which another process is named: enough to move a trial's step time on a small box.
LOAD_INTERVAL_S = 1.0
BUSY_PERCENT = 10.0
MAX_STEAL_PERCENT = 2.0
# Importing torch takes ~1.5 s and initialising CUDA a few more; a probe past this is wedged.
PROBE_TIMEOUT_S = 120
# An idle GPU lowers its clocks by design; that says nothing about how a trial will run.
HARMLESS_CLOCK_EVENTS = {"GpuIdle"}


def collect(results_dir: Path) -> dict:
    """Everything doctor knows about this machine, as plain JSON-serialisable data."""
    facts = {
        "host": _host(),
        "cpu": _cpu(),
        "load": _load(),
        "disk": _disk(Path(results_dir)),
        "torch": _probe_torch(),
    }
    # NVML after the probe: its CUDA context is gone by now and is not listed as "another process".
    facts["nvml"] = gpus()
    return facts


# ---- host, CPU, disk ----------------------------------------------------------------------------

def _host() -> dict:
    return {
        "hostname": socket.gethostname(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "executable": sys.executable,
    }


def _cpu() -> dict:
    memory = psutil.virtual_memory()
    limit = _cgroup_memory_limit()
    flags = _cpuinfo("flags").split()
    return {
        "model": cpu_model(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        # A container or taskset may pin us to fewer cores than the machine has.
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_total": memory.total,
        # Inside a container its limit, not the host's free memory, is what a trial can have.
        "memory_available": min(memory.available, limit) if limit else memory.available,
        "memory_limit": limit,
        "bf16_native": "avx512_bf16" in flags or "amx_bf16" in flags,
    }


def cpu_model() -> str:
    """This CPU's model: what a trial's record names (harness.measure.env_stamp) and a study's header holds."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def _cpuinfo(key: str) -> str:
    """The first value of `key` in /proc/cpuinfo ('' where there is none, e.g. on macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return ""


def _cgroup_memory_limit() -> int | None:
    """The container's memory limit (cgroup v2), which psutil's host-wide numbers do not show."""
    try:
        value = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return None
    return int(value) if value.isdigit() else None


def _disk(results_dir: Path) -> dict:
    # The results folder may not exist before the first sweep: measure the disk it will live on.
    existing = results_dir.resolve()
    while not existing.exists():
        existing = existing.parent
    usage = shutil.disk_usage(existing)
    return {"path": str(results_dir), "total": usage.total, "free": usage.free, "exists": results_dir.exists(),
            "not_a_folder": results_dir.exists() and not results_dir.is_dir()}


# ---- what is running now ------------------------------------------------------------------------

def _load(interval_s: float = LOAD_INTERVAL_S) -> dict:
    """What competes with a trial right now, measured over `interval_s`: other busy processes (% of one
    core), CPU busy and hypervisor steal time from /proc/stat, the load average, the frequency governors."""
    mine = {os.getpid(), *(p.pid for p in psutil.Process().children(recursive=True))}
    procs = [p for p in psutil.process_iter(["name", "cmdline"]) if p.pid not in mine]
    for proc in procs:
        _optional_cpu(proc)
    before = _proc_stat()
    time.sleep(interval_s)
    after = _proc_stat()
    busy = []
    for proc in procs:
        percent = _optional_cpu(proc)
        if percent is not None and percent >= BUSY_PERCENT:
            whole = " ".join(proc.info.get("cmdline") or [])
            busy.append({"pid": proc.pid, "name": proc.info.get("name") or "?",
                         "command": whole[:80] or proc.info.get("name") or "?", "cpu_percent": round(percent, 1),
                         "bench_trial": _a_bench_trial(whole)})  # read whole: a long interpreter path hides the module
    total = {k: after[k] - before[k] for k in after} if before and after else None
    jiffies = sum(total.values()) if total else 0
    return {
        "interval_s": interval_s,
        "loadavg": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "busy_processes": sorted(busy, key=lambda p: -p["cpu_percent"]),
        "cpu_busy_percent": round(100 * (jiffies - total["idle"] - total["iowait"]) / jiffies, 1) if jiffies else None,
        "steal_percent": round(100 * total["steal"] / jiffies, 1) if jiffies else None,
        "governors": _governors(),
    }


def _optional_cpu(proc: psutil.Process) -> float | None:
    try:
        return proc.cpu_percent(None)
    except psutil.Error:
        return None


def _proc_stat() -> dict | None:
    """The machine-wide CPU time counters (Linux), in jiffies."""
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    try:
        with open("/proc/stat") as f:
            values = f.readline().split()[1:1 + len(names)]
    except OSError:
        return None
    return dict(zip(names, map(int, values))) if len(values) == len(names) else None


def _governors() -> list[str]:
    """cpufreq scaling governors in use (none on most VMs, which do not expose cpufreq)."""
    found = set()
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/scaling_governor"):
        try:
            found.add(path.read_text().strip())
        except OSError:
            pass
    return sorted(found)


# ---- torch, from a child process ----------------------------------------------------------------

def _probe_torch() -> dict:
    """torch's view of the machine, asked of a fresh child; a failure is a fact, not an exception."""
    root = str(Path(__file__).resolve().parent.parent)
    # The child must import this same harness, installed or not.
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    try:
        done = subprocess.run([sys.executable, "-m", "harness.doctor", "--probe"], env=env,
                              capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"error": f"the torch probe did not answer within {PROBE_TIMEOUT_S} s"}
    except OSError as exc:
        return {"error": f"cannot start {sys.executable}: {exc}"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])  # the last line: libraries may print before it
        except ValueError:
            pass
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return {"error": f"the torch probe failed: {tail}"}


def probe() -> dict:
    """Run in the child: import torch and describe what it can use."""
    import torch

    cuda = torch.cuda.is_available()
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda else None,
        "cuda_available": cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "devices": [_torch_device(torch, i) for i in range(torch.cuda.device_count())] if cuda else [],
    }


def _torch_device(torch, index: int) -> dict:
    props = torch.cuda.get_device_properties(index)
    capability = f"{props.major}.{props.minor}"
    return {"index": index, "name": props.name, "memory_total": props.total_memory,
            "capability": capability, "multiprocessors": props.multi_processor_count,
            **supports(capability)}


def gpus() -> dict:
    """The driver's view (harness.nvml.survey), each device with the number formats it supports."""
    found = survey()
    for device in found.get("devices", []):
        device.update(supports(device["capability"]))
    return found


def supports(capability: str) -> dict:
    """Number formats with tensor-core support on a CUDA device of this compute capability."""
    major, minor = (int(part) for part in capability.split("."))
    return {
        "bf16": major >= 8,  # Ampere brought bf16 and TF32 tensor cores
        "tf32": major >= 8,
        "fp8": (major, minor) >= (8, 9),  # Ada and Hopper
    }


# ---- warnings -----------------------------------------------------------------------------------

def warnings(facts: dict, min_free_disk: int = 10 * GiB, min_free_memory: int = 4 * GiB,
             max_gpu_used: int = 1 * GiB) -> list[str]:
    """What on this machine would make a measurement wrong or a sweep fail, one sentence each."""
    gpus = facts["nvml"].get("devices", [])
    return [
        *_torch_warnings(facts),
        *(w for device in gpus for w in _gpu_warnings(device, max_gpu_used)),
        *_host_warnings(facts, min_free_disk, min_free_memory),
        *_load_warnings(facts),
    ]


def _torch_warnings(facts: dict) -> list[str]:
    torch, nvml = facts["torch"], facts["nvml"]
    if "error" in torch:
        return [f"torch is not usable here: {torch['error']}"]
    out = []
    if nvml.get("devices") and not torch.get("cuda_available"):
        out.append("the NVIDIA driver sees a GPU but torch does not (a CPU-only torch build, or "
                   "CUDA_VISIBLE_DEVICES hides it): trials would run on the CPU")
    built, driver = torch.get("cuda"), nvml.get("cuda_driver")
    if built and driver and _version(built) > _version(driver):
        out.append(f"torch is built for CUDA {built} but the driver supports up to {driver}: "
                   "update the driver or install a torch built for an older CUDA")
    return out


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _gpu_warnings(device: dict, max_used: int) -> list[str]:
    gpu = f"GPU {device['index']} ({device['name']})"
    out = []
    for proc in device.get("processes", []):
        used = gib(proc["used_memory"]) if proc.get("used_memory") is not None else "an unknown amount"
        out.append(f"{gpu} is shared: pid {proc['pid']} {proc['name']} uses {used}; trials would "
                   "measure contended throughput and less free memory")
    held = [CLOCK_EVENTS[name][1] for name in device.get("clock_events", [])
            if name not in HARMLESS_CLOCK_EVENTS]
    if held:
        out.append(f"{gpu} clocks are held back now ({', '.join(held)}): throughput will be lower "
                   "and noisier than the card can do")
    if device["memory_used"] > max_used:
        out.append(f"{gpu} already has {gib(device['memory_used'])} in use, {gib(device['memory_free'])} free "
                   f"of {gib(device['memory_total'])}: trials get less memory than the card has")
    return out


def _host_warnings(facts: dict, min_free_disk: int, min_free_memory: int) -> list[str]:
    out = []
    disk, cpu = facts["disk"], facts["cpu"]
    if disk.get("not_a_folder"):
        out.append(f"{disk['path']} is a file, not a folder: a sweep cannot keep its studies there; "
                   "give --results a folder")
    if disk["free"] < min_free_disk:
        out.append(f"only {gib(disk['free'])} free on the disk holding {disk['path']}: study logs and "
                   f"compile caches need room (want {gib(min_free_disk)})")
    if cpu["memory_available"] < min_free_memory:
        out.append(f"only {gib(cpu['memory_available'])} of host memory available "
                   f"(want {gib(min_free_memory)}): trials may be killed by the kernel OOM killer")
    return out


def _load_warnings(facts: dict) -> list[str]:
    load, cores = facts.get("load") or {}, facts["cpu"]["cores_usable"] or facts["cpu"]["cores_logical"]
    out = [f"pid {p['pid']} {p['name']} is using {_cpu_share(p['cpu_percent'])} ({p['command']}){_whose(p)}: "
           "trials would share the CPU with it and measure less, and noisier, throughput"
           for p in load.get("busy_processes", [])[:5]]
    if len(load.get("busy_processes", [])) > 5:
        out.append(f"...and {len(load['busy_processes']) - 5} more busy processes (`bench doctor --json` lists them)")
    if load.get("loadavg") and load["loadavg"][0] >= max(1.0, cores / 2):
        out.append(f"load average {load['loadavg'][0]:.2f} on {cores} usable cores: the machine is busy, "
                   "so step times will vary between and within trials")
    if (load.get("steal_percent") or 0) >= MAX_STEAL_PERCENT:
        out.append(f"{load['steal_percent']:.1f}% of CPU time was stolen by the hypervisor over "
                   f"{load['interval_s']:.0f}s: this VM shares its cores, so timings will vary")
    scaling = [g for g in load.get("governors", []) if g != "performance"]
    if scaling:
        out.append(f"CPU frequency scaling governor {', '.join(scaling)}: clocks change with load, so "
                   "throughput can drift between trials (the `performance` governor holds them)")
    return out


def _cpu_share(percent: float) -> str:
    """99% of a core; 1.8 cores (not "184% of a core")."""
    return f"{percent:.0f}% of a core" if percent < 150 else f"{percent / 100:.1f} cores"


def _a_bench_trial(command: str) -> bool:
    """A bench trial's process (forked from the trial server, or a fresh one): its command line reads
    `python -m harness.zygote ...`, which names neither bench nor a sweep."""
    return any(f"harness.{module}" in command for module in ("zygote", "trial", "distributed"))


def _whose(proc: dict) -> str:
    if proc.get("bench_trial"):
        return ", a bench trial (another `bench sweep` or `bench trial` on this machine)"
    return ""


# ---- terminal output ----------------------------------------------------------------------------

def render(facts: dict, found: list[str] | None = None) -> Group:
    """The doctor's findings as rich tables; `found` defaults to `warnings(facts)`."""
    found = warnings(facts) if found is None else found
    parts = [_machine_table(facts), _gpu_table(facts["nvml"])]
    if any(d.get("processes") for d in facts["nvml"].get("devices", [])):
        parts.append(_process_table(facts["nvml"]))
    parts.append(_warning_text(found))
    return Group(*parts)


def _machine_table(facts: dict) -> Table:
    host, cpu, disk, torch, nvml = (facts[k] for k in ("host", "cpu", "disk", "torch", "nvml"))
    driver = f"{nvml['driver']} (CUDA {nvml['cuda_driver']})" if nvml["available"] else nvml["reason"]
    table = Table(title="bench doctor", show_header=False, title_justify="left")
    table.add_column(style="bold cyan")
    table.add_column()
    table.add_row("host", _plain(f"{host['hostname']} · {host['os']}"))
    table.add_row("python", _plain(f"{host['python']} ({host['executable']})"))
    table.add_row("torch", _torch_line(torch))
    table.add_row("driver", _plain(driver))
    table.add_row("CPU", _plain(_cpu_line(cpu)))
    table.add_row("memory", _plain(_memory_line(cpu)))
    table.add_row("load", _plain(_load_line(facts.get("load") or {})))
    table.add_row("disk", _plain(f"{gib(disk['free'])} free of {gib(disk['total'])} under {disk['path']}"
                                 + ("" if disk.get("exists", True) else " (no such folder yet: a sweep creates it)")))
    return table


def _plain(text: str) -> Text:
    # Paths, error messages and process names can hold "[...]", which rich would read as markup.
    return Text(text)


def _torch_line(torch: dict) -> Text:
    if "error" in torch:
        return Text(torch["error"], style="red")
    cuda = f"CUDA {torch['cuda']}" if torch["cuda"] else "CPU-only build"
    seen = f"{len(torch['devices'])} CUDA device(s) visible" if torch["cuda_available"] else "no CUDA device"
    return Text(f"{torch['version']} ({cuda}; {seen}; CPU kernels {torch['cpu_capability']}, "
                f"{torch['threads']} threads)")


def _cpu_line(cpu: dict) -> str:
    cores = f"{cpu['cores_physical']} cores, " if cpu["cores_physical"] else ""
    pinned = cpu["cores_usable"] not in (None, cpu["cores_logical"])
    usable = f", {cpu['cores_usable']} usable" if pinned else ""
    bf16 = "native bf16" if cpu["bf16_native"] else "no native bf16"
    return f"{cpu['model']}: {cores}{cpu['cores_logical']} threads{usable}; {bf16}"


def _load_line(load: dict) -> str:
    parts = []
    if load.get("loadavg"):
        parts.append("load average " + " ".join(f"{x:.2f}" for x in load["loadavg"]))
    if load.get("cpu_busy_percent") is not None:
        parts.append(f"CPU {load['cpu_busy_percent']:.0f}% busy, steal {load['steal_percent']:.1f}% "
                     f"over {load['interval_s']:.0f}s")
    parts.append(f"{len(load.get('busy_processes', []))} other busy process(es)")
    if load.get("governors"):
        parts.append(f"governor {', '.join(load['governors'])}")
    return "; ".join(parts)


def _memory_line(cpu: dict) -> str:
    limit = f" (container limit {gib(cpu['memory_limit'])})" if cpu["memory_limit"] else ""
    return f"{gib(cpu['memory_available'])} available of {gib(cpu['memory_total'])}{limit}"


def _gpu_table(nvml: dict) -> Table | Text:
    if not nvml["available"]:
        return Text("GPUs: none seen by a driver; trials run on the CPU", style="yellow")
    table = Table(title="GPUs", title_justify="left")
    for name in ("#", "name", "memory free / total", "capability", "bf16", "tf32", "fp8", "clocks"):
        table.add_column(name)
    for d in nvml["devices"]:
        clocks = ", ".join(CLOCK_EVENTS[n][1] for n in d["clock_events"]) or "full speed"
        table.add_row(str(d["index"]), _plain(d["name"]), f"{gib(d['memory_free'])} / {gib(d['memory_total'])}",
                      d["capability"], *(_yes_no(d[k]) for k in ("bf16", "tf32", "fp8")), clocks)
    return table


def _yes_no(flag: bool) -> Text:
    return Text("yes", style="green") if flag else Text("no", style="dim")


def _process_table(nvml: dict) -> Table:
    table = Table(title="Other processes on the GPUs", title_justify="left")
    for name in ("GPU", "pid", "name", "memory"):
        table.add_column(name)
    for d in nvml["devices"]:
        for p in d["processes"]:
            table.add_row(str(d["index"]), str(p["pid"]), _plain(p["name"]), gib(p["used_memory"]))
    return table


def _warning_text(found: list[str]) -> Text:
    if not found:
        return Text("✓ nothing here would spoil a measurement now (watched for a second)", style="green")
    text = Text()
    for line in found:
        text.append(f"⚠ {line}\n", style="yellow")
    return text


def show(results_dir: Path, as_json: bool = False, console: Console | None = None) -> None:
    """What `bench doctor [--json] [--results DIR]` prints."""
    facts = collect(results_dir)
    found = warnings(facts)
    console = console or Console()
    if as_json:
        console.print_json(json.dumps(facts | {"warnings": found}))
    else:
        console.print(render(facts, found))


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.doctor --probe`: the child half of `collect`."""
    if (sys.argv[1:] if argv is None else argv) != ["--probe"]:
        print("usage: python -m harness.doctor --probe   (people run `bench doctor`)", file=sys.stderr)
        return 2
    print(json.dumps(probe()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
