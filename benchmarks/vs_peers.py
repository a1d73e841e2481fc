"""bench side by side with what users reach for today, each answer measured by bench's own trial.

    python benchmarks/vs_peers.py --workload emberformer --device cuda --budget 24GiB
    python benchmarks/vs_peers.py --workload emberformer --device cpu --preset tiny --budget 300MiB --quick

Peers answer on the same workload, preset and memory wall:
  - Lightning `Tuner.scale_batch_size(mode="binsearch")` on a LightningModule wrapping the workload;
  - Hugging Face accelerate `find_executable_batch_size` around a few training steps;
  - the seed guide's hand advice, where one exists (GUIDE_ADVICE below, with its source);
  - bench's own best, from a short `bench sweep`.
Each peer searches in a child process under the budget, set by the same code as in bench's trial
(harness.footprint: CPU, RLIMIT_DATA above a baseline that includes the OpenMP pool's thread stacks;
CUDA, the per-process memory fraction), so its OOM search is real. Every answer is then measured the
same way: `bench trial` in a fresh process under the same budget, `--runs` times (3) in interleaved
rounds, the median shown with every run: one run of a config moves by 10-15% on a small CPU, so a
single run each cannot rank answers a few percent apart. Needs `pip install -e ".[peers]"`.

Under a CPU wall oneDNN fails with "could not create a primitive", which neither peer's OOM check
knows, so both crash where bench halves. `--peer-oom bench` hands them bench's check
(harness.errors.is_oom) on top of their own, so they can answer there too; the tool's name says so.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import QUICK_MEASURE, BusyMachine, load_spec, sweep_best, trial
from harness import spec as specs
from harness.cli import resolve_device
from harness.units import parse_size

ROOT = Path(__file__).resolve().parent.parent
GIB = 2**30

# What the seed guides tell a user to set by hand (only knobs the guide names; the rest keep bench's defaults).
GUIDE_ADVICE = {
    "emberformer": ({"batch_size": 32},
                    "emberformer guide: batch 32 for the large model (examples/emberformer/config.yaml)"),
    "retrieval": ({"batch_size": 256, "precision": "bf16-mixed", "accumulation": 2},
                  "retrieval guide: AMP + batch 256 + accumulation (the guide names no accumulation count; 2 here)"),
}


# The knobs a peer's search ran with (it tunes the batch size only): bench measures its answer at these.
PEER_DEFAULTS = {"precision": "fp32", "accumulation": 1, "checkpointing": "none", "compile": "off"}


# ---- parent: ask each tool, then measure its answer ----------------------------------------------

def ask_peer(peer: str, job: dict, timeout_s: float) -> dict:
    """Run a peer's search in a child under the job's memory wall; its answer, tries and wall time."""
    with tempfile.TemporaryDirectory() as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "answer.json"
        job_path.write_text(json.dumps({**job, "tmp": tmp}))
        t0 = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, __file__, "--child", peer, str(job_path), str(out_path)],
                                  capture_output=True, text=True, timeout=timeout_s, cwd=ROOT)
        except subprocess.TimeoutExpired:
            return {"error": f"no answer within {timeout_s:.0f}s", "wall_s": time.monotonic() - t0}
        wall = time.monotonic() - t0
        if not out_path.exists():
            return {"error": died(proc), "wall_s": wall, "signal": -proc.returncode if proc.returncode < 0 else None}
        return {**json.loads(out_path.read_text()), "wall_s": wall}


def died(proc: subprocess.CompletedProcess) -> str:
    """How a peer's search process ended without an answer, with the last line it printed. A SIGSEGV or
    SIGBUS under the wall is a library that does not check a failed allocation: no OOM check in Python,
    the peer's or bench's, sees it (bench's own trial reads it as out of memory: harness.launch.classify)."""
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
    rc = proc.returncode
    if rc in (-signal.SIGSEGV, -signal.SIGBUS):
        return (f"crashed by {signal.Signals(-rc).name} under the memory wall (an allocation no check sees); "
                f"last said: {tail[0][:160]}")
    return f"child died (exit {rc}): {tail[0][:200]}"


def compare(args) -> list[dict]:
    device = resolve_device(args.device)
    budget = parse_size(args.budget, "--budget") if args.budget else None
    spec_path = ROOT / "sweeps" / f"{args.workload}.yaml"
    measure = QUICK_MEASURE if args.quick else {}
    spec = load_spec(spec_path, args.preset, budget, **measure)
    preset = spec.workload.get("preset", "auto")
    job = {**spec.job(device, specs.trial_config(spec, PEER_DEFAULTS)), "start": args.start, "peer_oom": args.peer_oom}
    answers = []  # (tool, answer): answer is {"config", "wall_s"} or {"error", ...}
    for peer in ("lightning", "accelerate"):
        say(f"asking {peer} for its batch size (up to {args.peer_timeout:.0f} s)")
        answer = ask_peer(peer, job, args.peer_timeout)
        answers.append((answer.get("tool", peer + oom_label(job)), answer))
    if args.workload in GUIDE_ADVICE:
        config, source = GUIDE_ADVICE[args.workload]
        answers.append((f"guide: {source}", {"config": config, "wall_s": None}))
    say(f"bench sweep: up to {args.trials} trials in {args.sweep_timeout:.0f} s")
    try:
        best = sweep_best(spec_path, preset, budget, device, args.trials, args.sweep_timeout, measure,
                          search={"compile": ["off"]} if args.quick else None)
    except BusyMachine as exc:
        best, why = None, str(exc)
    else:
        why = "the sweep measured no config that fits"
    if best is None:
        answers.append(("bench", {"error": why, "wall_s": None}))
    else:
        answers.append((f"bench sweep ({best['trials']} trials)", {"config": best["config"], "wall_s": best["wall_s"]}))
    runs = measure_rounds(spec, device, [a for _, a in answers], args.runs)
    rows = [measured(tool, answer, recs) for (tool, answer), recs in zip(answers, runs)]
    bench = rows[-1].get("throughput")
    for r in rows:
        r["ratio"] = r["throughput"] / bench if bench and r.get("throughput") else None
    return rows


def say(line: str) -> None:
    """Progress on stderr, so a run of several minutes is not silent and stdout stays the table."""
    print(f"vs_peers: {line}", file=sys.stderr, flush=True)


def measure_rounds(spec, device: str, answers: list[dict], rounds: int) -> list[list[dict]]:
    """Each answer's config measured `rounds` times by bench's trial in a fresh process, interleaved
    (every answer once per round), so a drift of the machine falls on all of them alike."""
    runs: list[list[dict]] = [[] for _ in answers]
    for k in range(rounds):
        say(f"measuring every answer: round {k + 1} of {rounds}")
        for i, answer in enumerate(answers):
            if not answer.get("error"):
                runs[i].append(trial(spec, device, {**PEER_DEFAULTS, **answer["config"]}))
    return runs


def measured(tool: str, answer: dict, recs: list[dict]) -> dict:
    """An answer's row: the median of its runs' throughput; or the peer's failure, as it happened."""
    row = {"tool": tool, "answer_wall_s": answer.get("wall_s"), "peer": {k: v for k, v in answer.items()
                                                                       if k not in ("config", "wall_s")}}
    if answer.get("error"):
        unrecognised = " (raised under the memory wall; the peer's OOM check did not recognise it)" \
            if answer.get("oom_recognised") is False else ""
        return {**row, "answer": None, "status": f"failed: {answer['error']}{unrecognised}"}
    ok = [r for r in recs if r["status"] == "ok" and r.get("throughput")]
    shown = ok or recs  # a config that failed in every run shows its first failure
    speeds = sorted(r["throughput"] for r in ok)
    return {**row, "answer": recs[0]["config"], "status": "ok" if ok else recs[0]["status"],
            "throughput": statistics.median(speeds) if speeds else None, "runs": speeds,
            "peak_memory": max((r["peak_memory"] for r in ok), default=None),
            "error": (shown[0].get("error") or {}).get("message")}


def table(rows: list[dict]) -> str:
    lines = ["| tool | answer (knobs) | status | samples/s (median) | runs | peak GiB | ratio to bench | time to answer |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        knobs = " ".join(f"{k}={v}" for k, v in (r.get("answer") or {}).items()) or "—"
        tput = f"{r['throughput']:.1f}" if r.get("throughput") else "—"
        peak = f"{r['peak_memory'] / GIB:.3f}" if r.get("peak_memory") else "—"
        ratio = f"{r['ratio']:.2f}×" if r.get("ratio") else "—"
        wall = f"{r['answer_wall_s']:.0f}s" if r.get("answer_wall_s") is not None else "by hand"
        runs = ", ".join(f"{v:.0f}" for v in r.get("runs") or []) or "—"
        lines.append(f"| {r['tool']} | {knobs} | {r['status']} | {tput} | {runs} | {peak} | {ratio} | {wall} |")
    return "\n".join(lines)


# ---- child: one peer's search, for real, under the wall ------------------------------------------

def child(peer: str, job_path: str, out_path: str) -> None:
    """Imports torch and the peer; sets the memory wall as bench's trial does; writes the peer's answer."""
    import torch
    from harness import footprint, measure, workloads
    job = json.loads(Path(job_path).read_text())
    device = torch.device("cuda:0" if job["device"].startswith("cuda") else "cpu")
    run = lightning_search if peer == "lightning" else accelerate_search
    run(job, device, None)  # imports the peer before the wall: its import is baseline, as torch's is in a trial
    if job.get("peer_oom") == "bench":
        widen_oom_check(peer)
    footprint.probe(device, job["memory_budget"]).start()  # the wall, set as a bench trial sets it
    torch.manual_seed(job.get("seed", 0))
    wl = workloads.build(job["workload"])
    try:
        answer = run(job, device, wl)
    except BaseException as exc:  # the peer gave up or crashed: say how, and whether it knew it was an OOM
        if device.type == "cpu":
            measure.lift_cpu_memory_limit()
        answer = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}",
                  "oom_recognised": recognised(peer, exc)}
    Path(out_path).write_text(json.dumps(answer, default=str))


