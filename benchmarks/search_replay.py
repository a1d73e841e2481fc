"""How many distinct configs does a search measure before it finds the best? Replayed on a recorded landscape.

    python benchmarks/search_replay.py LANDSCAPE.json [--seeds 20] [--budget 450MiB] [--headroom 0.1] [--json]

LANDSCAPE.json is `bench report --format json` of a study where every config of a space was
measured once (`sampler: grid`). bench's own sweep (harness.study.Sweep: the same sampler, skips,
phases and confirmation) runs with a runner that looks each trial up in the landscape instead of
launching it, on the device kind the landscape was recorded on (its planner's priors and compile
rule follow it); plain Optuna TPE and random sampling run on the same table. For each: the median and
p90, over seeds, of distinct configs measured until one within 2% of the best feasible config is,
and the median of the seconds the recorded trials took until then (repeats included; a recorded
trial ran every step, so a config bench would now cut short counts in full).
Skipped configs are not measured; a skip of a config that did fit in the landscape is an error.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

import optuna

from harness import ledger, pareto, search, spec as specs, study as studies
from harness.units import parse_size

WITHIN = 0.02


def load(path: Path, budget: int | None, headroom: float | None, objective: str | None) -> dict:
    doc = json.loads(path.read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    info = doc.get("study", {}) if isinstance(doc, dict) else {}
    # a bare `bench report --format json` has no study section: its trials' records carry the budget
    budget = budget or info.get("memory_budget") or next(
        ((r.get("memory") or {}).get("budget") for r in rows if (r.get("memory") or {}).get("budget")), None)
    headroom = headroom if headroom is not None else info.get("headroom", 0.1)
    objective = objective or info.get("objective") or ("tokens" if rows[0].get("tokens_per_s") else "samples")
    usable = budget * (1 - headroom) if budget else None
    table = {search.key(r["config"]): r for r in rows}
    fits = [r for r in rows if r["status"] == "ok" and (not usable or r["peak_memory"] <= usable)]
    best = max(pareto.single(r, objective) for r in fits)
    kind = info.get("device") or next(((r.get("memory") or {}).get("kind") for r in rows if (r.get("memory") or {}).get("kind")), "cpu")
    return {"rows": rows, "table": table, "budget": budget, "headroom": headroom, "objective": objective,
            "device": "cuda" if str(kind).startswith("cuda") else "cpu",
            "usable": usable, "target": best * (1 - WITHIN), "fits": {search.key(r["config"]) for r in fits}}


def spec_for(land: dict, path: Path, seed: int, trials: int) -> specs.Spec:
    """A spec whose search space is the landscape's: every knob with more than one value recorded."""
    configs = [r["config"] for r in land["rows"]]
    values = {k: sorted({c[k] for c in configs}, key=repr) for k in configs[0]}
    derived = len(values.get("accumulation", [])) > 1 and len({c["batch_size"] * c["accumulation"] for c in configs}) == 1
    search_raw = {k: v for k, v in values.items() if not (derived and k == "accumulation")}
    if derived:
        search_raw["accumulation"] = {"effective_batch": configs[0]["batch_size"] * configs[0]["accumulation"]}
    raw = {"study": f"replay-{seed}", "workload": {"name": land["rows"][0].get("workload", {}).get("name", "gpt")
                                                    if isinstance(land["rows"][0].get("workload"), dict) else "gpt"},
           "search": search_raw, "trials": trials, "seed": seed, "objective": land["objective"],
           "memory": {"budget": land["budget"], "headroom": land["headroom"]} if land["budget"] else {}}
    return specs.build(raw, path, None, ())


class Counter:
    """The replay runner: looks a trial up, counts distinct configs, notes when the target was reached."""

    def __init__(self, land: dict):
        self.land, self.seen, self.hit_at = land, [], None
        self.seconds, self.hit_s = 0.0, None  # the recorded trials' wall time, repeats included

    def __call__(self, config: dict, number: int, repeat: bool = False) -> dict:
        k = search.key(config)
        rec = self.land["table"].get(k) or {"status": "error", "throughput": None, "peak_memory": None,  # a gap in the grid
                                             "error": {"type": "NotRecorded", "message": "not in the landscape"}}
        self.seconds += (rec.get("timing") or {}).get("trial_wall_s") or 0.0
        if k not in self.seen:
            self.seen.append(k)
            speed = pareto.single(rec, self.land["objective"])
            if self.hit_at is None and k in self.land["fits"] and speed >= self.land["target"]:
                self.hit_at, self.hit_s = len(self.seen), self.seconds
        return json.loads(json.dumps(rec))


