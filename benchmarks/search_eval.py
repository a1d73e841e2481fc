"""Does the search find the best config on problems it was not tuned on? Random GPU-shaped landscapes.

    python benchmarks/search_eval.py [--seeds 1000-1099] [--trials 16] [--only bench,tpe,gp,random,largest-fit] [--json]

Each seed draws one training problem on an 80 GiB card (10% headroom) from a physical model of a
step, and every search runs on it; every run (confirmation runs included) draws fresh noise. The
score is the FINAL ANSWER: the config `bench report`/`bench apply` would choose from the study
(harness.pareto.choose over the rows), its true (noise-free) throughput / the true best feasible
config's, where the true best is over every whole batch size from 4 up (not only the ladder of
`high: auto`). Side by side at the same number of runs as bench used on that seed: plain Optuna TPE,
Optuna's GPSampler, random sampling (your config enqueued first and marked, their answer read the
same way), and the largest batch that fits at the user's knobs (Lightning's
`scale_batch_size(mode="binsearch")` and accelerate's `find_executable_batch_size`: double from the
user's batch until it does not fit, then bisect; its own number of runs).

The generator (assumptions and ranges; all uniform unless said):
- space: batch_size {low: 4, high: auto}, precision fp32/tf32/bf16-mixed/fp16-mixed, checkpointing
  none/full, compile off/default, accumulation 1/2; the user's config: batch 16, fp32, no
  checkpointing, no compile, accumulation 1.
- one micro-step costs O + t(b) * b, an optimizer step U; accumulation a: throughput = a b / (a (O + t(b) b) + U).
  Per-sample time t = 1 ms (fp32); O = t * b_half, b_half log-uniform 4..512 (below it, launch-bound);
  small batches also under-fill the GPU: t(b) = t (1 + k / sqrt(b)), k 0..1 (the model does not know this);
  U = (O + 16 t) * 0.1..1.
- bf16-mixed: t / 2..4, activations x 0.5..0.7, static x 1.0..1.15, overhead x 1.0..1.3 (autocast);
  fp16-mixed: bf16's speed x 0.9..1.1, its memory x 0.95..1.05; tf32: t / 1.2..min(2, bf16's factor).
- checkpointing: t x 1.2..1.4, activations / 3..8. compile: overhead x 0.1..0.6, t x 0.8..1.0,
  activations x 0.7..1.0.
- memory: static W = 5..50% of the card; activations per sample such that fp32 without
  checkpointing hits the wall at a batch log-uniform 2..4096 (anywhere); each memory family's
  activations x 1.0..1.08 (allocator fragmentation, unknown to the model); accumulation holds the
  gradients, W / 4 more. A run over the card is an OOM; over the usable part (90%) it runs but does not fit.
- a cold compile costs 30..90 s, weighed by the choice against an assumed 10,000-step run.
- noise: throughput x exp(N(0, 3%)) fresh on every run, the record's step-time cv 1.5% (so that
  pareto's noise, twice the cv, is the 3% spread of runs); peaks repeat exactly (a CUDA allocator's
  max_memory_allocated does, run to run).
Tuning used seeds 0-99 only; the README reports seeds 1000-1099.
"""
from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import warnings
from functools import partial
from pathlib import Path

import optuna

from harness import busy, ledger, pareto, spec as specs, study as studies, zygote

GiB = 2**30
CARD = 80 * GiB
HEADROOM = 0.1
LOW = 4
USER = {"batch_size": 16, "precision": "fp32", "checkpointing": "none", "compile": "off", "accumulation": 1}
PRECISIONS = ("fp32", "tf32", "bf16-mixed", "fp16-mixed")
SEARCH = {"batch_size": {"low": LOW, "high": "auto"}, "precision": list(PRECISIONS),
          "checkpointing": ["none", "full"], "compile": ["off", "default"], "accumulation": [1, 2]}