def oom_check(peer: str) -> tuple:
    """Where the peer's search looks up its OOM check: (module, name)."""
    if peer == "lightning":
        from lightning.pytorch.tuner import batch_size_scaling
        return batch_size_scaling, "is_oom_error"
    from accelerate.utils import memory
    return memory, "should_reduce_batch_size"


def widen_oom_check(peer: str) -> None:
    """The peer's OOM check, and also bench's (harness.errors.is_oom at the wall), where its search calls it."""
    from harness import errors
    module, name = oom_check(peer)
    own = getattr(module, name)
    setattr(module, name, lambda exc: own(exc) or errors.is_oom(exc, at_wall=True))


def recognised(peer: str, exc: BaseException) -> bool:
    """Whether the check the peer's search called (its own, or widened) counts `exc` as an OOM."""
    module, name = oom_check(peer)
    return bool(getattr(module, name)(exc))


def lightning_search(job: dict, device, wl) -> dict | None:
    import lightning as L
    from lightning.pytorch.tuner import Tuner
    import torch
    if wl is None:
        return None

    class Wrapped(L.LightningModule):
        """The workload as a LightningModule: the tuner scales `batch_size`, the attribute its docs name."""

        def __init__(self):
            super().__init__()
            self.model, self.batch_size = wl.model, 2

        def training_step(self, batch, _):
            return wl.loss(self.model, batch)

        def configure_optimizers(self):
            params = wl.trainable(self.model) if wl.trainable else [p for p in self.parameters() if p.requires_grad]
            return torch.optim.AdamW(params, lr=wl.lr)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(wl.dataset, batch_size=self.batch_size, shuffle=True,
                                               collate_fn=wl.collate, drop_last=True)

    trainer = L.Trainer(accelerator="gpu" if device.type == "cuda" else "cpu", devices=1, max_epochs=1,
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=job["tmp"])
    found = Tuner(trainer).scale_batch_size(Wrapped(), mode="binsearch")
    return {"config": {"batch_size": int(found)}, "tool": f"lightning {L.__version__} binsearch{oom_label(job)}"}


