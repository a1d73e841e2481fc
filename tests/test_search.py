"""The search policy (issue #11): sampler feed, duplicates, per-family memory skips, confirmation, auto stop, replay.

Trials here are looked up, not launched (Sweep's `runner` seam, the one benchmarks/search_replay.py
uses), so the policy is tested exactly and fast; the real launcher path is covered by test_cli/test_faults.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from harness import busy, ledger, pareto, record, report, search, spec as specs, study as studies

MiB = 2**20
ROOT = Path(__file__).resolve().parents[1]


def make_spec(tmp_path, trials=16, **search_over) -> specs.Spec:
    search_raw = search_over or {"batch_size": [4, 8, 16, 32], "precision": ["fp32", "bf16-mixed"],
                                 "checkpointing": ["none", "full"]}
    raw = {"study": "s", "workload": {"name": "emberformer"}, "search": search_raw, "trials": trials,
           "memory": {"budget": "100MiB", "headroom": 0.1}}
    return specs.build(raw, tmp_path / "spec.yaml", None, ())


def landscape(config: dict) -> dict:
    """Peak grows with batch (checkpointing halves the slope); speed grows with batch; OOM over 100 MiB."""
    slope = 1.5 if config["checkpointing"] == "full" else 3.0
    peak = (10 + slope * config["batch_size"]) * MiB
    speed = config["batch_size"] * (1.3 if config["precision"] == "bf16-mixed" else 1.0) * (
        0.8 if config["checkpointing"] == "full" else 1.0)
    if peak > 100 * MiB:
        return {"status": "oom", "throughput": None, "peak_memory": None}
    return {"status": "ok", "throughput": speed, "peak_memory": peak, "timing": {"step_s": {"cv": 0.005}}}


class Runner:
    def __init__(self, table=landscape):
        self.table, self.runs = table, []

    def __call__(self, config, number, repeat=False):
        self.runs.append(dict(config))
        return dict(self.table(config))


class Noted(studies.Progress):
    """A sweep's notes, kept in `notes` for the test to read."""

    def __init__(self, notes: list):
        self.notes = notes

    def note(self, message):
        self.notes.append(message)


def sweep_for(spec, tmp_path, runner, total=None, auto=False, baseline=None, notes=None):
    """A sweep on an in-memory study; its notes appended to `notes` where one is given."""
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    if baseline:
        ledger.enqueue_baseline(study, spec, spec.config(baseline))
    progress = Noted(notes) if notes is not None else studies.Progress()
    return studies.Sweep(spec, study, "cpu", tmp_path, total or spec.trials, None, progress, auto=auto, runner=runner)


def test_enqueued_trials_reach_the_sampler_with_params_and_batch_is_ordinal(tmp_path):
    spec = make_spec(tmp_path)
    sweep = sweep_for(spec, tmp_path, Runner(), baseline={"batch_size": 8, "precision": "fp32", "checkpointing": "none"})
    sweep.run_one()
    first = sweep.study.trials[0]
    assert first.user_attrs["baseline"] and first.params  # the enqueued baseline is in the sampler's history
    assert isinstance(first.distributions["batch_size"], optuna.distributions.IntDistribution)  # ordinal index
    assert first.params["batch_size"] == 1 and first.user_attrs["config"]["batch_size"] == 8


def test_duplicates_are_not_told_as_observations(tmp_path):
    spec = make_spec(tmp_path)
    sweep = sweep_for(spec, tmp_path, Runner())
    config = spec.config({"batch_size": 8, "precision": "fp32", "checkpointing": "none"})
    sweep.enqueue(config)
    sweep.enqueue(config)
    sweep.study.enqueue_trial(ledger.sampler_params(spec, config), user_attrs={"config": config}, skip_if_exists=False)
    for _ in range(3):
        sweep.run_one()
    complete = sweep.study.get_trials(states=(TrialState.COMPLETE,))
    assert len(complete) == 1  # one observation of that config, however often it was proposed
    dupes = [t for t in sweep.study.trials if "duplicate_of" in t.user_attrs]
    assert dupes and all(t.state == TrialState.FAIL for t in dupes)


def test_a_batch_above_an_oom_of_its_family_is_skipped_with_its_record(tmp_path):
    spec = make_spec(tmp_path)
    runner = Runner()
    sweep = sweep_for(spec, tmp_path, runner)
    family = {"precision": "fp32", "checkpointing": "none"}
    sweep.enqueue(spec.config({"batch_size": 32, **family}))  # 106 MiB: OOM
    sweep.enqueue(spec.config({"batch_size": 32, **family, "checkpointing": "full"}))  # other family: runs, fits
    sweep.run_one()
    sweep.run_one()
    assert len(runner.runs) == 2
    # a bigger batch of the OOM family is never run (widen the space so there is one)
    spec2 = make_spec(tmp_path, batch_size=[4, 8, 16, 32, 64], precision=["fp32", "bf16-mixed"], checkpointing=["none", "full"])
    sweep.spec = spec2
    sweep.enqueue(spec2.config({"batch_size": 64, **family}))
    sweep.run_one()
    assert len(runner.runs) == 2
    rows = ledger.rows_of(sweep.study)
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["skip"]["from"] == [0] and skipped[0]["throughput"] is None
    choice = pareto.choose(rows, spec.memory_budget, spec.headroom)
    assert choice.best.record.status == "ok"


def test_a_fitted_peak_far_over_the_budget_is_skipped_and_never_a_config_that_fits(tmp_path):
    rows = [{"number": n, "status": "ok", "config": {"batch_size": b, "precision": "fp32"}, "peak_memory": (10 + 3 * b) * MiB}
            for n, b in enumerate((4, 8))]
    usable = 90 * MiB
    assert search.skip_reason({"batch_size": 64, "precision": "fp32"}, rows, usable)["from"] == [0, 1]
    assert search.skip_reason({"batch_size": 16, "precision": "fp32"}, rows, usable) is None  # 58 MiB fits
    assert search.skip_reason({"batch_size": 32, "precision": "fp32"}, rows, usable) is None  # 106: inside margin
    assert search.skip_reason({"batch_size": 64, "precision": "bf16-mixed"}, rows, usable) is None  # other family


def test_an_oom_with_accumulation_says_nothing_about_the_same_batch_without():
    # accumulation keeps the gradients alive through the next micro-batch: its peak is the higher one
    oom = {"number": 0, "status": "oom", "config": {"batch_size": 32, "accumulation": 2, "precision": "fp32"}}
    assert search.skip_reason({"batch_size": 32, "accumulation": 1, "precision": "fp32"}, [oom], 90 * MiB) is None
    oom1 = {**oom, "config": {**oom["config"], "accumulation": 1}}
    assert search.skip_reason({"batch_size": 32, "accumulation": 2, "precision": "fp32"}, [oom1], 90 * MiB)["from"] == [0]


def plateau(config: dict) -> dict:
    """Speed peaks at batch 16 and falls above it (a saturated device, or one out of cache)."""
    rec = landscape(config)
    if rec["throughput"]:
        rec["throughput"] = min(config["batch_size"], 36 - config["batch_size"]) * (
            1.3 if config["precision"] == "bf16-mixed" else 1.0)
    return rec


def test_a_sweep_finds_the_fastest_config_below_its_frontier_on_a_plateau(tmp_path):
    """Throughput falls past batch 16: the model's cache term (k) lets it say so, and the fastest
    config, one step below the frontier, is measured well before the space is exhausted."""
    spec = make_spec(tmp_path, trials=9, batch_size=[4, 8, 16, 24], precision=["fp32", "bf16-mixed"],
                     checkpointing=["none"])
    runner = Runner(plateau)
    sweep = sweep_for(spec, tmp_path, runner)
    for _ in range(6):
        assert sweep.plan_next()
        sweep.run_one()
    assert {"batch_size": 16, "precision": "bf16-mixed"}.items() <= next(
        c for c in runner.runs if c["batch_size"] == 16 and c["precision"] == "bf16-mixed").items()


