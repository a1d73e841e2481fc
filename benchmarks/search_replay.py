"""How many distinct configs does a search measure before it finds the best? Replayed on a recorded landscape.

    python benchmarks/search_replay.py LANDSCAPE.json [--seeds 20] [--budget 450MiB] [--headroom 0.1] [--json]
    python benchmarks/search_replay.py LANDSCAPE.json --final [--trials 12] [--seeds 20]

LANDSCAPE.json is `bench report --format json` of a study where every config of a space was
measured once (`sampler: grid`). bench's own sweep (harness.study.Sweep: the same sampler, skips,
phases and confirmation) runs with a runner that looks each trial up in the landscape instead of
launching it, on the device kind the landscape was recorded on (its planner's priors and compile
rule follow it); plain Optuna TPE and random sampling run on the same table. For each: the median and
p90, over seeds, of distinct configs measured until one within 2% of the best feasible config is,
and the median of the seconds the recorded trials took until then (repeats included; a recorded
trial ran every step, so a config bench would now cut short counts in full).
Skipped configs are not measured; a skip of a config that did fit in the landscape is an error.

`--final` scores what a user gets instead: bench's sweep as `bench sweep` runs it (`--trials auto`,
capped at `--trials`, the quickstart's 12 by default; confirmation included), where every run of a
config, confirmation runs too, is one of its recorded grid passes drawn at random (a config recorded
in one pass repeats its figure). The final answer is read as `bench report`/`apply` read it
(harness.pareto.choose) and scored by its merged figure / the best feasible config's merged figure
(0 where it does not fit). Plain TPE and random get the same number of runs, their answer read the
same way, as in search_eval.py.
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

import search_eval
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
            "usable": usable, "best": best, "target": best * (1 - WITHIN), "fits": {search.key(r["config"]) for r in fits}}


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


VIEW_FIELDS = ("baseline", "best", "leader", "pareto", "tier", "tiers", "noisy", "unsafe", "unsearched", "speed",
               "vs_baseline", "passes", "passes_cv", "repeats")
"""What `bench report --format json` adds to a record: the study's view of it, not the measurement."""
GAP = {"status": "error", "throughput": None, "peak_memory": None,
       "error": {"type": "NotRecorded", "message": "not in the landscape"}}
"""A config the grid did not record."""


def as_recorded(row: dict) -> dict:
    """A recorded config as a fresh trial's record: without the report's view of it, and without the
    recording's own confirmation runs (`repeats`), which the replayed sweep never ran."""
    return json.loads(json.dumps({k: v for k, v in row.items() if k not in VIEW_FIELDS}))


class Counter:
    """The replay runner: looks a trial up, counts distinct configs, notes when the target was reached."""

    def __init__(self, land: dict):
        self.land, self.seen, self.hit_at = land, [], None
        self.seconds, self.hit_s = 0.0, None  # the recorded trials' wall time, repeats included

    def __call__(self, config: dict, number: int, repeat: bool = False) -> dict:
        k = search.key(config)
        rec = self.land["table"].get(k) or GAP
        self.seconds += (rec.get("timing") or {}).get("trial_wall_s") or 0.0
        if k not in self.seen:
            self.seen.append(k)
            speed = pareto.single(rec, self.land["objective"])
            if self.hit_at is None and k in self.land["fits"] and speed >= self.land["target"]:
                self.hit_at, self.hit_s = len(self.seen), self.seconds
        return as_recorded(rec)


def run_bench(land: dict, path: Path, seed: int) -> tuple[int, float, list]:
    grid = len(land["rows"])
    spec = spec_for(land, path, seed, trials=grid)
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), land["device"])
    ledger.enqueue_baseline(study, spec, baseline_config(land))
    counter = Counter(land)
    with tempfile.TemporaryDirectory() as results:  # the claim lock's folder; nothing else is written
        sweep = studies.Sweep(spec, study, land["device"], Path(results), grid, None, auto=False, runner=counter)
        while counter.hit_at is None and sweep.counted() < grid and len(sweep.measured_configs()) < grid:
            if not sweep.plan_next():
                break
            sweep.run_one()
    wrong = [r for r in ledger.rows_of(study) if r["status"] == "skipped" and search.key(r["config"]) in land["fits"]]
    return counter.hit_at or grid, counter.hit_s or counter.seconds, wrong


def drawn(row: dict, rng: random.Random) -> dict:
    """One run of a recorded config: one of its recorded passes, drawn at random, as a fresh record."""
    rec = as_recorded(row)
    if not row.get("passes"):
        return rec
    run = rng.choice(row["passes"])
    ok = run["status"] == "ok"
    recorded = rec.get("tokens_per_s") if isinstance(rec.get("tokens_per_s"), dict) else {}  # a report's median: a float
    tokens = {**recorded, "median": run["tokens_per_s"]} if ok and run["tokens_per_s"] else None
    rec.update(status=run["status"], throughput=run["throughput"] if ok else None, peak_memory=run["peak_memory"],
               tokens_per_s=tokens)
    # the row's first pass may have failed where this one ran, or the other way round
    rec["error"] = None if ok else rec.get("error") or {"type": run["status"].upper(), "message": "a recorded pass"}
    return rec


class Draws:
    """The final-answer runner: every run of a config draws one of its recorded passes; counts the runs."""

    def __init__(self, land: dict, seed: int):
        self.land, self.rng, self.count = land, random.Random(seed), 0

    def __call__(self, config: dict, number: int = 0, repeat: bool = False) -> dict:
        self.count += 1
        row = self.land["table"].get(search.key(config))
        return drawn(row, self.rng) if row else as_recorded(GAP)