def accelerate_search(job: dict, device, wl) -> dict | None:
    import accelerate
    from accelerate.utils import find_executable_batch_size
    import torch
    from harness import transforms
    if wl is None:
        return None
    model, tried = wl.model.to(device), []

    @find_executable_batch_size(starting_batch_size=int(job["start"]))
    def train(batch_size):
        """What the accelerate docs wrap: a few training steps at `batch_size`; an OOM retries smaller."""
        tried.append(batch_size)
        params = wl.trainable(model) if wl.trainable else [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=wl.lr)
        loader = torch.utils.data.DataLoader(wl.dataset, batch_size=batch_size, shuffle=True, collate_fn=wl.collate,
                                             drop_last=True)
        for step, batch in zip(range(3), loader):
            wl.loss(model, transforms.to_device(batch, device, False)).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return batch_size

    return {"config": {"batch_size": int(train())}, "tried": tried,
            "tool": f"accelerate {accelerate.__version__} from {job['start']}{oom_label(job)}"}


def oom_label(job: dict) -> str:
    return " (OOM check: its own and bench's)" if job.get("peer_oom") == "bench" else ""


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", required=True, choices=sorted(specs.WORKLOADS))
    p.add_argument("--device", default="auto")
    p.add_argument("--budget", help="memory wall for every tool, e.g. 24GiB (default: the spec's)")
    p.add_argument("--preset", help="workload preset (default: the spec's, sized for the device)")
    p.add_argument("--start", type=int, default=128, help="accelerate's starting_batch_size (its default: 128)")
    p.add_argument("--peer-oom", choices=("own", "bench"), default="own",
                   help="the peers' OOM check: their own (as shipped), or theirs and bench's (module docstring)")
    p.add_argument("--trials", type=int, default=8, help="trials of bench's sweep")
    p.add_argument("--sweep-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--peer-timeout", type=float, default=600.0, metavar="S")
    p.add_argument("--runs", type=int, default=3, help="measured runs of every answer, interleaved (median shown)")
    p.add_argument("--quick", action="store_true", help="short trial measurement (CI, tiny presets)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    rows = compare(args)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
