"""One command that proves bench on a device: every check in one process tree, inside a time slot.

    python benchmarks/gpu_suite.py --device cuda --out DIR --minutes 9
    python benchmarks/gpu_suite.py --device cpu --quick --out DIR --minutes 3   # the same code, tiny presets

Writes DIR/gpu-suite.md (a table per check, headed by device, driver, CUDA and torch versions) and
DIR/gpu-suite.json. Each check gets a share of the slot (time a check leaves unused passes on to the
next); one that cannot start in time is listed as "not run (time)", and one that crashes is recorded
as failed while the others go on. The .md is written after every check, so a killed run leaves one.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import peak_vs_long
import repeatability
from _common import QUICK_MEASURE, BusyMachine, load_spec, sweep_best, trial
from harness import record
from harness.cli import resolve_device
from harness.units import parse_size
from harness.workloads import WORKLOADS

ROOT = Path(__file__).resolve().parent.parent
GUIDE_BUDGET = parse_size("24GiB", "budget")  # the emberformer guide's 24 GB card
GIB, MIB = 2**30, 2**20
# CPU wall: the two probed peaks must differ by this much, so that the budget halfway between them
# clears RLIMIT_DATA's accounting (data segment) vs the trial's (RSS) on either side.
CPU_WALL_GAP = 24 * MIB


@dataclass
class Section:
    title: str
    headers: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "done"
    data: dict = field(default_factory=dict)


class Suite:
    """The run's settings and clock; each check reads its deadline from here."""

    def __init__(self, device: str, quick: bool, minutes: float, out: Path):
        self.device, self.quick, self.out = device, quick, out
        self.cuda = device.startswith("cuda")
        self.measure = QUICK_MEASURE if quick else {}
        self.deadline = None
        self.end = time.monotonic() + 60 * minutes

    def spec(self, name: str, preset: str | None = None, budget: int | None = None, **measure):
        return load_spec(ROOT / "sweeps" / f"{name}.yaml", preset or self.preset(name), budget,
                         **{**self.measure, **measure})

    def preset(self, name: str) -> str:
        return "tiny" if self.quick else WORKLOADS[name].gpu_preset if self.cuda else WORKLOADS[name].cpu_preset

    def trial(self, spec, overrides: dict) -> dict:
        if self.left() < 2:
            raise OutOfTime
        rec = trial(spec, self.device, overrides, self.deadline)
        with open(self.out / "records.jsonl", "a") as f:  # every record whole, for reading failures later
            f.write(json.dumps(rec, default=str) + "\n")
        if rec["status"] == record.TIMEOUT and self.left() < 2:  # killed at the check's deadline, not its own limit
            raise OutOfTime
        return rec

    def left(self) -> float:
        return self.deadline - time.monotonic()


class OutOfTime(Exception):
    """The check's share of the slot is spent: what it measured so far stands."""


# ---- formatting --------------------------------------------------------------------------------

def gib(n) -> str:
    return "—" if n is None else f"{n / GIB:.3f}"


def num(x, fmt=".1f") -> str:
    return "—" if x is None else format(x, fmt)


def pct(x) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


def knobs(config: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in config.items() if v not in (None, "none", "off", 1) or k == "batch_size")


def why(rec: dict) -> str:
    return ((rec.get("error") or {}).get("message") or "").splitlines()[0][:120] if rec.get("error") else ""


# ---- the checks ------------------------------------------------------------------------------------

def check_gpu_tests(s: Suite, sec: Section) -> None:
    """The `gpu`-marked tests, in a pytest subprocess (all skipped where no GPU is present)."""
    sec.headers = ["passed", "failed", "errors", "skipped", "wall s"]
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        t0 = time.monotonic()
        log = s.out / "gpu-tests.log"  # the whole pytest output, tracebacks too, kept even if time runs out
        with open(log, "w") as out:
            try:
                proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-m", "gpu", "-p", "no:cacheprovider",
                                       f"--junitxml={xml}", str(ROOT / "tests")], cwd=ROOT, stdout=out,
                                      stderr=subprocess.STDOUT, text=True, timeout=max(s.left(), 1))
            except subprocess.TimeoutExpired:
                raise OutOfTime from None
        wall = time.monotonic() - t0
        if not xml.exists():
            raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}): {log.read_text()[-300:]}")
        cases = ET.parse(xml).getroot().iter("testcase")
        counts = {"passed": 0, "failed": 0, "error": 0, "skipped": 0}
        for case in cases:
            bad = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
            kind = {"failure": "failed", "error": "error", "skipped": "skipped"}.get(bad.tag if bad is not None else "",
                                                                                   "passed")
            counts[kind] += 1
            if kind in ("failed", "error"):
                first = (bad.get("message") or "").splitlines()[:1]
                sec.notes.append(f"{kind}: {case.get('classname')}::{case.get('name')}: {first[0] if first else ''}")
    sec.rows.append([counts["passed"], counts["failed"], counts["error"], counts["skipped"], f"{wall:.0f}"])
    sec.data.update(counts, exit=proc.returncode)