def test_confirmation_reruns_change_a_noisy_winner(tmp_path):
    spec = make_spec(tmp_path, batch_size=[4, 8], precision=["fp32", "bf16-mixed"])
    first = {}

    def noisy(config):  # batch 8 fp32 was lucky once; bf16 is really faster
        rec = landscape({**config, "checkpointing": "none"})
        key = (config["batch_size"], config["precision"])
        if key == (8, "fp32") and key not in first:
            first[key] = True
            rec["throughput"] = 20.0
        return rec

    sweep = sweep_for(spec, tmp_path, Runner(noisy), total=4, baseline={"batch_size": 4, "precision": "fp32"})
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    before = max(rows, key=lambda r: r["throughput"] or 0)
    assert before["config"]["precision"] == "fp32"  # the single runs crown the lucky one
    best = pareto.choose(rows, spec.memory_budget, spec.headroom).best
    assert best.config == spec.config({"batch_size": 8, "precision": "bf16-mixed"}) and len(best.record.repeats) == 2
    v = pareto.versus(best.record, next(r for r in rows if r["baseline"]))
    assert v.ratio == pytest.approx(2.6) and v.spread == pytest.approx(0.0) and v.paired == 2


def test_the_leader_is_confirmed_even_where_your_config_ran_out_of_memory(tmp_path):
    """With no baseline that ran ok there was no pair to interleave, and the leader was never confirmed,
    while the report's next step said `bench sweep` again would confirm it (it would not)."""
    spec = make_spec(tmp_path, trials=6)
    runner = Runner()
    sweep = sweep_for(spec, tmp_path, runner, baseline={"batch_size": 32, "precision": "fp32", "checkpointing": "none"})
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    assert next(r for r in rows if r["baseline"])["status"] == "oom"
    leader = pareto.choose(rows, spec.memory_budget, spec.headroom).leader
    assert leader.runs == 3 and len(runner.runs) == 6 + 2


def sweep_with_one_lucky_run(tmp_path, trials: int) -> tuple:
    """Your config (batch 4), then batch 8 fp32 whose first run reads 4000 samples/s, 500x its speed
    (a loaded machine), which confirmation corrects; --trials auto. The study, its spec and the notes."""
    spec = make_spec(tmp_path, trials=trials)
    lucky = {}

    def table(config):
        rec = landscape(config)
        if (config["batch_size"], config["precision"], config["checkpointing"]) == (8, "fp32", "none") and not lucky:
            lucky["once"] = True
            rec["throughput"] = 4000.0
        return rec

    notes = []

    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    ledger.enqueue_baseline(study, spec, spec.config({"batch_size": 4, "precision": "fp32", "checkpointing": "none"}))
    lucky_config = spec.config({"batch_size": 8, "precision": "fp32", "checkpointing": "none"})
    study.enqueue_trial(ledger.sampler_params(spec, lucky_config), user_attrs={"config": lucky_config})
    studies.Sweep(spec, study, "cpu", tmp_path, spec.trials, None, Noted(notes), auto=True, runner=Runner(table)).run()
    return study, spec, notes


@pytest.mark.parametrize("researches", [0, 1])
def test_trials_auto_searches_on_when_confirmation_lowers_the_best_it_stopped_against(tmp_path, monkeypatch, researches):
    """examples/lightning on a loaded machine: --trials auto stopped against a leader whose one run was
    lucky (1676.8); confirmation put it at 174.9, and the sweep ended with an untried config predicted
    to beat the new best by 100%."""
    monkeypatch.setattr(studies, "RESEARCHES", researches)
    study, spec, notes = sweep_with_one_lucky_run(tmp_path, trials=16)
    best = pareto.choose(ledger.rows_of(study), spec.memory_budget, spec.headroom).best
    top = max(landscape(c)["throughput"] or 0 for c in specs.all_configs(spec))
    if researches:
        assert any("not the 4000.0 the search stopped against: searching on" in n for n in notes)
        assert best.speed >= 0.97 * top
    else:  # before: the search ended where the lucky run stopped it
        assert best.speed < 0.97 * top


def test_at_the_cap_confirmation_lowering_the_bar_does_not_say_searching_on(tmp_path):
    """The note said "searching on" and no trial ran: the lucky run was the cap's last trial."""
    _, _, notes = sweep_with_one_lucky_run(tmp_path, trials=2)
    said = [n for n in notes if "the search stopped against" in n]
    assert said and all("searching on" not in n for n in said), notes
    assert "the cap of 2 trials is reached; raise the spec's trials" in said[0]


def test_trials_auto_stops_before_the_cap(tmp_path):
    spec = make_spec(tmp_path, trials=40, batch_size=[4, 8, 16, 32], precision=["fp32", "bf16-mixed"],
                     checkpointing=["none", "full"], compile=["off", "default"])
    runner = Runner(lambda c: landscape(c) if c["compile"] == "off" else {**landscape(c), "throughput": (landscape(c)["throughput"] or 0) * 1.1 or None})
    sweep = sweep_for(spec, tmp_path, runner, auto=True, baseline={"batch_size": 8, "precision": "fp32", "checkpointing": "none", "compile": "off"})
    sweep.run()
    measured = sweep.counted()
    assert measured < 30  # stopped on its own, well under the cap of 40 and the 32-config space
    compiled = [c for c in runner.runs if c["compile"] != "off"]
    assert compiled and len({search.key(c) for c in compiled}) <= studies.COMPILE_TOP


def test_replay_runs_on_a_tiny_landscape(tmp_path):
    spec = make_spec(tmp_path)
    rows = [{"number": n, **landscape(c), "config": c, "baseline": n == 0, "workload": {"name": "emberformer"},
             "timing": {"trial_wall_s": 2.5}} for n, c in enumerate(specs.all_configs(spec))]
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(rows))
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_replay.py"), str(path), "--seeds", "3",
                          "--budget", "100MiB", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["grid"] == 16 and result["wrong_skips"] == 0
    assert 1 <= result["bench"]["median"] <= 16 and set(result["tpe"]) == {"median", "p90", "seconds"}
    assert result["random"]["seconds"] == 2.5 * result["random"]["median"]  # each config once, 2.5 s each
    assert result["bench"]["seconds"] >= 2.5 * result["bench"]["median"]  # and any repeat on top


def test_a_bare_report_is_replayed_under_the_budget_its_trials_ran_under(tmp_path, monkeypatch):
    # `bench report --format json` is a list with no study section; naics-cpu.json and gpt-cpu-free.json
    # were replayed with no wall at all until the replay read the budget its trials recorded.
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import search_replay
    rows = [{"number": 0, "config": {"batch_size": 8}, "status": "ok", "throughput": 100.0, "peak_memory": 50 * MiB,
             "memory": {"kind": "cpu", "budget": 100 * MiB}},
            {"number": 1, "config": {"batch_size": 16}, "status": "ok", "throughput": 150.0, "peak_memory": 95 * MiB,
             "memory": {"kind": "cpu", "budget": 100 * MiB}}]
    path = tmp_path / "bare.json"
    path.write_text(json.dumps(rows))
    land = search_replay.load(path, None, None, "samples")
    assert land["budget"] == 100 * MiB and land["usable"] == 90 * MiB
    assert land["fits"] == {search.key({"batch_size": 8})} and land["target"] == 100.0 * (1 - search_replay.WITHIN)