NOISE = 0.03
MS = 1e-3
"""The generator's time unit: fp32's per-sample time is 1 ms."""


class Landscape:
    """One random GPU-shaped problem: `true(config)` -> (throughput, peak); `run(config)` -> a noisy record."""

    def __init__(self, seed: int):
        r = random.Random(seed)
        u = r.uniform
        self.rng = random.Random(seed + 1)
        bf16 = u(2, 4)
        self.t = {"fp32": 1.0, "tf32": 1 / u(1.2, min(2.0, bf16)), "bf16-mixed": 1 / bf16, "fp16-mixed": u(0.9, 1.1) / bf16}
        self.o_prec = {"fp32": 1.0, "tf32": 1.0, "bf16-mixed": u(1.0, 1.3)}
        self.o_prec["fp16-mixed"] = self.o_prec["bf16-mixed"]
        act16 = u(0.5, 0.7)
        self.a_prec = {"fp32": 1.0, "tf32": 1.0, "bf16-mixed": act16, "fp16-mixed": act16 * u(0.95, 1.05)}
        w16 = u(1.0, 1.15)
        self.w_prec = {"fp32": 1.0, "tf32": 1.0, "bf16-mixed": w16, "fp16-mixed": w16}
        self.ckpt_t, self.ckpt_a = u(1.2, 1.4), 1 / u(3, 8)
        self.comp_o, self.comp_t, self.comp_a = u(0.1, 0.6), u(0.8, 1.0), u(0.7, 1.0)
        self.overhead = math.exp(u(math.log(4), math.log(512)))
        self.occupancy = u(0, 1)
        self.optimizer = (self.overhead + 16) * u(0.1, 1.0)
        self.static = CARD * u(0.05, 0.5)
        wall = math.exp(u(math.log(2), math.log(4096)))
        self.act = (CARD * (1 - HEADROOM) - self.static) / wall
        self.frag = {(p, c, k): u(1.0, 1.08) for p in PRECISIONS for c in ("none", "full") for k in ("off", "default")}
        self.compile_s = u(30, 90)  # a cold compile; the choice weighs it against the run (pareto.paybacks)

    def fragmentation(self, config: dict) -> float:
        return self.frag[(config["precision"], config["checkpointing"], config["compile"])]

    def true(self, config: dict) -> tuple[float, float]:
        b, a, p = config["batch_size"], config.get("accumulation", 1), config["precision"]
        ckpt, comp = config["checkpointing"] == "full", config["compile"] != "off"
        t = self.t[p] * (self.ckpt_t if ckpt else 1) * (self.comp_t if comp else 1) * (1 + self.occupancy / math.sqrt(b))
        o = self.overhead * self.o_prec[p] * (self.comp_o if comp else 1)
        speed = a * b / (a * (o + t * b) + self.optimizer) / MS
        act = self.act * self.a_prec[p] * (self.ckpt_a if ckpt else 1) * (self.comp_a if comp else 1) * self.fragmentation(config)
        static = self.static * self.w_prec[p]
        peak = static + act * b + (self.static / 4 if a > 1 else 0)
        return speed, peak

    def run(self, config: dict) -> dict:
        speed, peak = self.true(config)
        if peak > CARD:
            return {"status": "oom", "throughput": None, "peak_memory": None, "error": None}
        measured = speed * math.exp(self.rng.gauss(0, NOISE))
        step = config.get("accumulation", 1) * config["batch_size"] / measured
        return {"status": "ok", "throughput": measured, "peak_memory": peak,
                "timing": {"step_s": {"cv": NOISE / 2, "median": step}, "first_step_s": step,
                           "compile_s": self.compile_s if config["compile"] != "off" else 0.0}}

    def fits(self, config: dict) -> bool:
        return self.true(config)[1] <= CARD * (1 - HEADROOM)

    def best(self, whole: bool = False) -> float:
        """The true best feasible throughput over the searched space (the ladder of `high: auto`), or
        over every whole batch size from LOW (speed grows with batch within a family, so each family's
        best is its largest batch that fits)."""
        ladder, top = specs.batch_ladder(LOW), 0.0
        for p in PRECISIONS:
            for ckpt in ("none", "full"):
                for comp in ("off", "default"):
                    for a in (1, 2):
                        config = {"precision": p, "checkpointing": ckpt, "compile": comp, "accumulation": a}
                        b = self.largest_fit(config)
                        if b and not whole:
                            b = max((x for x in ladder if x <= b), default=None)
                        if b:
                            top = max(top, self.true({**config, "batch_size": b})[0])
        return top

    def largest_fit(self, config: dict, top: int = specs.AUTO_BATCH_TOP) -> int | None:
        lo, hi = LOW - 1, top + 1  # fits at lo (or lo is below the range), not at hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if self.fits({**config, "batch_size": mid}) else (lo, mid)
        return lo if lo >= LOW else None

    def quality(self, config: dict | None, whole: bool = False) -> float:
        return self.true(config)[0] / self.best(whole) if config and self.fits(config) else 0.0