def check_presets(s: Suite, sec: Section) -> None:
    """One trial of every workload's device preset: status, speed, peak, CUDA context, MFU."""
    sec.headers = ["workload", "preset", "config", "status", "samples/s", "peak GiB", "context MiB", "MFU"]
    for name in WORKLOADS:
        spec = s.spec(name)
        rec = s.trial(spec, {})
        mem, flops = rec.get("memory") or {}, rec.get("flops") or {}
        sec.rows.append([name, s.preset(name), knobs(rec["config"]), rec["status"], num(rec.get("throughput")),
                         gib(rec.get("peak_memory")), num(mem["context_bytes"] / MIB if mem.get("context_bytes") else None),
                         pct(flops.get("mfu"))])
        if rec["status"] != "ok":
            sec.notes.append(f"{name}: {why(rec)}")
        sec.data[name] = {k: rec.get(k) for k in ("status", "config", "throughput", "peak_memory")}


def check_repeatability(s: Suite, sec: Section) -> None:
    """One config in 5 fresh processes: how much do samples/s and peak move between processes?"""
    sec.headers = ["run", "status", "samples/s", "peak GiB", "step CV"]
    recs = []
    spec = s.spec("emberformer")
    for i in range(5):
        rec = s.trial(spec, {})
        recs.append(rec)
        sec.rows.append([i + 1, rec["status"], num(rec.get("throughput"), ".2f"), gib(rec.get("peak_memory")),
                         pct(((rec.get("timing") or {}).get("step_s") or {}).get("cv"))])
    sec.data.update(repeatability.summarize(recs))
    sec.notes.append(f"config {knobs(recs[0]['config'])}: samples/s CV {pct(sec.data['throughput_cv'])}, "
                     f"peak CV {pct(sec.data['peak_cv'])} across {sec.data['ok']} ok runs")


def check_peak_vs_long(s: Suite, sec: Section, steps: int = 200) -> None:
    """A sweep-length trial's peak vs a 200-step run of the same config (NVML's view too on CUDA)."""
    sec.headers = ["run", "measured steps", "peak GiB", "NVML device used GiB", "NVML this process GiB"]
    short = s.trial(s.spec("emberformer"), {})
    long = s.trial(s.spec("emberformer", **peak_vs_long.long_run(steps)), {})
    for name, rec in (("trial", short), ("long run", long)):
        if rec["status"] != "ok":
            raise RuntimeError(f"{name} ended {rec['status']}: {why(rec)}")
        mem = rec["memory"]
        sec.rows.append([name, rec["timing"]["measured_steps"], gib(rec["peak_memory"]), gib(mem.get("nvml_used")),
                         gib(mem.get("nvml_process_used"))])
    sec.data.update(peak_vs_long.compare(short, long))
    sec.notes.append(f"long-run peak vs trial peak (across processes): {100 * sec.data['across_processes']:+.2f}%; "
                     f"within the long run, after all steps vs at the trial's length: "
                     f"{100 * sec.data['within_long_run']:+.2f}%")
    if not s.cuda:
        sec.notes.append("NVML columns are CUDA-only (— on CPU)")


def check_sweep(s: Suite, sec: Section) -> None:
    """A short emberformer sweep under the guide's 24 GiB budget; its best vs the guide's batch 32."""
    sec.headers = ["answer", "config", "status", "samples/s", "peak GiB", "ratio to guide"]
    best = sweep_best(ROOT / "sweeps" / "emberformer.yaml", s.preset("emberformer"), GUIDE_BUDGET, s.device,
                      trials=4 if s.quick else 8, timeout_s=s.left() * 0.7, measure=s.measure,
                      search={"compile": ["off"]} if s.quick else None)  # CPU inductor compiles take minutes
    if best is None:
        raise RuntimeError("the sweep measured no config that fits")
    spec = s.spec("emberformer", budget=GUIDE_BUDGET)
    guide = s.trial(spec, {"batch_size": 32})
    confirmed = s.trial(spec, best["config"])  # re-measured in a fresh process, like the guide's config
    base = guide.get("throughput") if guide["status"] == "ok" else None
    for name, rec in (("bench best (re-measured)", confirmed), ("guide: batch 32", guide)):
        ratio = rec["throughput"] / base if base and rec.get("throughput") else None
        sec.rows.append([name, knobs(rec["config"]), rec["status"], num(rec.get("throughput")),
                         gib(rec.get("peak_memory")), num(ratio, ".2f") + ("×" if ratio else "")])
    sec.notes.append(f"sweep: {best['trials']} trials in {best['wall_s']:.0f}s; in-sweep best "
                     f"{num(best['throughput'])} samples/s")
    sec.data.update(best=best, guide=guide.get("throughput"), confirmed=confirmed.get("throughput"))