def test_merged_passes_give_each_config_its_median_and_the_replay_reads_them(tmp_path):
    spec = make_spec(tmp_path)
    reports = []
    for scale in (1.0, 1.5, 0.5):  # three passes of one grid: the middle one is each config's median
        rows = [{"number": n, **landscape(c), "config": c, "baseline": n == 0} for n, c in enumerate(specs.all_configs(spec))]
        for r in rows:  # tokens/s as `bench report --format json` writes it: the median, a number
            r["throughput"] = r["throughput"] * scale if r["throughput"] else None
            r["tokens_per_s"] = r["throughput"] * 16 if r["throughput"] else None
        reports.append(tmp_path / f"p{scale}.json")
        reports[-1].write_text(json.dumps(rows))
    out = tmp_path / "merged.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "landscape_merge.py"), str(out), *map(str, reports),
                          "--budget", "100MiB"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    doc = json.loads(out.read_text())
    row = next(r for r in doc["rows"] if r["status"] == "ok")
    assert row["throughput"] == landscape(row["config"])["throughput"] and len(row["passes"]) == 3
    assert row["tokens_per_s"] == {"median": row["throughput"] * 16}
    assert doc["study"]["memory_budget"] == 100 * MiB
    replay = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_replay.py"), str(out), "--seeds", "2",
                             "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert replay.returncode == 0 and json.loads(replay.stdout.strip().splitlines()[-1])["grid"] == 16


def test_a_replayed_run_is_one_recorded_pass_of_its_config_and_not_the_report_s_view(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import random
    import search_replay
    row = {"number": 3, "config": {"batch_size": 8}, "status": "ok", "throughput": 100.0, "peak_memory": 50 * MiB,
           "error": {"type": "OverBudget", "message": "the first pass's"}, "tokens_per_s": {"median": 900.0},
           "baseline": True, "best": True, "tier": "best", "passes_cv": 0.1,
           "repeats": [{"status": "ok", "throughput": 500.0}],  # the recording sweep's confirmation, not the replay's
           "passes": [{"status": "ok", "throughput": 90.0, "peak_memory": 49 * MiB, "tokens_per_s": 810.0},
                      {"status": "ok", "throughput": 100.0, "peak_memory": 50 * MiB, "tokens_per_s": 900.0},
                      {"status": "oom", "throughput": None, "peak_memory": None, "tokens_per_s": None}]}
    rng = random.Random(0)
    runs = [search_replay.drawn(row, rng) for _ in range(60)]
    assert {r["throughput"] for r in runs} == {90.0, 100.0, None}  # every pass drawn, nothing else
    assert all(r["tokens_per_s"]["median"] == r["throughput"] * 9 for r in runs if r["status"] == "ok")
    oom = next(r for r in runs if r["status"] == "oom")
    assert oom["peak_memory"] is None and oom["tokens_per_s"] is None and oom["error"]["type"] == "OverBudget"
    assert all(r["error"] is None for r in runs if r["status"] == "ok")  # a pass that ran carries no other's error
    assert not any(k in r for r in runs for k in ("baseline", "best", "tier", "passes", "passes_cv", "repeats"))
    assert row["passes"][2]["status"] == "oom" and row["throughput"] == 100.0  # the landscape is not changed
    # the first-hit replay's lookup too: a one-pass landscape's recorded confirmation runs once made the
    # replayed study believe your config was confirmed (emberformer-cpu-20: 9 configs to the best, not 4)
    land = {"table": {search.key(row["config"]): row}, "objective": "samples", "fits": set(), "target": 1e9}
    looked_up = search_replay.Counter(land)(row["config"], 0)
    assert looked_up["throughput"] == 100.0 and "repeats" not in looked_up and "baseline" not in looked_up


def test_the_final_replay_scores_the_config_bench_report_would_apply(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import search_replay
    spec = make_spec(tmp_path)
    reports = []
    for scale in (1.0, 1.02, 0.98):  # three passes, 2% apart
        rows = [{"number": n, **landscape(c), "config": c, "baseline": n == 0} for n, c in enumerate(specs.all_configs(spec))]
        for r in rows:  # tokens/s as `bench report --format json` writes it: the median, a number
            r["throughput"] = r["throughput"] * scale if r["throughput"] else None
            r["tokens_per_s"] = r["throughput"] * 16 if r["throughput"] else None
        reports.append(tmp_path / f"p{scale}.json")
        reports[-1].write_text(json.dumps(rows))
    out = tmp_path / "merged.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "landscape_merge.py"), str(out), *map(str, reports),
                    "--budget", "60MiB"], check=True, capture_output=True, timeout=120, cwd=ROOT)
    # usable 54 MiB: bf16-mixed 16 with checkpointing fits (34 MiB, 16.6/s); bf16-mixed 32 with it runs
    # (58 MiB, 33.3/s) but over the usable memory, so an answer that ignored the headroom would score 0
    land = search_replay.load(out, None, None, None)
    best = {"batch_size": 16, "precision": "bf16-mixed", "checkpointing": "full", "accumulation": 1, "compile": "off"}
    assert search_replay.quality(land, best) == 1.0
    assert search_replay.quality(land, {**best, "batch_size": 32}) == 0.0
    assert search_replay.quality(land, {**best, "batch_size": 8}) == pytest.approx(0.5)  # merged figure / the best's
    assert search_replay.quality(land, None) == 0.0
    replay = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_replay.py"), str(out), "--final",
                             "--seeds", "3", "--trials", "12", "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert replay.returncode == 0, replay.stderr[-2000:]
    result = json.loads(replay.stdout.strip().splitlines()[-1])
    assert result["bench"]["each"] == [1.0, 1.0, 1.0] and result["passes"] == 3
    assert result["runs_median"] > 3  # confirmation runs count: your config and the leader run again