def run_bench(land: dict, path: Path, seed: int) -> tuple[int, float, list]:
    grid = len(land["rows"])
    spec = spec_for(land, path, seed, trials=grid)
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), land["device"])
    base = next((r["config"] for r in land["rows"] if r.get("baseline")), land["rows"][0]["config"])
    ledger.enqueue_baseline(study, spec, base)
    counter = Counter(land)
    with tempfile.TemporaryDirectory() as results:  # the claim lock's folder; nothing else is written
        sweep = studies.Sweep(spec, study, land["device"], Path(results), grid, None, auto=False, runner=counter)
        while counter.hit_at is None and sweep.counted() < grid and len(sweep.measured_configs()) < grid:
            if not sweep.plan_next():
                break
            sweep.run_one()
    wrong = [r for r in ledger.rows_of(study) if r["status"] == "skipped" and search.key(r["config"]) in land["fits"]]
    return counter.hit_at or grid, counter.hit_s or counter.seconds, wrong


def run_tpe(land: dict, seed: int) -> tuple[int, float]:
    configs = [r["config"] for r in land["rows"]]
    names = [k for k in configs[0] if len({repr(c[k]) for c in configs}) > 1]
    choices = {k: sorted({c[k] for c in configs}, key=repr) for k in names}
    by_params = {tuple(c[k] for k in names): c for c in configs}
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    counter = Counter(land)
    for _ in range(len(configs) * 20):
        if counter.hit_at or len(counter.seen) >= len(configs):
            break
        trial = study.ask()
        config = by_params.get(tuple(trial.suggest_categorical(k, choices[k]) for k in names))
        if config is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        rec = counter(config, trial.number)
        fits = search.key(config) in land["fits"]
        study.tell(trial, pareto.single(rec, land["objective"]) or 0.0 if fits else 0.0)
    return counter.hit_at or len(configs), counter.hit_s or counter.seconds


def run_random(land: dict, seed: int) -> tuple[int, float]:
    order = list(land["rows"])
    random.Random(seed).shuffle(order)
    counter = Counter(land)
    for r in order:
        counter(r["config"], 0)
        if counter.hit_at:
            break
    return counter.hit_at or len(order), counter.hit_s or counter.seconds


def summary(runs: list[tuple[int, float]]) -> dict:
    """Median and p90 of the distinct configs, and median of the recorded trial seconds, until the hit."""
    ordered = sorted(n for n, _ in runs)
    return {"median": statistics.median(ordered), "p90": ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))],
            "seconds": statistics.median(s for _, s in runs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("landscape", type=Path)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--budget", help="memory budget, e.g. 450MiB (default: the study's)")
    ap.add_argument("--headroom", type=float)
    ap.add_argument("--objective", choices=("samples", "tokens"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    land = load(args.landscape, parse_size(args.budget, "--budget") if args.budget else None, args.headroom, args.objective)
    results, wrong = {"bench": [], "tpe": [], "random": []}, []
    for seed in range(args.seeds):
        n, seconds, bad = run_bench(land, args.landscape, seed)
        results["bench"].append((n, seconds))
        wrong += bad
        results["tpe"].append(run_tpe(land, seed))
        results["random"].append(run_random(land, seed))
    grid = len(land["rows"])
    out = {"grid": grid, **{k: summary(v) for k, v in results.items()}, "wrong_skips": len(wrong)}
    print(f"{args.landscape.name}: {grid} configs, {args.seeds} seeds; distinct configs measured until one "
          f"within {WITHIN:.0%} of the best feasible ({land['target'] / (1 - WITHIN):.1f} {land['objective']}/s)")
    print("| search | median | p90 | recorded trial seconds, median |\n|---|---|---|---|")
    for name in ("bench", "tpe", "random"):
        s = out[name]
        print(f"| {name} | {s['median']:g} ({s['median'] / grid:.0%}) | {s['p90']:g} ({s['p90'] / grid:.0%}) "
              f"| {s['seconds']:.0f} |")
    print(f"skips of configs that fit in the landscape: {len(wrong)}")
    if args.json:
        print(json.dumps(out))
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