class Runs:
    """The runner every search uses: counts runs, returns a noisy record."""

    def __init__(self, land: Landscape):
        self.land, self.count = land, 0

    def __call__(self, config: dict, number: int = 0, repeat: bool = False) -> dict:
        self.count += 1
        return self.land.run(config)


def spec_for(seed: int, trials: int, sampler: str = "tpe") -> specs.Spec:
    raw = {"study": f"eval-{seed}", "workload": {"name": "emberformer"}, "search": SEARCH, "trials": trials,
           "seed": seed, "sampler": sampler, "memory": {"budget": CARD, "headroom": HEADROOM}}
    return specs.build(raw, Path("eval.yaml"), None, ())


def answer(rows: list[dict]) -> dict | None:
    best = pareto.choose(rows, CARD, HEADROOM).best  # what `bench report` / `bench apply best` take
    return dict(best.config) if best else None


def run_bench(seed: int, trials: int) -> tuple[dict | None, int]:
    land = Landscape(seed)
    spec = spec_for(seed, trials)
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cuda")
    ledger.enqueue_baseline(study, spec, spec.config(USER))
    runs = Runs(land)
    with tempfile.TemporaryDirectory() as results:
        studies.Sweep(spec, study, "cuda", Path(results), trials, None, auto=True, runner=runs).run()
    return answer(ledger.rows_of(study)), runs.count


def run_optuna(seed: int, runs: int, kind: str) -> dict | None:
    """Plain Optuna at `runs` runs: every run a trial, infeasible ones told 0 and constrained."""
    land = Landscape(seed)
    ladder = specs.batch_ladder(LOW)
    constraint = lambda t: (t.user_attrs.get("over", 0.0),)  # noqa: E731
    sampler = {"tpe": lambda: optuna.samplers.TPESampler(seed=seed, constraints_func=constraint),
               "gp": lambda: optuna.samplers.GPSampler(seed=seed, constraints_func=constraint),
               "random": lambda: optuna.samplers.RandomSampler(seed=seed)}[kind]()
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.enqueue_trial({"batch_size": ladder.index(USER["batch_size"]), **{k: v for k, v in USER.items() if k != "batch_size"}})
    rows = []
    for number in range(runs):
        trial = study.ask()
        config = {"batch_size": ladder[trial.suggest_int("batch_size", 0, len(ladder) - 1)],
                  **{k: trial.suggest_categorical(k, SEARCH[k]) for k in ("precision", "checkpointing", "compile", "accumulation")}}
        rec = {**land.run(config), "config": config, "number": number, "baseline": number == 0}  # your config, enqueued
        rows.append(rec)
        ok = rec["status"] == "ok" and rec["peak_memory"] <= CARD * (1 - HEADROOM)
        trial.set_user_attr("over", 0.0 if ok else 1.0)
        study.tell(trial, rec["throughput"] if ok else 0.0)
    return answer(rows)