def test_plain_optuna_in_the_final_replay_gets_as_many_recorded_runs_and_your_config_is_marked(tmp_path, monkeypatch):
    # under an effective batch, accumulation follows the batch: most combinations of the two were never
    # recorded, and a sampler that proposes one must not lose a run to it (TPE had 2-6 of its 10 on gpt)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import search_replay
    rows = [{"number": n, "status": "ok", "throughput": 10.0 * b * (1.5 if p == "bf16-mixed" else 1.0),
             "peak_memory": (10 + b) * MiB, "baseline": n == 0, "memory": {"kind": "cpu", "budget": 100 * MiB},
             "config": {"batch_size": b, "accumulation": 8 // b, "precision": p}}
            for n, (b, p) in enumerate((b, p) for b in (1, 2, 4, 8) for p in ("fp32", "bf16-mixed"))]
    (tmp_path / "effective.json").write_text(json.dumps(rows))
    land = search_replay.load(tmp_path / "effective.json", None, None, "samples")
    for kind in ("tpe", "random"):
        runs = search_replay.optuna_rows(land, 0, 6, kind)
        assert len(runs) == 6 and [r["number"] for r in runs] == list(range(6))
        assert all(search.key(r["config"]) in land["table"] for r in runs)
        assert runs[0]["config"] == rows[0]["config"] and [r["baseline"] for r in runs] == [True] + [False] * 5


def test_busy_counts_other_processes_on_the_gpu_and_not_on_a_cpu():
    quiet = {"steal": 0.0, "total": 100.0, "gpu_processes": 0}
    assert busy.verdict(quiet, {**quiet, "total": 200.0, "gpu_processes": 2})["gpu_processes"] == 2
    assert busy.gpu_processes("cpu") == 0


def test_a_grid_measures_every_config_even_above_an_oom(tmp_path):
    """sampler: grid is how landscapes are recorded: a skip there would hide whether skips are right."""
    raw = {"study": "g", "workload": {"name": "emberformer"}, "sampler": "grid", "trials": 8,
           "search": {"batch_size": [4, 8, 16, 32, 64], "precision": ["fp32"], "checkpointing": ["none"]},
           "memory": {"budget": "100MiB", "headroom": 0.1}}
    spec = specs.build(raw, tmp_path / "spec.yaml", None, ())
    runner = Runner()
    sweep = sweep_for(spec, tmp_path, runner, total=5)
    ledger.enqueue_grid(sweep.study, spec)
    sweep.run()
    assert [c["batch_size"] for c in runner.runs[:5]] == [4, 8, 16, 32, 64]  # 64 ran although 32 hit the wall
    assert not [r for r in ledger.rows_of(sweep.study) if r["status"] == "skipped"]


def drifting(seen: dict):
    """Both batch-16 configs run fast once (20.8 and 16.0), then slower (9.0, 8.0); 8 bf16 runs 10.4 throughout.
    `seen` counts each (batch, precision)'s runs."""
    def table(config):
        rec = landscape({**config, "checkpointing": "none"})
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1 and config["batch_size"] == 16:
            rec["throughput"] = {"bf16-mixed": 9.0, "fp32": 8.0}[config["precision"]]
        return rec
    return table


def test_a_single_run_faster_than_the_confirmed_best_is_confirmed_too(tmp_path):
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    seen = {}
    sweep = sweep_for(spec, tmp_path, Runner(drifting(seen)), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    by_config = {(r["config"]["batch_size"], r["config"]["precision"]): r for r in rows}
    challenger = by_config[(8, "bf16-mixed")]
    assert seen[(8, "bf16-mixed")] == 3 and pareto.confirmed(challenger)  # its 10.4 beat the leaders' medians
    assert pareto.speed(by_config[(16, "bf16-mixed")]) == 9.0
    assert pareto.choose(rows, spec.memory_budget, spec.headroom).best.number == challenger["number"]


def test_a_single_run_within_the_confirmed_best_s_noise_is_not_raced(tmp_path):
    """On a host whose runs spread 8-10%, trial after trial ran a hair over the confirmed best's median and
    was raced beside your config (the quickstart made 20 confirmation runs, a minute more than the goal's
    code). A config is raced where its one run beats the best beyond the noise of either."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    seen, notes = {}, []

    def table(config):
        rec = landscape({**config, "checkpointing": "none"})
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        rec["throughput"] = {(16, "bf16-mixed"): [21.0, 19.0, 20.0][min(seen[key], 3) - 1], (16, "fp32"): 20.6,
                             (8, "bf16-mixed"): 10.4, (8, "fp32"): 8.0}[key]  # the leader: median 20.0, cv 5%
        return rec

    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.run()
    assert seen[(16, "bf16-mixed")] == 3 and seen[(16, "fp32")] == 1, seen  # 20.6 is 3% over 20.0: within 10%
    assert not [n for n in notes if "ran faster once" in n], notes
    rows = ledger.rows_of(sweep.study)
    best = pareto.choose(rows, spec.memory_budget, spec.headroom).best
    assert (best.config["batch_size"], best.config["precision"]) == (16, "bf16-mixed")
    # the same command again: it took the fastest single run as the leader to confirm, and its answer changed
    again = studies.Sweep(spec, sweep.study, "cpu", tmp_path, 4, None, Noted(notes), runner=Runner(table))
    again.run()
    assert seen[(16, "fp32")] == 1, seen
    best = pareto.choose(ledger.rows_of(sweep.study), spec.memory_budget, spec.headroom).best
    assert (best.config["batch_size"], best.config["precision"]) == (16, "bf16-mixed")


def test_confirmation_alternates_who_runs_first_and_races_a_challenger_beside_your_config(tmp_path):
    """Rounds ran A B A B, so the leader always ran first; and a challenger's rounds 0-1 were read side by
    side with your config's rounds 0-1, run minutes before beside the leader. Now A B B A, and the
    challenger runs rounds of its own with your config."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    runner = Runner(drifting({}))
    sweep = sweep_for(spec, tmp_path, runner, total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    number = {(r["config"]["batch_size"], r["config"]["precision"]): r["number"] for r in rows}
    leader, base, challenger = number[(16, "bf16-mixed")], number[(8, "fp32")], number[(8, "bf16-mixed")]
    confirmations = [(c["batch_size"], c["precision"]) for c in runner.runs[4:]]
    assert confirmations == [(16, "bf16-mixed"), (8, "fp32"), (8, "fp32"), (16, "bf16-mixed"),  # the leader's race
                             (16, "fp32"), (8, "fp32"), (8, "fp32"), (16, "fp32"),  # its 16.0 once beat 9.0
                             (8, "bf16-mixed"), (8, "fp32"), (8, "fp32"), (8, "bf16-mixed")]  # then its 10.4
    by_number = {r["number"]: r for r in rows}
    assert set(record.Record.of(by_number[number[(16, "fp32")]]).by_round()) == {2, 3}  # rounds of their own...
    assert set(record.Record.of(by_number[challenger]).by_round()) == {4, 5}
    assert set(record.Record.of(by_number[base]).by_round()) == {0, 1, 2, 3, 4, 5}  # ...your config ran in too
    assert set(record.Record.of(by_number[leader]).by_round()) == {0, 1}
    assert len(pareto.paired_runs(by_number[challenger], by_number[base])) == 2
    assert pareto.choose(rows, spec.memory_budget, spec.headroom).best.number == challenger



def test_a_confirmation_round_run_again_after_its_server_was_killed_counts_each_run_once(tmp_path):
    """The warm trial server killed during the leader's first confirmation run: the round ran again, and the
    runs were counted "#0 confirmation run 1 of 1", "#6 confirmation run 2 of 3"."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32"])
    repeats, notes = [], []

    def runner(config, number, repeat=False):
        if repeat:
            repeats.append(number)
            if len(repeats) == 1:
                return {"status": record.INTERRUPTED, "throughput": None, "peak_memory": None,
                        "error": {"type": "TrialServerDied", "message": "the warm trial server was killed"}}
        return {"status": "ok", "throughput": float(config["batch_size"]), "peak_memory": 20 * MiB,
                "timing": {"step_s": {"cv": 0.005}}}

    sweep = sweep_for(spec, tmp_path, runner, total=2, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.run()
    said = [n.split(":")[0].strip() for n in notes if "confirmation run" in n]
    assert sorted(said) == sorted(f"#{n} confirmation run {k} of 2" for n in set(repeats) for k in (1, 2)), said


def test_a_challenger_whose_run_beside_your_config_failed_is_not_raced_again_and_the_next_one_is(tmp_path):
    """Raced in rounds 2-3, a challenger whose run ran out of memory still had rounds 0-1 "to do": it was
    named again, nothing ran, and 8 bf16 (10.4 throughout) was never raced."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    seen, notes = {}, []

    def drifting(config):
        rec = landscape({**config, "checkpointing": "none"})
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        if seen[key] > 1 and key == (16, "fp32"):
            return {"status": "oom", "throughput": None, "peak_memory": None}
        if seen[key] > 1 and config["batch_size"] == 16:
            rec["throughput"] = 9.0
        return rec

    runner = Runner(drifting)
    sweep = sweep_for(spec, tmp_path, runner, total=4, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    number = {(r["config"]["batch_size"], r["config"]["precision"]): r["number"] for r in rows}
    assert sum(n.startswith(f"#{number[(16, 'fp32')]} ran faster once") for n in notes) == 1, notes
    runs = [n.split(":")[0].strip() for n in notes if "confirmation run" in n]  # counted among each config's own runs
    assert runs[4:8] == [f"#{number[(16, 'fp32')]} confirmation run 1 of 2", f"#{number[(8, 'fp32')]} confirmation run 3 of 4",
                         f"#{number[(8, 'fp32')]} confirmation run 4 of 4", f"#{number[(16, 'fp32')]} confirmation run 2 of 2"]
    assert seen[(8, "bf16-mixed")] == 3  # raced in its turn
    assert pareto.choose(rows, spec.memory_budget, spec.headroom).best.number == number[(8, "bf16-mixed")]

def test_the_race_confirms_what_the_choice_can_pick_not_a_compile_that_never_pays_back(tmp_path):
    """The quickstart on a CPU: compile ran 5% faster once but would take a million steps to pay for its
    compile, so the choice can never pick it. The race confirmed it anyway, left the fastest eager
    config on one run, and the answer fell back to the user's config."""
    spec = make_spec(tmp_path, trials=20, batch_size=[4, 8, 16], precision=["fp32"], checkpointing=["none"],
                     compile=["off", "default"])

    def table(config):
        rec = landscape(config)
        rec["timing"] = {"step_s": {"cv": 0.005, "median": config["batch_size"] / rec["throughput"]}}
        if config["compile"] != "off":
            rec["throughput"] *= 1.05
            rec["timing"] = {"step_s": {"cv": 0.005, "median": config["batch_size"] / rec["throughput"]},
                             "compile_s": 1e6}
        return rec

    runner = Runner(table)
    sweep = sweep_for(spec, tmp_path, runner, auto=True,
                      baseline={"batch_size": 4, "precision": "fp32", "checkpointing": "none", "compile": "off"})
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    eager16 = next(r for r in rows if r["config"] == {**r["config"], "batch_size": 16, "compile": "off"})
    assert pareto.confirmed(eager16)  # the fastest config the choice can pick was in the race
    assert not any(pareto.confirmed(r) for r in rows if r["config"]["compile"] != "off")
    assert pareto.choose(rows, spec.memory_budget, spec.headroom).best.number == eager16["number"]


def compile_sweep(tmp_path, gain):
    spec = make_spec(tmp_path, trials=20, batch_size=[4, 8, 16], precision=["fp32", "bf16-mixed"],
                     checkpointing=["none"], compile=["off", "default"])

    def table(config):
        rec = landscape(config)
        return {**rec, "throughput": rec["throughput"] * gain} if config["compile"] != "off" else rec

    runner = Runner(table)
    sweep = sweep_for(spec, tmp_path, runner, auto=True,
                      baseline={"batch_size": 4, "precision": "fp32", "checkpointing": "none", "compile": "off"})
    sweep.run()
    return {search.key({**c, "compile": "off"}) for c in runner.runs if c["compile"] != "off"}


def test_compile_that_lost_to_eager_on_the_best_config_is_not_tried_on_another(tmp_path):
    assert len(compile_sweep(tmp_path, 0.9)) == 1  # a minute of cold compile saved on a CPU


def measured_by_hand(folder, speeds: dict, cv=0.005, compile_s=60.0) -> studies.Sweep:
    """A sweep that measured `speeds` ({(batch, precision, compile): samples/s}) in that order; a compiled
    run took `compile_s` to compile (so its payback is known), and nothing runs out of memory."""
    batches = sorted({batch for batch, _, _ in speeds})
    spec = make_spec(folder, batch_size=batches, precision=["fp32", "bf16-mixed"], checkpointing=["none"],
                     compile=["off", "default"])

    def table(c):
        speed = speeds[(c["batch_size"], c["precision"], c["compile"])]
        return {**landscape({**c, "batch_size": 4}), "throughput": speed,
                "timing": {"step_s": {"cv": cv, "median": c["batch_size"] / speed},
                           **({"compile_s": compile_s} if c["compile"] != "off" else {})}}

    sweep = sweep_for(spec, folder, Runner(table))
    for batch, precision, mode in speeds:
        sweep.enqueue(spec.config({"batch_size": batch, "precision": precision, "checkpointing": "none",
                                   "compile": mode}))
        sweep.run_one()
    assert [r["status"] for r in ledger.rows_of(sweep.study)] == ["ok"] * len(speeds)
    return sweep


def test_compile_that_lost_to_eager_is_not_tried_on_a_better_eager_config_found_later(tmp_path):
    """The quickstart compiled batch 24 (57 s; 18% slower than eager); then two better eager configs turned
    up, pushing it out of the top two, and the best of them was compiled too: another minute for what
    had already lost. (Here: batch 8 fp32, then 16 fp32 and 16 bf16.)"""
    speeds = {(8, "fp32", "off"): 100.0, (8, "fp32", "default"): 80.0, (16, "fp32", "off"): 120.0,
              (16, "bf16-mixed", "off"): 125.0}
    sweep = measured_by_hand(tmp_path / "lost", speeds)
    assert sweep.queue_compile() is False and not sweep.queued()
    speeds[(8, "fp32", "default")] = 130.0  # where compiling beat eager, the better eager config is compiled too
    sweep = measured_by_hand(tmp_path / "won", speeds)
    assert sweep.queue_compile() is True and sweep.queued()


def test_compile_won_but_the_next_best_is_compiled_only_where_the_model_says_it_may_win(tmp_path):
    """The quickstart's figures: compiling batch 40 fp32 won (188.8 against 159.7 eager), and the sweep
    compiled the next-best eager config, batch 24 bf16 at 141.9, for 69 s; it ran 148.7. Compile's
    measured effect puts it far under the best, so it is not compiled; a next-best eager config within
    2% of the best is (compiled, it may win)."""
    eager = {(8, "fp32", "off"): 132.5, (24, "bf16-mixed", "off"): 141.9, (40, "fp32", "off"): 159.7}
    notes = []
    far = {**eager, (40, "fp32", "default"): 188.8}
    sweep = measured_by_hand(tmp_path / "far", far, cv=0.07)
    sweep.progress.note = notes.append
    assert sweep.queue_compile() is False and not sweep.queued()
    assert notes == ["compile beat eager on #2, but #1 (141.9 samples/s measured eager) compiled is predicted at "
                     "168.2, a 0.2% chance to beat the best (#3, 188.8 measured) by more than its noise: not compiled"]
    far[(8, "bf16-mixed", "off")] = 150.0
    sweep.enqueue(sweep.spec.config({"batch_size": 8, "precision": "bf16-mixed", "checkpointing": "none",
                                     "compile": "off"}))
    sweep.run_one()  # another eager trial: the decline stands, said once, however the fit moves
    assert sweep.queue_compile() is False and len(notes) == 1 and sweep.study.user_attrs["compile_closed"]
    eager[(24, "bf16-mixed", "off")] = 157.0
    # a compile that won but would take longer to pay back than your run is long: the next would pay it too
    sweep = measured_by_hand(tmp_path / "unpaid", {**eager, (40, "fp32", "default"): 188.8}, cv=0.07, compile_s=1e7)
    assert sweep.queue_compile() is False
    sweep = measured_by_hand(tmp_path / "near", {**eager, (40, "fp32", "default"): 188.8}, cv=0.07)
    assert sweep.queue_compile() is True
    assert [t.user_attrs["config"]["batch_size"] for t in sweep.study.get_trials(states=(TrialState.WAITING,))] == [24]


@pytest.mark.parametrize("big, scarce", [(24, True), (16, False)])
def test_a_lighter_config_tied_with_the_confirmed_leader_is_confirmed_where_memory_is_scarce(tmp_path, big, scarce):
    # batch 24 peaks at 82 MiB of the 100 MiB budget (under 25% free): a tie goes to the lighter batch 8;
    # batch 16 peaks at 58 MiB, so the tie goes to the faster and the lighter one is not run again
    spec = make_spec(tmp_path, batch_size=[8, big], precision=["fp32", "bf16-mixed"])
    speeds = {(8, "fp32"): 8.0, (big, "fp32"): 12.0, (8, "bf16-mixed"): 19.9, (big, "bf16-mixed"): 20.0}

    def table(config):
        rec = landscape({**config, "checkpointing": "none"})
        return {**rec, "throughput": speeds[(config["batch_size"], config["precision"])],
                "timing": {"step_s": {"cv": 0.03}}}

    runner = Runner(table)
    sweep = sweep_for(spec, tmp_path, runner, total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    runs = [(c["batch_size"], c["precision"]) for c in runner.runs]
    assert runs.count((8, "bf16-mixed")) == (3 if scarce else 1) and runs.count((big, "fp32")) == 1
    best = pareto.choose(ledger.rows_of(sweep.study), spec.memory_budget, spec.headroom).best
    assert (best.config["batch_size"], best.config["precision"]) == ((8 if scarce else big), "bf16-mixed")


def test_the_structured_search_leaves_the_compile_phase_its_trials_under_the_cap(tmp_path):
    spec = make_spec(tmp_path, trials=5, batch_size=[4, 8, 16, 32], precision=["fp32", "bf16-mixed"],
                     checkpointing=["none", "full"], compile=["off", "default"])
    runner = Runner()
    sweep = sweep_for(spec, tmp_path, runner, baseline={"batch_size": 8, "precision": "fp32", "checkpointing": "none",
                                                         "compile": "off"})
    sweep.run()
    distinct = list(dict.fromkeys(search.key(c) for c in runner.runs))  # confirmation repeats left out
    compiles = [dict(k)["compile"] for k in distinct][:4]
    assert compiles == ["'off'"] * 3 + ["'default'"]  # eager frontiers were still open; compile got its turn


def test_a_trial_is_told_the_cuts_under_the_best_so_far_but_never_a_confirmation_run(tmp_path):
    spec = make_spec(tmp_path)
    sweep = sweep_for(spec, tmp_path, Runner(), baseline={"batch_size": 8, "precision": "fp32", "checkpointing": "none"})
    config = spec.config({"batch_size": 4, "precision": "fp32", "checkpointing": "none"})
    assert "slow_below" not in sweep.job(config, 0)["measure"]  # nothing measured yet: no cut
    sweep.run_one()  # the baseline: 8.0 samples/s
    assert sweep.job(config, 1)["measure"]["slow_below"] == pytest.approx(studies.SLOW_CUT * 8.0)
    # the quickstart's far probe ran at 0.68 of the best: out of the race at 10% noise on either figure
    assert 0.68 * 8.0 < studies.SLOW_CUT * 8.0 < (1 - pareto.MAX_NOISE) / (1 + pareto.MAX_NOISE) * 8.0
    assert sweep.job(config, 1)["measure"]["warm_slow_below"] == pytest.approx(studies.WARM_SLOW_CUT * 8.0)
    # a long warm-up step is judged against a higher bar, the quickstart's far probes (0.45-0.48 of the best) under it
    long = sweep.job(config, 1)["measure"]
    assert long["long_warm_slow_below"] == pytest.approx(studies.LONG_WARM_SLOW_CUT * 8.0)
    assert 0.45 * 8.0 < long["long_warm_slow_below"] < studies.SLOW_CUT * 8.0 and long["warm_slow_below"] < 0.45 * 8.0
    assert long["long_warm_step_s"] == studies.LONG_WARM_STEP_S
    assert "slow_below" not in sweep.job(config, 1, repeat=True)["measure"]
    assert not {"warm_slow_below", "long_warm_slow_below"} & set(sweep.job(config, 1, repeat=True)["measure"])
    compiled = sweep.job({**config, "compile": "default"}, 1)["measure"]  # its second step may still compile
    assert "slow_below" in compiled and not {"warm_slow_below", "long_warm_slow_below"} & set(compiled)


@pytest.mark.parametrize("spec_path", sorted((ROOT / "benchmarks" / "landscapes").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_recorded_landscape_is_its_spec_s_whole_grid(spec_path):
    """A landscape the README reports on is every config of the spec next to it, once each, under a wall."""
    spec = specs.load(spec_path)
    doc = json.loads(spec_path.with_suffix(".json").read_text())
    rows = doc["rows"] if isinstance(doc, dict) else doc
    assert sorted(search.key(r["config"]) for r in rows) == sorted(search.key(c) for c in specs.all_configs(spec))
    assert spec.memory_budget and spec.sampler == "grid"


def test_a_worker_that_dies_mid_sweep_leaves_no_trial_running_for_the_one_that_goes_on(tmp_path):
    """Two local workers, one killed with -9 mid-trial: the survivor counted the dead worker's trial as
    running to the end of its sweep (recovery ran only when a sweep started), measured one trial fewer,
    and left the row `running` until the next sweep."""
    spec = make_spec(tmp_path, trials=4)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = {"host": socket.gethostname(), "pid": dead.pid, "started": 0.0}

    class Dying(Runner):
        def __call__(self, config, number, repeat=False):
            if len(self.runs) == 1:  # another worker claims a trial, then dies
                orphan = study.ask()
                orphan.set_user_attr("config", spec.config({"batch_size": 16, "precision": "fp32", "checkpointing": "none"}))
                orphan.set_user_attr("worker", gone)
            return super().__call__(config, number, repeat)

    sweep = sweep_for(spec, tmp_path, runner := Dying())
    study = sweep.study
    sweep.run()
    states = [t.state for t in study.get_trials(deepcopy=False)]
    assert TrialState.RUNNING not in states
    assert len({search.key(c) for c in runner.runs}) == 4  # the cap, not one short


def test_where_a_tie_keeps_your_config_a_config_faster_than_yours_is_confirmed(tmp_path):
    """A noisy confirmation run of the leader (7.0 against 12.0) made it tie with your config, which stayed;
    batch 16 fp32 measured 10.0 once, 1.4x yours, and was never confirmed or named. Its race is said against
    your config, which the report names best: "faster once than the confirmed best's median" meant the leader."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    seen, notes = {}, []

    def table(config):
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        runs = {(8, "fp32"): [7.0, 7.1, 6.9], (16, "bf16-mixed"): [12.0, 7.0, 12.0],
                (16, "fp32"): [10.0, 9.9, 10.1], (8, "bf16-mixed"): [6.0, 6.0, 6.0]}[key]
        return {"status": "ok", "throughput": runs[min(seen[key], 3) - 1], "peak_memory": 20 * MiB,
                "timing": {"step_s": {"cv": 0.005}}}

    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"},
                      notes=notes)
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    by_config = {(r["config"]["batch_size"], r["config"]["precision"]): r for r in rows}
    assert pareto.confirmed(by_config[(16, "fp32")]) and seen[(16, "fp32")] == 3
    number = {key: r["number"] for key, r in by_config.items()}
    assert f"#{number[(16, 'fp32')]} ran faster once than your config (#{number[(8, 'fp32')]}) beyond the noise (your " \
           f"config stays: the leader, #{number[(16, 'bf16-mixed')]}, ties with it): confirming it too, side by side " \
           "with your config" in notes, notes
    choice = pareto.choose(rows, spec.memory_budget, spec.headroom)
    assert choice.leader.number == by_config[(16, "bf16-mixed")]["number"]  # it ties with your config
    assert choice.best.number == by_config[(16, "fp32")]["number"]  # and this one surely beats yours


def wide_tie_table(base_runs: list[float]):
    """Your config (batch 8 fp32) at `base_runs` in turn; the leader (batch 16 bf16) a steady 13.0."""
    seen = {}

    def table(config):
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        runs = {(8, "fp32"): base_runs, (16, "bf16-mixed"): [13.0], (16, "fp32"): [5.0], (8, "bf16-mixed"): [4.0]}[key]
        return {"status": "ok", "throughput": runs[min(seen[key], len(runs)) - 1], "peak_memory": 20 * MiB,
                "timing": {"step_s": {"cv": 0.005}}}
    return table, seen


def choice_leader(sweep) -> int:
    return next(r["number"] for r in ledger.rows_of(sweep.study) if r["config"]["batch_size"] == 16
                and r["config"]["precision"] == "bf16-mixed")


def test_a_leader_that_ties_only_because_the_rounds_disagree_runs_two_more_rounds_with_your_config(tmp_path):
    """Your config's first confirmation run was disturbed (6.0 among 10s): the leader's 1.3x ties within
    1x ± 1.23 after two rounds and your config was kept. Two more rounds side by side settle it."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    table, seen = wide_tie_table([10.0, 6.0, 10.0, 10.0, 10.1])
    notes = []

    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.run()
    assert seen[(8, "fp32")] == 5 and seen[(16, "bf16-mixed")] == 5  # the trial and four rounds each
    assert any(n.startswith(f"#{choice_leader(sweep)} ties with your config only because their runs side by side "
                            "disagree: ") and "run 2 more times each" in n for n in notes), notes
    choice = sweep.choice()
    assert not choice.kept and choice.best.config["batch_size"] == 16 and choice.versus.paired == 4
    sweep.run()  # once per study: a resume runs no more rounds
    assert seen[(8, "fp32")] == 5


def test_your_config_leading_on_one_lucky_run_is_confirmed_and_then_raced(tmp_path):
    """Your config's single run (14.0) led a config at 13.0, so nothing was confirmed and the sweep kept
    your config on that one run (2 of 460 recorded replays stopped so). Now your config is confirmed as any
    leader is: its 10.0s put its median under 13.0, which is then raced beside it and wins. A real lead
    (15.0 every run) stays, with nothing raced."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    table, seen = wide_tie_table([14.0, 10.0, 10.0, 10.0, 10.0])
    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert seen[(8, "fp32")] == 5 and seen[(16, "bf16-mixed")] == 3  # yours: the trial, 2 alone, 2 beside it
    choice = sweep.choice()
    assert not choice.kept and choice.best.number == choice_leader(sweep)
    table, seen = wide_tie_table([15.0])
    sweep = sweep_for(spec, tmp_path / "real", Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert seen[(8, "fp32")] == 3 and seen[(16, "bf16-mixed")] == 1
    assert sweep.choice().best.number == sweep.choice().baseline.number


def test_a_tie_the_rounds_still_cannot_tell_says_sweep_again_on_a_quiet_machine(tmp_path):
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    # every other round disturbed, your config's runs on both sides of the leader's 13.0 (were they all
    # under it, the leader would be faster in every round: no tie, pareto.apart)
    table, seen = wide_tie_table([10.0, 6.0, 14.0, 6.0, 14.0])
    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    choice = sweep.choice()
    assert seen[(8, "fp32")] == 5 and choice.kept and choice.wide_tie
    assert report.next_step(choice).startswith(f"keep your config for now: the leader (#{choice.leader.number}) "
                                               "may be faster, but their runs side by side")
    under, seen = wide_tie_table([10.0, 6.0, 10.0, 6.0, 10.0])  # all under 13.0: the four rounds settle it
    sweep = sweep_for(spec, tmp_path / "under", Runner(under), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert seen[(8, "fp32")] == 5 and not sweep.choice().kept and sweep.choice().best.number == choice_leader(sweep)
    steady, seen = wide_tie_table([12.8, 12.6, 13.1])  # a real tie (1.01x) is no reason for more rounds
    sweep = sweep_for(spec, tmp_path, Runner(steady), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert seen[(8, "fp32")] == 3 and sweep.choice().kept and not sweep.choice().wide_tie
    assert report.next_step(sweep.choice()).startswith("keep your config: no config measured is chosen over it")
    # rounds either side of 1x by far (1.9x, 0.6x): untellable, no wide tie; it said "widen the search space"
    untold, seen = wide_tie_table([12.0, 7.0, 22.0, 7.0, 22.0])
    sweep = sweep_for(spec, tmp_path / "untold", Runner(untold), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    choice = sweep.choice()
    assert choice.kept and choice.versus.untellable and not choice.wide_tie, choice.versus
    assert report.next_step(choice).startswith(f"keep your config for now: its runs side by side with the leader "
                                               f"(#{choice.leader.number}) disagree too much to tell the two apart")


def test_a_confirmation_run_stopped_from_outside_runs_its_round_again_whole(tmp_path):
    """Your config's first confirmation run came back interrupted (its trial server killed): it alone was
    freed, so round 0 paired the leader's run made before it with your config's made after round 1."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    calls = {}

    def table(config):
        key = (config["batch_size"], config["precision"])
        calls[key] = calls.get(key, 0) + 1
        if key == (8, "fp32") and calls[key] == 2:
            return {"status": "interrupted", "throughput": None, "peak_memory": None,
                    "error": {"type": "ServerDied", "message": "its trial server was killed"}}
        speed = {(8, "fp32"): 4.0, (16, "bf16-mixed"): 11.9 + calls[key] / 10, (16, "fp32"): 5.0, (8, "bf16-mixed"): 3.0}[key]
        return {"status": "ok", "throughput": speed, "peak_memory": 20 * MiB, "timing": {"step_s": {"cv": 0.005}}}

    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert calls[(16, "bf16-mixed")] == 4 and calls[(8, "fp32")] == 4  # the trial, round 0, round 1, round 0 again
    leader = next(r for r in ledger.rows_of(sweep.study) if r["config"]["batch_size"] == 16
                  and r["config"]["precision"] == "bf16-mixed")
    by_round = record.Record.of(leader).by_round()
    assert by_round == {0: pytest.approx(12.3), 1: pytest.approx(12.2)}  # round 0 made with your config's, last


def first_seen_speeds(*speeds: float):
    """Each config's steady speed by the order the search first measured it: your config first."""
    order, calls = [], {}

    def table(config):
        key = search.key(config)
        if key not in order:
            order.append(key)
        calls[key] = calls.get(key, 0) + 1
        speed = speeds[order.index(key)] if order.index(key) < len(speeds) else 1.0
        return {"status": "ok", "throughput": speed, "peak_memory": 20 * MiB, "timing": {"step_s": {"cv": 0.005}}}
    return table, order, calls


def test_a_resume_whose_leader_changed_runs_your_config_again_beside_it(tmp_path):
    """helper-33: the resume's new leader ran its two rounds alone and they were paired with your config's
    rounds made in the first sweep, beside the old leader ("2.90× ... over 2 runs each side by side")."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    table, order, calls = first_seen_speeds(4.0, 8.0, 12.0)
    sweep = sweep_for(spec, tmp_path, Runner(table), total=2, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    assert calls[order[0]] == 3 and calls[order[1]] == 3  # the old leader and your config, rounds 0 and 1
    studies.Sweep(spec, sweep.study, "cpu", tmp_path, 3, None, runner=Runner(table)).run()
    assert calls[order[2]] == 3 and calls[order[0]] == 5  # your config runs again, beside the new leader
    rows = {search.key(r["config"]): r for r in ledger.rows_of(sweep.study)}
    assert set(record.Record.of(rows[order[2]]).by_round()) == {2, 3}
    assert sweep.choice().versus.paired == 2


def test_a_round_a_killed_sweep_left_half_made_runs_again_whole(tmp_path):
    """kill -9 after the leader's run of round 1: your config's run of it was claimed by a dead process,
    and the resume made it alone, paired with the leader's run from before the kill."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    table, order, calls = first_seen_speeds(4.0, 8.0)
    sweep = sweep_for(spec, tmp_path, Runner(table), total=2, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.confirm = lambda: None  # the first sweep measures, and its confirmation is written by hand below
    sweep.run()
    rows = {search.key(r["config"]): r for r in ledger.rows_of(sweep.study)}
    base, lead = rows[order[0]]["number"], rows[order[1]]["number"]
    done = lambda speed: {"state": "done", "run": {"status": "ok", "throughput": speed, "tokens_per_s": None,  # noqa: E731
                                                   "peak_memory": 20 * MiB, "busy": None}}
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for key, slot in {(lead, 0): done(8.0), (base, 0): done(4.0), (lead, 1): done(8.0),
                      (base, 1): {"state": "claimed", "at": 0.0, "worker": {
                          "host": socket.gethostname(), "pid": int(dead.stdout), "started": 0.0}}}.items():
        sweep.study.set_user_attr(ledger.confirm_key(*key), slot)
    studies.Sweep(spec, sweep.study, "cpu", tmp_path, 2, None, runner=Runner(table)).run()
    rows = {search.key(r["config"]): r for r in ledger.rows_of(sweep.study)}
    assert set(record.Record.of(rows[order[1]]).by_round()) == {0, 1, 2}
    assert set(record.Record.of(rows[order[0]]).by_round()) == {0, 2}  # round 1 pairs nothing; round 2 is whole
    assert calls[order[0]] == 2 and calls[order[1]] == 2


def test_a_challenger_whose_confirmation_run_failed_does_not_hold_up_the_race(tmp_path):
    """One of the leader's two confirmation runs crashed: it stayed unconfirmed and the fastest open row,
    so every challenger slot named it again and ran nothing, and your config (4.0) was chosen over a
    steady 11.0 that was never raced."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32", "bf16-mixed"])
    seen, notes = {}, []

    def table(config):
        key = (config["batch_size"], config["precision"])
        seen[key] = seen.get(key, 0) + 1
        if key == (16, "bf16-mixed") and seen[key] == 2:
            return {"status": "crash", "throughput": None, "peak_memory": None, "error": {"message": "segfault"}}
        speed = {(8, "fp32"): 4.0, (16, "bf16-mixed"): 12.0, (16, "fp32"): 11.0, (8, "bf16-mixed"): 10.0}[key]
        return {"status": "ok", "throughput": speed, "peak_memory": 20 * MiB, "timing": {"step_s": {"cv": 0.005}}}

    sweep = sweep_for(spec, tmp_path, Runner(table), total=4, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.run()
    rows = ledger.rows_of(sweep.study)
    by_config = {(r["config"]["batch_size"], r["config"]["precision"]): r for r in rows}
    flaky = by_config[(16, "bf16-mixed")]["number"]
    assert not any(n.startswith(f"#{flaky} ran faster once") for n in notes), notes  # it had its two runs
    assert seen[(16, "fp32")] == 3 and pareto.confirmed(by_config[(16, "fp32")])
    assert pareto.choose(rows, spec.memory_budget, spec.headroom).best.number == by_config[(16, "fp32")]["number"]


def test_a_leader_unseated_by_a_failed_confirmation_run_is_said_so(tmp_path):
    """--trials auto searched on saying "confirmation puts the leader at 4.0 (#0), not the 12.0 the search
    stopped against", though the confirmation measured 12.0: one run of the leader crashed."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32"])
    seen, notes = {}, []

    def table(config):
        seen[config["batch_size"]] = seen.get(config["batch_size"], 0) + 1
        if config["batch_size"] == 16 and seen[16] == 2:
            return {"status": "crash", "throughput": None, "peak_memory": None, "error": {"message": "killed by SIGKILL"}}
        speed = {8: 4.0, 16: 12.0}[config["batch_size"]]
        return {"status": "ok", "throughput": speed, "peak_memory": 20 * MiB, "timing": {"step_s": {"cv": 0.005}}}

    sweep = sweep_for(spec, tmp_path, Runner(table), total=2, auto=True, baseline={"batch_size": 8, "precision": "fp32"},
                      notes=notes)
    sweep.run()
    lead = next(r["number"] for r in ledger.rows_of(sweep.study) if r["config"]["batch_size"] == 16)
    said = [n for n in notes if n.startswith("confirmation puts the leader at")]
    assert said and f"as #{lead}'s confirmation run 1 ended crash" in said[0], notes


def test_no_confirmation_round_starts_after_the_sweep_s_time_limit_and_a_begun_one_finishes(tmp_path):
    """--timeout was checked only between trials: a resume after the limit ran the whole confirmation
    (up to 16 runs, each as long as a trial)."""
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32"])
    notes, repeats = [], []
    table = lambda config: {"status": "ok", "throughput": float(config["batch_size"]),  # noqa: E731
                            "peak_memory": 20 * MiB, "timing": {"step_s": {"cv": 0.005}}}

    def runner(config, number, repeat=False):
        if repeat:
            repeats.append(number)
            sweep.deadline = time.monotonic() - 1  # the limit passes during the round's first run
        return table(config)

    sweep = sweep_for(spec, tmp_path, runner, total=2, baseline={"batch_size": 8, "precision": "fp32"}, notes=notes)
    sweep.deadline = time.monotonic() + 3600
    sweep.run()
    assert len(repeats) == 2 and repeats[0] != repeats[1], repeats  # round 0 finished, round 1 not begun
    assert notes[-1] == studies.TIME_UP, notes
    attrs = sweep.study.user_attrs
    assert sum(isinstance(v, dict) and v.get("state") == "done" for k, v in attrs.items() if k.startswith("confirm:")) == 2
    assert not any(isinstance(v, dict) and v.get("state") == "claimed" for k, v in attrs.items() if k.startswith("confirm:"))


def test_trials_auto_searches_on_with_an_optuna_sampler_too(tmp_path):
    """With `sampler: random` the patience count was not reset: "searching on" was printed and no trial ran."""
    raw = {"study": "s", "workload": {"name": "emberformer"}, "trials": 16, "sampler": "random", "seed": 3,
           "search": {"batch_size": [4, 8, 16, 32], "precision": ["fp32", "bf16-mixed"], "checkpointing": ["none", "full"]},
           "memory": {"budget": "100MiB", "headroom": 0.1}}
    spec = specs.build(raw, tmp_path / "spec.yaml", None, ())
    trials, at_note = [], []

    def lucky_once(config, number, repeat=False):
        rec = landscape(config)
        if not repeat:
            trials.append(number)
            if len(trials) == 2 and rec["status"] == "ok":  # the first trial after your config's
                rec["throughput"] = 4000.0  # a wrong figure (a busy machine), which confirmation corrects
        return rec

    class Notes(studies.Progress):
        def note(self, message):
            if "searching on" in message:
                at_note.append(len(trials))

    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    ledger.enqueue_baseline(study, spec, spec.config({"batch_size": 8, "precision": "fp32", "checkpointing": "none"}))
    studies.Sweep(spec, study, "cpu", tmp_path, spec.trials, None, Notes(), auto=True, runner=lucky_once).run()
    assert at_note, "the lucky first run should have been the bar the search stopped against"
    assert len(trials) > at_note[0]  # the search went on


@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning",
                            "ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_database_worker_that_dies_between_its_claim_and_its_trial_is_found_by_the_heartbeat(tmp_path):
    """Optuna finds another host's dead worker only by a heartbeat gone stale, and skips a RUNNING trial
    that never beat: one claimed by a worker that died before its trial started stayed running for good."""
    import time

    from harness import storage
    spec = make_spec(tmp_path, trials=4)
    beats = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'db.sqlite'}", heartbeat_interval=1, grace_period=1,
                                       heartbeat_stale_trial_callback=storage.requeue_stale)
    study = ledger.create(spec, beats, "cpu")
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, spec.trials, None, runner=Runner())
    trial, config, _, _ = sweep.claim_next()
    trial.set_user_attr("worker", {"host": "a-host-that-died", "pid": 1, "started": 0.0})  # it dies here
    time.sleep(2.5)
    sweep.fail_stale_trials()
    assert study.trials[trial.number].state == TrialState.FAIL
    assert [t.user_attrs["config"] for t in study.get_trials(states=(TrialState.WAITING,))] == [config]


def test_confirmation_runs_are_read_by_round_and_a_hand_edited_key_is_none():
    """Every reader of confirm:NUMBER:ROUND parses it through ledger.confirm_slots; `confirm:x:1` (a hand
    edit the journal check lets through: it checks the value) made int() raise in the report."""
    done = lambda speed: {"state": "done", "run": {"status": "ok", "throughput": speed}}  # noqa: E731
    attrs = {"confirm:3:1": done(9.0), "confirm:3:0": done(8.0), "confirm:x:1": done(1.0), "confirm:3": done(2.0),
             "confirm:2:0": {"state": "claimed"}}
    runs = ledger.confirmation_runs(attrs)
    assert list(runs) == ["3"] and [(r["round"], r["throughput"]) for r in runs["3"]] == [(0, 8.0), (1, 9.0)]


def test_the_sweeps_choice_words_the_baseline_as_the_report_does(tmp_path):
    """A spec with no apply: section: the sweep's closing answer called its baseline "your config as swept"
    where `bench report` says "the baseline" (the spec's defaults)."""
    from harness.report import headline
    spec = make_spec(tmp_path, batch_size=[8, 16], precision=["fp32"])
    table, _ = wide_tie_table([20.0])  # your config (batch 8) at 20, the others slower: it stays best
    sweep = sweep_for(spec, tmp_path, Runner(table), total=2, baseline={"batch_size": 8, "precision": "fp32"})
    sweep.run()
    choice = sweep.choice()
    assert not choice.applies and choice.best.record.baseline
    assert headline(choice)[0].endswith("— the baseline"), headline(choice)