def check_memory_wall(s: Suite, sec: Section) -> None:
    """The budget is a real wall: a config that fits runs under it, one that cannot fit ends `oom`.

    The pair is found by measuring, without a budget. On CUDA the budget is the guide's 24 GiB, and a
    config has two footprints: what it *holds* (peak reserved + context, the figure bench judges by)
    and what it *needs* (peak allocated + context). Under a cap the caching allocator frees cached
    blocks and retries before it raises, so a config between the two may still run, slower (the first
    GPU run found one: batch 235 held 24.03 GiB, needed 23.04 GiB, and ran with 20 allocator retries).
    "Just under" is the largest batch that holds under the budget, "just over" the smallest that needs
    more than it; between them is the allocator's grey zone, reported, not judged. On CPU
    (RLIMIT_DATA, where the peak is RSS) the budget sits between two measured peaks, well apart, and
    "just over" is twice the batch of the upper one.
    """
    sec.headers = ["run", "batch", "budget GiB", "status", "holds GiB", "needs GiB", "alloc retries"]
    free = dataclasses.replace(s.spec("emberformer"), memory_budget=None)  # the spec file's own 24GiB is a wall too
    peaks = {}  # batch size -> (holds, needs)

    def footprints(rec: dict) -> tuple[int, int]:
        mem = rec.get("memory") or {}
        needs = mem["peak_allocated"] + (mem.get("context_bytes") or 0) if s.cuda else rec["peak_memory"]
        return rec["peak_memory"], needs

    def row(label: str, batch: int, budget, rec: dict) -> list:
        holds, needs = footprints(rec) if rec["status"] == record.OK else (None, None)
        retries = (rec.get("memory") or {}).get("alloc_retries", "—")
        return [label, batch, gib(budget), rec["status"], gib(holds), gib(needs), retries]

    def probe(batch: int) -> tuple[int, int]:
        rec = s.trial(free, {"batch_size": batch})
        if rec["status"] != record.OK:
            raise RuntimeError(f"batch {batch} without a budget ended {rec['status']}: {why(rec)}")
        peaks[batch] = footprints(rec)
        sec.rows.append(row("probe (no budget)", batch, None, rec))
        return peaks[batch]

    def bracket(i: int) -> tuple[int, int]:
        return (max(b for b in peaks if peaks[b][i] <= GUIDE_BUDGET),
                min(b for b in peaks if peaks[b][i] > GUIDE_BUDGET))

    def close_in(i: int) -> tuple[int, int]:
        """Probe until the batch sizes either side of the budget are within ~6% of each other."""
        for _ in range(3):
            lo, hi = bracket(i)
            if hi - lo <= max(1, lo // 16):
                break
            # a footprint is close to linear in batch size: aim where the line through the bracket crosses
            aim = lo + (GUIDE_BUDGET - peaks[lo][i]) * (hi - lo) / (peaks[hi][i] - peaks[lo][i])
            probe(min(max(round(aim), lo + 1), hi - 1))
        return bracket(i)

    batch = 128 if s.cuda else 32
    while True:
        holds, needs = probe(batch)
        crossed = needs > GUIDE_BUDGET if s.cuda else len(peaks) >= 2 and holds - peaks[batch // 2][0] > CPU_WALL_GAP
        if crossed:
            break
        batch *= 2
    if s.cuda:
        (under, _), (_, over) = close_in(0), close_in(1)
        budget = GUIDE_BUDGET
    else:  # the budget between two measured peaks; "over" twice the batch above it, so it needs far more:
        # a peak is resident memory, the wall limits the data segment, and with glibc's own heap policy a
        # batch just past the budget by its peak has been seen to run under the wall
        under, over = batch // 2, 2 * batch
        budget = int((peaks[under][0] * peaks[batch][0]) ** 0.5)
    walled = s.spec("emberformer", budget=budget)
    results = {}
    for label, b in (("just under", under), ("just over", over)):
        rec = s.trial(walled, {"batch_size": b})
        results[label] = rec["status"]
        sec.rows.append(row(f"{label} (budget)", b, budget, rec))
    held = results == {"just under": record.OK, "just over": record.OOM}
    sec.notes.append(f"wall {'held' if held else 'DID NOT HOLD'}: under → {results['just under']}, "
                     f"over → {results['just over']} (expected ok / oom)")
    sec.data.update(budget=budget, under=under, over=over, results=results, held=held)


CHECKS = [  # (title, check, share of the slot)
    ("gpu-marked tests (pytest -m gpu)", check_gpu_tests, 0.15),
    ("one trial per workload preset", check_presets, 0.2),
    ("repeatability: one config, 5 fresh processes", check_repeatability, 0.15),
    ("short trial peak vs a 200-step run", check_peak_vs_long, 0.1),
    ("emberformer sweep under 24 GiB vs the guide's advice (batch 32)", check_sweep, 0.2),
    ("memory wall: just under vs just over the budget", check_memory_wall, 0.2),
]


# ---- the run ---------------------------------------------------------------------------------------

def run_checks(s: Suite, write, skip: tuple[str, ...] = ()) -> list[Section]:
    checks = [c for c in CHECKS if not any(word in c[0] for word in skip)]
    sections = []
    for i, (title, check, share) in enumerate(checks):
        remaining_shares = sum(sh for _, _, sh in checks[i:])
        s.deadline = time.monotonic() + (s.end - time.monotonic()) * share / remaining_shares
        sec = Section(title)
        sections.append(sec)
        if s.left() < 5:
            sec.status = "not run (time)"
            continue
        t0 = time.monotonic()
        try:
            check(s, sec)
        except OutOfTime:  # what it measured before its share ran out stays in the table
            sec.status = "stopped (time): partial" if sec.rows else "not run (time)"
        except BusyMachine as exc:
            sec.status = f"no answer (busy machine): {exc}"
        except Exception as exc:  # record it and go on: the other checks still run
            sec.status = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            sec.data["traceback"] = traceback.format_exc()[-3000:]
        sec.data["wall_s"] = time.monotonic() - t0
        write(sections)
    return sections


def environment(device: str) -> dict:
    """Device, driver, CUDA and torch versions, read in a child (the suite itself never imports torch)."""
    code = ("import json, torch; from harness import measure, transforms; "
            f"print(json.dumps(measure.env_stamp(torch.device({device!r}), transforms.tf32_mode())))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-300:]}


def markdown(env: dict, args, sections: list[Section]) -> str:
    lines = [f"# bench device suite ({'--quick, tiny presets' if args.quick else 'full presets'})", "",
             f"device **{env.get('device')}**, driver {env.get('driver') or '—'}, CUDA {env.get('cuda') or '—'}, "
             f"torch {env.get('torch')}, host {env.get('hostname')} ({env.get('cpu_count')} CPUs), "
             f"slot {args.minutes} min, started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(args.started))}", ""]
    for sec in sections:
        lines += [f"## {sec.title}", ""]
        if sec.status != "done":
            lines += [f"**{sec.status}**", ""]
        if sec.rows:
            lines += ["| " + " | ".join(sec.headers) + " |", "|" + "---|" * len(sec.headers)]
            lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in sec.rows]
            lines.append("")
        lines += [f"- {n}" for n in sec.notes] + ([f"- took {sec.data['wall_s']:.0f}s"] if "wall_s" in sec.data else [])
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--minutes", type=float, default=9.0)
    p.add_argument("--quick", action="store_true", help="tiny presets and short trials (CI, CPU)")
    p.add_argument("--skip", action="append", default=[], metavar="WORD",
                   help="leave out the checks whose title has WORD, e.g. --skip pytest when the gpu-marked "
                        "tests run as their own command (on one GPU they need more than a share of one slot)")
    args = p.parse_args(argv)
    args.started = time.time()
    device = resolve_device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    s = Suite(device, args.quick, args.minutes, args.out)
    env = environment(device)

    def write(sections):
        (args.out / "gpu-suite.md").write_text(markdown(env, args, sections))
        (args.out / "gpu-suite.json").write_text(json.dumps(
            {"env": env, "device": device, "quick": args.quick, "minutes": args.minutes,
             "checks": [{"title": x.title, "status": x.status, "headers": x.headers, "rows": x.rows,
                         "notes": x.notes, "data": x.data} for x in sections]}, indent=1, default=str))

    sections = run_checks(s, write, tuple(args.skip))
    write(sections)
    print((args.out / "gpu-suite.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