def run_largest_fit(seed: int) -> tuple[dict | None, int]:
    """Double the user's batch until it does not fit, then bisect; the user's other knobs."""
    land = Landscape(seed)
    runs = Runs(land)

    def fits(b):
        rec = runs({**USER, "batch_size": b})
        return rec["status"] == "ok" and rec["peak_memory"] <= CARD * (1 - HEADROOM)

    b = USER["batch_size"]
    if fits(b):
        while b * 2 <= specs.AUTO_BATCH_TOP and fits(b * 2):
            b *= 2
        lo, hi = b, b * 2
    else:
        lo, hi = 0, b
        while hi > 1 and not fits(hi // 2):
            hi //= 2
        lo = hi // 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return ({**USER, "batch_size": lo} if lo >= 1 else None), runs.count


def one_seed(seed: int, trials: int, only: list[str]) -> tuple[int, dict]:
    """Every search on one landscape: (final answer's quality over the ladder, over every whole batch, runs)."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    land = Landscape(seed)
    config, n = run_bench(seed, trials)
    answers = {"bench": (config, n)} if "bench" in only else {}
    for kind in ("tpe", "gp", "random"):
        if kind in only:
            answers[kind] = (run_optuna(seed, n, kind), n)
    if "largest-fit" in only:
        answers["largest-fit"] = run_largest_fit(seed)
    return seed, {k: (land.quality(c), land.quality(c, whole=True), m) for k, (c, m) in answers.items()}


def seeds_of(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "p10": ordered[int(0.1 * (len(ordered) - 1))],
            "mean": statistics.fmean(ordered)}


def nothing_launched() -> None:
    """A replayed sweep launches no trial: no host to wait for quiet, no trial server to start."""
    os.environ.setdefault(busy.WAIT_ENV, "0")
    os.environ.setdefault(zygote.ENV_SWITCH, zygote.FRESH)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1000-1099", help="a range, e.g. 0-99 (tuning) or 1000-1099 (reported)")
    ap.add_argument("--trials", type=int, default=16)
    ap.add_argument("--only", default="bench,tpe,gp,random,largest-fit")
    ap.add_argument("--jobs", type=int, default=1, help="landscapes evaluated at once (processes)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    nothing_launched()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    only = args.only.split(",")
    quality: dict[str, list] = {k: [] for k in only}
    whole: dict[str, list] = {k: [] for k in only}
    runs: dict[str, list] = {k: [] for k in only}
    with multiprocessing.Pool(args.jobs) as pool:
        for seed, result in pool.imap(partial(one_seed, trials=args.trials, only=only), seeds_of(args.seeds)):
            for k, (q, w, n) in result.items():
                quality[k].append(q)
                whole[k].append(w)
                runs[k].append(n)
            print(f"seed {seed}: " + " ".join(f"{k} {q:.3f}/{n}" for k, (q, _, n) in result.items()), file=sys.stderr, flush=True)
    out = {k: {**summary(quality[k]), "whole": summary(whole[k]), "runs_median": statistics.median(runs[k]),
               "runs_max": max(runs[k])} for k in only}
    print(f"{len(seeds_of(args.seeds))} GPU-shaped landscapes (seeds {args.seeds}), cap {args.trials} trials; final "
          "answer's true throughput / the true best feasible config of the searched space (and of every whole batch)")
    print("| search | median | p10 | mean | every whole batch: median, p10 | runs: median (max) |\n|---|---|---|---|---|---|")
    for k in only:
        s = out[k]
        print(f"| {k} | {s['median']:.3f} | {s['p10']:.3f} | {s['mean']:.3f} | {s['whole']['median']:.3f}, "
              f"{s['whole']['p10']:.3f} | {s['runs_median']:g} ({s['runs_max']}) |")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