def quality(land: dict, config: dict | None) -> float:
    """The answer's merged figure / the best feasible config's (0 where it does not fit, or no answer)."""
    k = search.key(config) if config else None
    if k not in land["fits"]:
        return 0.0
    return pareto.single(land["table"][k], land["objective"]) / land["best"]


def answer(land: dict, rows: list[dict]) -> dict | None:
    """The config `bench report` / `bench apply best` would take from these rows."""
    best = pareto.choose(rows, land["budget"], land["headroom"], land["objective"]).best
    return dict(best.config) if best else None


def final_bench(land: dict, path: Path, seed: int, trials: int) -> tuple[float, int]:
    """bench's sweep as `bench sweep` runs it, on drawn runs: (its answer's quality, the runs it took)."""
    spec = spec_for(land, path, seed, trials)
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), land["device"])
    ledger.enqueue_baseline(study, spec, baseline_config(land))
    draws = Draws(land, seed)
    with tempfile.TemporaryDirectory() as results:
        studies.Sweep(spec, study, land["device"], Path(results), trials, None, auto=True, runner=draws).run()
    return quality(land, answer(land, ledger.rows_of(study))), draws.count


def optuna_rows(land: dict, seed: int, runs: int, kind: str) -> list[dict]:
    """Plain Optuna's `runs` measured trials, your config first (marked, as the report marks it), a config
    that does not fit told 0. A combination the grid did not record (accumulation follows the batch under
    an effective batch) is told FAIL and costs no run."""
    names, choices, by_params = grid_params(land)
    sampler = optuna.samplers.TPESampler(seed=seed) if kind == "tpe" else optuna.samplers.RandomSampler(seed=seed)
    study = optuna.create_study(direction="maximize", sampler=sampler)
    base = baseline_config(land)
    study.enqueue_trial({k: base[k] for k in names})
    draws, rows = Draws(land, seed), []
    for _ in range(runs * 50):
        if len(rows) == runs:
            break
        trial = study.ask()
        config = by_params.get(tuple(trial.suggest_categorical(k, choices[k]) for k in names))
        if config is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        rec = {**draws(config), "config": config, "number": len(rows), "baseline": not rows}
        rows.append(rec)
        fits = rec["status"] == "ok" and (not land["usable"] or rec["peak_memory"] <= land["usable"])
        study.tell(trial, (pareto.single(rec, land["objective"]) or 0.0) if fits else 0.0)
    return rows


def baseline_config(land: dict) -> dict:
    """Your config: the one the recording measured first as the baseline."""
    return next((r["config"] for r in land["rows"] if r.get("baseline")), land["rows"][0]["config"])


def grid_params(land: dict) -> tuple[list, dict, dict]:
    """The knobs the landscape varies, the values of each, and the config of each combination recorded."""
    configs = [r["config"] for r in land["rows"]]
    names = [k for k in configs[0] if len({repr(c[k]) for c in configs}) > 1]
    choices = {k: sorted({c[k] for c in configs}, key=repr) for k in names}
    return names, choices, {tuple(c[k] for k in names): c for c in configs}


def run_tpe(land: dict, seed: int) -> tuple[int, float]:
    names, choices, by_params = grid_params(land)
    grid = len(land["rows"])
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed))
    counter = Counter(land)
    for _ in range(grid * 20):
        if counter.hit_at or len(counter.seen) >= grid:
            break
        trial = study.ask()
        config = by_params.get(tuple(trial.suggest_categorical(k, choices[k]) for k in names))
        if config is None:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        rec = counter(config, trial.number)
        fits = search.key(config) in land["fits"]
        study.tell(trial, pareto.single(rec, land["objective"]) or 0.0 if fits else 0.0)
    return counter.hit_at or grid, counter.hit_s or counter.seconds


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
    ap.add_argument("--final", action="store_true", help="score the final answer, runs drawn from the recorded passes")
    ap.add_argument("--trials", type=int, default=12, help="with --final: the sweep's cap (the quickstart's 12)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore")
    land = load(args.landscape, parse_size(args.budget, "--budget") if args.budget else None, args.headroom, args.objective)
    if args.final:
        final_main(args, land)
        return
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


def final_main(args, land: dict) -> None:
    """`--final`: each search's answer quality over the seeds, at bench's runs."""
    search_eval.nothing_launched()
    scores: dict[str, list[float]] = {"bench": [], "tpe": [], "random": []}
    runs = []
    for seed in range(args.seeds):
        q, n = final_bench(land, args.landscape, seed, args.trials)
        scores["bench"].append(q)
        runs.append(n)
        for kind in ("tpe", "random"):
            scores[kind].append(quality(land, answer(land, optuna_rows(land, seed, n, kind))))
    passes = statistics.median(len(r.get("passes") or [None]) for r in land["rows"])
    out = {"grid": len(land["rows"]), "passes": passes, "runs_median": statistics.median(runs), "runs_max": max(runs),
           **{k: {**search_eval.summary(v), "each": v} for k, v in scores.items()}}
    print(f"{args.landscape.name}: {out['grid']} configs, runs drawn from {passes:g} recorded pass(es) each, "
          f"{args.seeds} seeds, cap {args.trials} trials; the final answer's merged figure / the best feasible's")
    print("| search | median | p10 | mean |\n|---|---|---|---|")
    for name in scores:
        print(f"| {name} | {out[name]['median']:.3f} | {out[name]['p10']:.3f} | {out[name]['mean']:.3f} |")
    print(f"runs (bench's, the others given as many): median {out['runs_median']:g}, max {out['runs_max']}")
    if args.json:
        print(json.dumps(out))


if __name__ == "__main__":
    main()
