"""The planner and its model (issue #22): the fit recovers known effects, the acquisition reaches for a
family never measured when the model says it can win, `--trials auto` stops on the model's rule,
`batch_size: {high: auto}` finds the memory wall and closes in on it, and no Optuna is needed.

Landscapes here follow the model's own form with known factors, so what the fit must recover is
known exactly; the `high: auto` test runs real trials under a real memory limit.
"""
from __future__ import annotations

import html
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from harness import ledger, model, pareto, planner, search, spec as specs, study as studies
from tests.conftest import write_spec

MiB = 2**20
ROOT = Path(__file__).resolve().parents[1]
KNOWN = {"bf16_t": 0.4, "ckpt_t": 1.3, "ckpt_a": 0.25, "overhead": 8.0, "per_sample": 1.0, "static": 200 * MiB,
         "activation": 4 * MiB}


def known(config: dict) -> tuple[float, float]:
    """Throughput and peak of a config, from the model's form with the KNOWN factors."""
    bf16, ckpt = config["precision"] == "bf16-mixed", config["checkpointing"] == "full"
    t = KNOWN["per_sample"] * (KNOWN["bf16_t"] if bf16 else 1) * (KNOWN["ckpt_t"] if ckpt else 1)
    speed = 1000 * config["batch_size"] / (KNOWN["overhead"] + t * config["batch_size"])  # times in ms
    peak = KNOWN["static"] + KNOWN["activation"] * (KNOWN["ckpt_a"] if ckpt else 1) * config["batch_size"]
    return speed, peak


def space(batches=(4, 8, 16, 32, 64, 128), precisions=("fp32", "bf16-mixed"), ckpts=("none", "full")) -> list[dict]:
    return [{"batch_size": b, "precision": p, "checkpointing": c, "compile": "off", "accumulation": 1}
            for b in batches for p in precisions for c in ckpts]


def row(number: int, config: dict) -> dict:
    speed, peak = known(config)
    return {"number": number, "status": "ok", "config": config, "throughput": speed, "peak_memory": peak,
            "timing": {"step_s": {"cv": 0.005}}}


def test_the_fit_recovers_the_known_effects_of_a_small_landscape():
    measured = [c for c in space() if c["batch_size"] in (4, 32, 128)]
    fitted = model.fit([row(i, c) for i, c in enumerate(measured)], space(), "cpu", "samples", None)
    effects = fitted.effects()
    assert effects[("precision", "bf16-mixed")]["t"] == pytest.approx(KNOWN["bf16_t"], rel=0.1)
    assert effects[("checkpointing", "full")]["t"] == pytest.approx(KNOWN["ckpt_t"], rel=0.1)
    assert effects[("checkpointing", "full")]["A"] == pytest.approx(KNOWN["ckpt_a"], rel=0.1)
    # and it predicts the configs it never saw within a few percent, with a small spread
    unseen = [c for c in space() if c["batch_size"] in (8, 64)]
    pred = fitted.predict(unseen)
    for i, config in enumerate(unseen):
        speed, peak = known(config)
        assert math.exp(pred["speed"][i]) == pytest.approx(speed, rel=0.05)
        assert math.exp(pred["peak"][i]) == pytest.approx(peak, rel=0.05)
        assert pred["speed_sd"][i] < 0.1


def test_the_acquisition_measures_a_family_never_measured_when_the_model_says_it_can_win():
    # Only fp32 is measured, up to its wall; bf16 (2.5x faster per sample on a GPU, by the prior) never.
    fp32 = [c for c in space(precisions=("fp32",), ckpts=("none",))]
    rows = [row(i, c) for i, c in enumerate(fp32)]
    plan = planner.Planner(space(), usable=2**40, limit=2**40, device="cuda")
    nxt = plan.next(rows)
    assert nxt["precision"] == "bf16-mixed" and nxt["checkpointing"] == "none"  # checkpointing cannot win: all fit
    # ...and where bf16 was measured 3x slower per sample at both ends of the batch range, it is not
    measured_slow = [{**r, "throughput": 1000 * r["config"]["batch_size"] / (8 + 3.0 * r["config"]["batch_size"])}
                     if r["config"]["precision"] == "bf16-mixed" else r
                     for r in [row(i, c) for i, c in enumerate(space(batches=(4, 128), ckpts=("none",)))]]
    assert planner.Planner(space(), usable=2**40, limit=2**40, device="cpu").next(measured_slow)["precision"] == "fp32"


def test_a_config_whose_memory_saver_is_not_needed_is_never_chosen():
    rows = [row(0, space()[0])]
    plan = planner.Planner(space(), usable=2**40, limit=2**40, device="cuda")
    picks = []
    for _ in range(6):
        picks.append(plan.next(rows + [row(i + 1, c) for i, c in enumerate(picks)]))
    assert all(p["checkpointing"] == "none" for p in picks)  # everything fits without it


def test_configs_the_planner_would_never_measure_do_not_keep_trials_auto_going():
    """Checkpointing where its twin without it fits cannot win, so it is never measured; its wide
    prediction once kept the stop rule from firing, and the search went on to near-hopeless configs."""
    sp = space(precisions=("fp32",))
    rows = [row(i, c) for i, c in enumerate(c for c in sp if c["checkpointing"] == "none")]
    plan = planner.Planner(sp, usable=2**40, limit=2**40, device="cuda")
    assert plan.open_configs(rows) and all(c["checkpointing"] == "full" for c in plan.open_configs(rows))
    assert plan.next(rows, stop=planner.STOP_CHANCE) is None
    assert plan.next(rows) is None  # nor is one of them measured for want of anything else


def test_on_a_cpu_a_trial_is_proposed_only_if_its_step_is_in_time_at_the_slow_end_of_its_prediction():
    """A CPU's trial time grows with its step: the quickstart lost a 180 s trial to a batch whose step
    was within the limit only at its predicted mean (its caches made it far slower)."""
    sp = space(batches=(4, 8, 16, 32, 64, 128, 256, 512))
    rows = [row(i, c) for i, c in enumerate(c for c in sp if c["precision"] == "fp32" and c["checkpointing"] == "none"
                                              and c["batch_size"] in (4, 8, 16))]
    limited = planner.Planner(sp, usable=None, limit=None, device="cpu", max_step_s=0.1)
    picked = limited.next(rows)
    passed_over = {**picked, "batch_size": 64}
    pred = limited.fit(rows).predict([picked, passed_over])
    step = {end: [c["batch_size"] / math.exp(pred["speed"][i] - end * min(pred["speed_sd"][i], planner.SLOW_SD_CAP))
                  for i, c in enumerate((picked, passed_over))] for end in (0, planner.SLOW_END)}
    assert picked["batch_size"] < 64 and step[planner.SLOW_END][0] <= 0.1
    assert step[0][1] <= 0.1 < step[planner.SLOW_END][1]  # in time at its mean, not at its slow end: passed over
    assert planner.Planner(sp, usable=None, limit=None, device="cpu").next(rows)["batch_size"] > 64  # no limit
    assert planner.Planner(sp, usable=None, limit=None, device="cpu", max_step_s=0.001).next(rows) is None  # none in time


def test_a_tokens_objective_keeps_the_step_time_limit_counted_in_seconds():
    """With tokens/s as the objective the limit was not checked at all: a CPU sweep of a language model
    could propose a batch whose step runs past the stall limit. A sample is 128 tokens here, so the
    limit must pass over exactly what it passes over for samples/s."""
    sp = space(batches=(4, 8, 16, 32, 64, 128, 256, 512))
    rows = [row(i, c) for i, c in enumerate(c for c in sp if c["precision"] == "fp32" and c["checkpointing"] == "none"
                                              and c["batch_size"] in (4, 8, 16))]
    tokens = [{**r, "tokens_per_s": 128 * r["throughput"]} for r in rows]

    def pick(objective, limit):
        plan = planner.Planner(sp, usable=None, limit=None, device="cpu", objective=objective, max_step_s=limit)
        return plan.next(tokens if objective == "tokens" else rows)

    assert pick("tokens", 0.1) == pick("samples", 0.1) and pick("tokens", 0.1)["batch_size"] < 64
    assert pick("tokens", None)["batch_size"] > 64  # no limit
    assert pick("tokens", 0.001) is None  # none in time


def test_accumulation_is_not_ruled_out_where_its_family_fits_without_it():
    """"Halve from the wall" is for a family where nothing fits yet. Where batch 64 fits without
    accumulation, batch 50 with it is the model's call (its held gradients), not a certain miss."""
    sp = [{**c, "accumulation": a} for c in space(batches=(8, 16, 32, 50, 64, 96), precisions=("fp32",), ckpts=("none",))
          for a in (1, 2)]
    one = [c for c in sp if c["accumulation"] == 1]
    rows = [row(i, c) for i, c in enumerate(c for c in one if c["batch_size"] <= 64)]
    rows.append({"number": len(rows), "status": "oom", "config": next(c for c in one if c["batch_size"] == 96),
                 "throughput": None, "peak_memory": None})
    plan = planner.Planner(sp, usable=468 * MiB, limit=520 * MiB, device="cuda")  # fits: 64 (456 MiB); 96 does not
    twice = [{**c, "accumulation": 2} for c in one if c["batch_size"] in (50, 96)]
    chance = plan.fit_chance(twice, rows, plan.fit(rows).predict(twice))
    assert chance[0] > 0.3  # 50 x 2: 400 MiB and the gradients held, under 468
    assert twice[1] not in plan.open_configs(rows)  # 96 x 2 holds more than 96 x 1, which ran out of memory


H200_QUICKSTART = [  # the first six trials of `bench sweep sweeps/emberformer.yaml` on an H200, 2026-11-24
    (8, 1, "fp32", "none", "off", 114.3, 1981808640), (128, 2, "bf16-mixed", "none", "default", 200.1, 10221518848),
    (160, 2, "fp16-mixed", "none", "off", 194.8, 12159287296), (96, 2, "tf32", "none", "off", 176.1, 11578376192),
    (128, 2, "bf16-mixed", "none", "off", 199.7, 9950986240), (352, 2, "bf16-mixed", "full", "default", 197.1, 12641632256)]
H200_GRADIENTS = 41_782_788  # bytes of gradients each of those trials counted (memory.breakdown)


def test_accumulated_trials_do_not_pass_their_activations_off_as_held_gradients():
    """Five of those six ran with accumulation 2 and one small batch without: a free 'gradients held
    across micro-batches' term took 8 GiB of their peaks, the activations per sample came out small,
    and the planner spent four compiled trials on batches 4096 to 1792, each out of memory. The
    gradient bytes each trial counts now pin that term."""
    sp = specs.all_configs(specs.load(ROOT / "sweeps" / "emberformer.yaml"))
    rows = [{"number": i, "status": "ok", "throughput": speed, "peak_memory": peak, "timing": {"step_s": {"cv": 0.02}},
             "memory": {"breakdown": {"gradients": H200_GRADIENTS}},
             "config": {"batch_size": b, "accumulation": a, "precision": p, "checkpointing": c, "compile": m}}
            for i, (b, a, p, c, m, speed, peak) in enumerate(H200_QUICKSTART)]
    plan = planner.Planner(list(sp), usable=0.9 * 24 * 2**30, limit=24 * 2**30, device="cuda")
    big = {"batch_size": 1024, "accumulation": 1, "precision": "bf16-mixed", "checkpointing": "full", "compile": "default"}
    # about 3x batch 352's measured 12.6 GB, as the H200 landscape says (batch 512 eager: 16.5 GB)
    assert math.exp(plan.fit(rows).predict([big])["peak"][0]) > 24 * 2**30
    assert plan.next(rows)["batch_size"] <= 512


def quickstart_on_a_cpu(throughput: float, cv: float) -> tuple[planner.Planner, dict]:
    """The quickstart's eager space on a CPU (tf32 is left out there; compile comes after) and its
    first trial, fp32 batch 8, as measured (the counted gradients and activations included)."""
    sp = [c for c in specs.all_configs(specs.load(ROOT / "sweeps" / "emberformer.yaml"))
          if c["precision"] != "tf32" and c["compile"] == "off"]
    first = {"number": 0, "status": "ok", "throughput": throughput, "peak_memory": 93_896_704,
             "timing": {"step_s": {"cv": cv}}, "memory": {"breakdown": {"gradients": 2_575_620,
                                                                       "activations": 24_450_240}},
             "config": {"batch_size": 8, "accumulation": 1, "precision": "fp32", "checkpointing": "none",
                        "compile": "off"}}
    return planner.Planner(sp, usable=0.9 * 24 * 2**30, limit=24 * 2**30, device="cpu", max_step_s=22.5), first


def test_on_a_cpu_without_bf16_instructions_bf16_is_not_the_first_guess():
    """The quickstart's first trial on an AVX2-only CPU (fp32 batch 8, 66.9 samples/s): with no word on
    the CPU the planner's next pick was bf16-mixed batch 128 x 2, which ran at 14.4 samples/s for 37 s
    (autocast converts in software there). The trial's env says whether the CPU has bf16 instructions."""
    plan, first = quickstart_on_a_cpu(66.9, 0.109)
    unknown = plan.next([first])
    assert unknown["precision"] == "bf16-mixed"  # nothing says bf16 is slow here: the model hopes it helps
    without = plan.next([{**first, "env": {"cpu_bf16": False}}])
    assert without["precision"] == "fp32"
    assert plan.next([{**first, "env": {"cpu_bf16": True}}]) == unknown


def test_on_a_cpu_the_bf16_speedup_its_trials_measured_decides_whether_bf16_is_tried_next():
    """Two CPUs with the same bf16 flags: on the Intel host of 2026-11-25 bf16-mixed ran 0.56-0.93x fp32
    in four landscapes (a layer measured 0.6-0.7x), on the EPYC of 2026-11-23 up to 1.28x. Each trial
    measures the layer on its CPU (env.cpu_bf16_speedup); after one fp32 trial, the planner tries bf16
    next only where it did not measure slower, and a fitted bf16 effect starts at the measured one where it is
    slower (a faster layer: the test below)."""
    plan, first = quickstart_on_a_cpu(171.3, 0.036)
    slow = [{**first, "env": {"cpu_bf16": True, "cpu_bf16_speedup": 0.6}}]
    fast = [{**first, "env": {"cpu_bf16": True, "cpu_bf16_speedup": 1.3}}]
    assert plan.next(slow)["precision"] == "fp32"
    assert plan.next(fast)["precision"] == "bf16-mixed"
    effect = plan.fit(slow).effects()[("precision", "bf16-mixed")]["t"]
    assert 1 / 0.6 * 0.9 < effect < 1 / 0.6 * 1.1  # nothing measured of bf16 yet: the layer's figure


def test_on_a_cpu_a_layer_that_runs_bf16_faster_does_not_promise_a_faster_step():
    """On the EPYC of 2026-11-26 and 2026-12-02 the layer ran bf16 1.37x and 2.21x faster than fp32, and
    the steps of the same emberformer space 0.90x and 0.99x (median over its batches): the prior took
    the layer's figure, 1.4 and 2.7 of its sds off. A slower layer still sets the prior (the test above); a
    faster one leaves it at no change, for the first bf16 trial to move."""
    plan, first = quickstart_on_a_cpu(171.3, 0.036)
    for layer in (1.37, 2.21):
        rows = [{**first, "env": {"cpu_bf16": True, "cpu_bf16_speedup": layer}}]
        effect = plan.fit(rows).effects()[("precision", "bf16-mixed")]["t"]
        assert 0.95 < effect < 1.05, (layer, effect)


def test_on_a_cpu_checkpointing_is_expected_to_cost_about_a_recomputed_forward_not_perhaps_nothing():
    """unet-cpu's first three trials (fp32 4, bf16-mixed 64, fp32 64): with checkpointing's cost as
    uncertain as any knob's (a factor of 2 either way) the planner went to fp32 256 with checkpointing
    next, which ran out of memory, before fp32 128 without it, the best. Recomputing the forward costs
    1.1-1.7x per sample in every CPU landscape; with that known, 128 comes first."""
    spec = specs.load(ROOT / "benchmarks" / "landscapes" / "unet-cpu.yaml")
    recorded = {search.key(r["config"]): r for r in json.loads((ROOT / "benchmarks" / "landscapes" / "unet-cpu.json").read_text())}
    seen = [recorded[search.key({"batch_size": b, "precision": p, "checkpointing": "none", "compile": "off", "accumulation": 1})]
            for b, p in ((4, "fp32"), (64, "bf16-mixed"), (64, "fp32"))]
    plan = planner.Planner(list(specs.all_configs(spec)), usable=0.9 * spec.memory_budget, limit=spec.memory_budget,
                           device="cpu")
    assert plan.next(seen) == {"batch_size": 128, "precision": "fp32", "checkpointing": "none", "compile": "off",
                               "accumulation": 1}
    cost = plan.fit(seen).effects()[("checkpointing", "full")]["t"]
    assert 1.1 < cost < 1.5  # nothing measured of checkpointing yet: the prior's recomputed forward


def test_from_one_trial_a_cpu_is_expected_to_peak_at_a_smaller_batch_than_a_gpu():
    """Every recorded CPU landscape is fastest between batch 8 and 64: a CPU's fixed cost per micro-step
    is small and its caches are, too. From the quickstart's first trial alone, the CPU prior's fastest
    fp32 batch is about a hundred and batch 1024 is slower than batch 64; a GPU's is past 256."""
    plan, first = quickstart_on_a_cpu(66.9, 0.1)
    sp = [c for c in plan.space if c["precision"] == "fp32" and c["checkpointing"] == "none" and c["accumulation"] == 1]
    fastest = {}
    for device in ("cpu", "cuda"):
        speed = dict(zip((c["batch_size"] for c in sp), model.fit([first], sp, device, "samples", None).predict(sp)["speed"]))
        fastest[device] = max(speed, key=speed.get)
        if device == "cpu":
            assert speed[1024] < speed[64]
    assert 48 <= fastest["cpu"] <= 160 and fastest["cuda"] >= 256


def test_on_a_cpu_no_trial_is_planned_that_would_take_its_whole_timeout(tmp_path):
    """The quickstart's third trial on the 2-core VM was batch 1024: 20.7 s steps for 178 s of its 180 s
    timeout (the first step, 2 warm-up steps, 3 windows, the memory breakdown and the fp32 reference),
    planned from its first two trials. The sweep's step limit now keeps a trial in half its timeout."""
    spec = specs.load(ROOT / "sweeps" / "emberformer.yaml")
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    plan = studies.Sweep(spec, study, "cpu", tmp_path, 12, None, auto=True, runner=None).planner()
    fp32 = {"precision": "fp32", "checkpointing": "none", "compile": "off"}
    rows = [{"number": i, "status": "ok", "throughput": speed, "peak_memory": peak, "timing": {"step_s": {"cv": cv}},
             "config": {"batch_size": b, "accumulation": a, **fp32}}
            for i, (b, a, speed, peak, cv) in enumerate([(8, 1, 63.7, 93_900_000, 0.071), (128, 2, 85.1, 536_900_000, 0.014)])]
    big = [{"batch_size": b, "accumulation": 1, **fp32} for b in (704, 1024)]  # measured: 11.3 s and 20.7 s steps
    assert not plan.in_time(big, rows, plan.score(big, rows, plan.fit(rows))).any()


def test_no_batch_at_or_over_one_larger_than_the_dataset_is_proposed_in_any_family():
    rows = [row(0, space()[0]), {"number": 1, "status": "error", "config": {**space()[0], "batch_size": 64},
                                 "error": {"type": "BatchOverDataset", "message": "batch_size 64 is more than..."}}]
    plan = planner.Planner(space(), usable=2**40, limit=2**40, device="cuda")
    assert {c["batch_size"] for c in plan.open_configs(rows)} == {4, 8, 16, 32}
    assert plan.next(rows)["batch_size"] < 64


def test_your_config_far_below_the_space_does_not_leave_the_space_out_of_reach():
    """Your batch 8 beside a space of 160..256: the largest proposed batch is TRUST x the largest run, so
    no config of the space was in reach and `--trials auto` stopped after your config alone."""
    configs = space(batches=(160, 192, 256))
    plan = planner.Planner(configs, usable=2**40, limit=2**40, device="cuda")
    yours = row(0, {**configs[0], "batch_size": 8})
    assert {c["batch_size"] for c in plan.open_configs([yours])} == {160}  # the nearest step, not a leap to 256
    assert plan.next([yours], stop=planner.STOP_CHANCE)["batch_size"] == 160


def test_past_a_batch_over_the_dataset_no_batch_over_the_dataset_size_is_proposed():
    """The quickstart's tiny preset has 512 samples: after batch 2048 failed so, the search proposed 1920,
    then would have stepped down a rung at a time, each trial failing the same way."""
    configs = [{**space()[0], "batch_size": b} for b in (128, 256, 512, 640, 1024, 1920, 2048)]
    over = {"number": 1, "status": "error", "config": configs[-1], "error": {
        "type": "BatchOverDataset", "message": "batch_size 2048 is more than the dataset's 512 samples",
        "dataset_samples": 512}}
    plan = planner.Planner(configs, usable=2**40, limit=2**40, device="cuda")
    assert {c["batch_size"] for c in plan.open_configs([row(0, configs[0]), over])} == {256, 512}
    at_512 = dict(over, number=2, config=configs[2])  # a loader that yields fewer: one rung below, as before
    assert {c["batch_size"] for c in plan.open_configs([row(0, configs[0]), over, at_512])} == {256}


def test_after_a_timeout_its_family_is_proposed_only_at_half_that_batch_or_less():
    """The quickstart on a loaded VM timed out at batch 1664, then 1536, then 1408 (one rung down each
    time): 9 of its 21 minutes."""
    configs = [{**c, "batch_size": b} for c in space(batches=(4,))[:1] for b in (64, 256, 512, 640, 768, 1024)]
    rows = [row(0, configs[0]), {"number": 1, "status": "timeout", "config": configs[-1], "throughput": None,
                                 "peak_memory": None, "error": {"type": "Timeout", "message": "exceeded 180s"}}]
    plan = planner.Planner(configs, usable=2**40, limit=2**40, device="cpu")
    assert {c["batch_size"] for c in plan.open_configs(rows)} == {256, 512}


def test_after_a_timeout_a_step_of_as_many_samples_through_accumulation_is_not_proposed():
    """Batch 64 timed out; 32 x 4 is 128 samples an optimizer step, twice the work of the step that ran
    out of time, and stayed open because only the batch was compared."""
    configs = [{**c, "batch_size": b, "accumulation": a} for c in space(batches=(4,))[:1]
               for b in (16, 32, 64) for a in (1, 2, 4)]
    timed_out = next(c for c in configs if c["batch_size"] == 64 and c["accumulation"] == 1)
    rows = [row(0, configs[0]), {"number": 1, "status": "timeout", "config": timed_out, "throughput": None,
                                 "peak_memory": None, "error": {"type": "Timeout", "message": "exceeded 180s"}}]
    plan = planner.Planner(configs, usable=2**40, limit=2**40, device="cpu")
    assert {(c["batch_size"], c["accumulation"]) for c in plan.open_configs(rows)} == {(16, 2), (32, 1)}


def test_trials_auto_with_nothing_run_to_the_end_says_so_not_that_nothing_beats_the_best(tmp_path):
    """Every trial timed out (a trial.timeout too short for the model): the sweep stopped with "no config
    left is predicted to beat the best", where there was no best."""
    raw = {"study": "t", "workload": {"name": "emberformer", "preset": "tiny"}, "trials": 6, "search": {"batch_size": [4, 8]}}
    spec = specs.build(raw, tmp_path / "s.yaml", None, ())
    notes = []

    class Notes(studies.Progress):
        def note(self, message):
            notes.append(message)

    def runner(config, number, repeat=False):
        return {"status": "timeout", "throughput": None, "peak_memory": None,
                "error": {"type": "Timeout", "message": "exceeded the trial time limit of 5s in its measured steps"}}

    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    ledger.enqueue_baseline(study, spec, spec.config({"batch_size": 4}))  # as `bench sweep` does: it rules out 8
    studies.Sweep(spec, study, "cpu", tmp_path, 6, None, Notes(), auto=True, runner=runner).run()
    assert not any("beat the best" in n for n in notes), notes
    assert any("no trial has given a throughput to rank" in n and "bench report" in n for n in notes), notes


def test_trials_auto_stops_on_the_models_rule(tmp_path):
    raw = {"study": "auto", "workload": {"name": "emberformer"}, "trials": 40,
           "search": {"batch_size": [4, 8, 16, 32, 64, 128], "precision": ["fp32", "bf16-mixed"],
                      "checkpointing": ["none", "full"]},
           "memory": {"budget": f"{int(400 / 0.9)}MiB", "headroom": 0.1}}
    spec = specs.build(raw, tmp_path / "s.yaml", None, ())
    notes, runs = [], []

    class Notes(studies.Progress):
        def note(self, message):
            notes.append(message)

    def runner(config, number, repeat=False):
        runs.append(config)
        speed, peak = known(config)
        if peak > spec.memory_budget:
            return {"status": "oom", "throughput": None, "peak_memory": None}
        return {"status": "ok", "throughput": speed, "peak_memory": peak, "timing": {"step_s": {"cv": 0.005}}}

    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 40, None, Notes(), auto=True, runner=runner)
    sweep.run()
    measured = [r for r in ledger.rows_of(study) if r["status"] in ("ok", "oom")]
    assert len(measured) < len(spec_space := list(specs.all_configs(spec))) // 2  # well before the cap
    assert any("predicted to beat the best" in n for n in notes)
    # the rule itself: no config left has a STOP_CHANCE chance to beat the best by more than its noise
    rows = ledger.rows_of(study)
    plan = sweep.planner()
    assert plan.next(rows, stop=planner.STOP_CHANCE) is None
    best = plan.best(rows)
    speed, _ = known(best["config"])
    top = max(known(c)[0] for c in spec_space if known(c)[1] <= 400 * MiB)
    assert speed >= 0.97 * top
    # the study keeps the model's why and predictions for the report, marked predicted
    kept = study.user_attrs["model"]
    assert kept["why"] and all("speed" in p and "fit_chance" in p for p in kept["predicted"])


def test_high_auto_is_a_ladder_of_powers_of_two_and_multiples_of_8(tmp_path):
    raw = {"study": "a", "workload": {"name": "emberformer"}, "search": {"batch_size": {"low": 4, "high": "auto"}}}
    ladder = specs.build(raw, tmp_path / "s.yaml", None, ()).search["batch_size"].choices
    assert ladder[:6] == (4, 8, 16, 24, 32, 40) and 65536 in ladder
    assert all(b % 8 == 0 for b in ladder if b >= 8) and 192 in ladder and 200 not in ladder
    with_effective = specs.build({**raw, "search": {"batch_size": {"low": 4, "high": "auto"},
                                                    "accumulation": {"effective_batch": 256}}}, tmp_path / "s.yaml", None, ())
    assert with_effective.search["batch_size"].choices == (4, 8, 16, 32, 64, 128, 256)  # divisors only


@pytest.mark.parametrize("low, effective, sizes", [
    (4, 100, (4, 5, 10, 20, 25, 50, 100)),  # the ladder kept only 4: 100 itself was never searched
    (4, 12, (4, 6, 12)),                    # only 4 too
    (20, 48, (24, 48)),                     # 24 is in the octave below the first power of two
])
def test_high_auto_under_an_effective_batch_searches_every_size_that_divides_it(tmp_path, low, effective, sizes):
    raw = {"study": "a", "workload": {"name": "emberformer"},
           "search": {"batch_size": {"low": low, "high": "auto"}, "accumulation": {"effective_batch": effective}}}
    spec = specs.build(raw, tmp_path / "s.yaml", None, ())
    assert spec.search["batch_size"].choices == sizes
    assert all(effective % (b * spec.config({"batch_size": b})["accumulation"]) == 0 for b in sizes)


def test_the_ladder_starts_in_the_octave_of_low():
    """low 20 went 20, 32, 40: the README's 24 was missing, and 40-56 after low 33."""
    assert specs.batch_ladder(20)[:3] == (20, 24, 32) and specs.batch_ladder(33)[:4] == (33, 40, 48, 56)
    assert specs.batch_ladder(100)[:3] == (100, 104, 112) and specs.batch_ladder(4)[:4] == (4, 8, 16, 24)


def test_the_planner_runs_without_optuna_or_torch():
    code = ("import sys; sys.modules['optuna'] = None; sys.modules['torch'] = None\n"
            "from harness import planner, model\n"
            "space = [{'batch_size': b, 'precision': p} for b in (4, 8, 16) for p in ('fp32', 'bf16-mixed')]\n"
            "rows = [{'number': 0, 'status': 'ok', 'config': space[0], 'throughput': 10.0, 'peak_memory': 2.0**20}]\n"
            "print(planner.Planner(space, 2.0**30, 2.0**30, 'cpu').next(rows))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "batch_size" in out.stdout


def test_a_real_sweep_with_high_auto_finds_the_wall_and_closes_in_on_it(project, faulty_path):
    """Real trials under a 64 MiB budget, of a workload whose throughput grows with the batch up to its
    wall (a steady 20 ms step, 256 KiB held per sample: the wall near batch 150). The list of old
    (4..64) could not reach it; `high: auto` runs into it and measures a batch between the powers of
    two around it. (Where larger batches stop being faster, the search rightly stops short of the
    wall: the tiny emberformer's CPU throughput peaks near batch 64 on some machines.)"""
    from click.testing import CliRunner

    from harness.cli import main
    spec = write_spec(project, name="wall", search={"batch_size": {"low": 4, "high": "auto"}}, trials=8,
                      workload={"factory": "faulty:build", "params": {"fault": "none", "steady_ms": 20,
                                                                      "ballast_kib": 256}},
                      memory={"budget": "64MiB", "headroom": 0.1})
    result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu", "--trials", "8"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    report = CliRunner().invoke(main, ["report", "wall", "--format", "json"], catch_exceptions=False)
    rows = json.loads(report.output)
    usable = 64 * MiB * 0.9
    fits = [r["config"]["batch_size"] for r in rows if r["status"] == "ok" and r["peak_memory"] <= usable]
    walls = [r["config"]["batch_size"] for r in rows if r["status"] in ("oom", "skipped")
             or (r["status"] == "ok" and r["peak_memory"] > usable)]
    seen = [(r["status"], r["config"]["batch_size"], r["peak_memory"]) for r in rows]
    assert walls, f"the search never reached the memory wall: {seen}"
    largest = max(fits)
    wall = min((w for w in walls if w > largest), default=None)
    assert wall is not None, f"fits {sorted(fits)}, walls {sorted(walls)}: {seen}"
    assert largest > 64  # beyond the old list's top
    refined = [b for b in fits + walls if b & (b - 1)]  # not a power of two
    # closer than the powers of two alone bracket it (on a busy machine the path there varies, the bracket not)
    assert refined and wall < 2 * largest, f"fits {sorted(fits)}, walls {sorted(walls)}: not refined at the wall"


def test_why_names_the_knob_that_buys_the_most_and_the_report_marks_predictions():
    from harness import pareto, report
    usable = KNOWN["static"] + KNOWN["activation"] * 40  # without checkpointing batch 32 fits, 64 does not
    measured = [c for c in space(precisions=("bf16-mixed",)) if known(c)[1] <= usable and c["batch_size"] >= 16]
    rows = [row(i, c) for i, c in enumerate(measured)]
    plan = planner.Planner(space(precisions=("bf16-mixed",)), usable=usable, limit=usable / 0.9, device="cuda")
    best = plan.best(rows)
    assert best["config"]["checkpointing"] == "full" and best["config"]["batch_size"] == 128
    why = plan.why(rows, best)
    assert why.startswith("checkpointing=full") and "lets batch 128 fit" in why and "over the best without it" in why
    kept = plan.summary(rows, best)
    info = {"memory_budget": usable / 0.9, "headroom": 0.1, "model": kept}
    choice = report.annotate(rows, info)
    assert choice.model["why"] == why
    best_row = next(r for r in json.loads(report.to_json(choice)) if r["best"])
    assert best_row["model"]["why"] == why  # on the best row of `--format json`
    lines = report.model_lines(choice)
    assert lines[0] == f"why best: {why}"
    assert all(p["config"] not in [r["config"] for r in rows] for p in kept["predicted"])  # never a measured config
    assert not kept["predicted"] or "PREDICTED" in lines[1]
    assert pareto.speed(best) > 0
    page = html.unescape(report.render_html(choice, info))
    assert f"why best: {why}" in page  # the page says it too, in the terminal's words


def test_why_does_not_call_a_batch_the_largest_that_fits_when_a_larger_one_fit_and_ran_slower():
    """A CPU quickstart chose batch 40 x 2 (203.4 samples/s) and said "batch 40 is the largest of its
    family that fits: +20% over batch 32", with batch 224 x 2 measured beside it, fitting, at 177.6."""
    fp32 = {"precision": "fp32", "checkpointing": "none", "compile": "off", "accumulation": 2}
    rows = [{"number": n, "status": "ok", "config": {"batch_size": b, **fp32}, "throughput": speed,
             "peak_memory": peak * 2**20, "timing": {"step_s": {"cv": 0.01}}}
            for n, b, speed, peak in [(2, 224, 177.6, 1190), (3, 32, 169.9, 240), (6, 40, 203.4, 290)]]
    plan = planner.Planner([r["config"] for r in rows], usable=0.9 * 24 * 2**30, limit=24 * 2**30, device="cpu")
    best = plan.best(rows)
    assert best["number"] == 6
    assert plan.why(rows, best) == ("batch 40 is the fastest of its family: +20% over batch 32 and +15% over "
                                    "batch 224, which also fits")
    over = [dict(rows[0], peak_memory=23 * 2**30), *rows[1:]]  # where batch 224 is over the memory
    assert plan.why(over, plan.best(over)) == "batch 40 is the largest of its family that fits: +20% over batch 32"
    unmeasured = rows[1:]
    assert plan.why(unmeasured, plan.best(unmeasured)) == "batch 40 is the largest of its family measured: +20% over batch 32"
    noisy = [dict(rows[0], timing={"step_s": {"cv": 0.6}}), *rows[1:]]  # ran and fit, windows disagreeing
    assert plan.why(noisy, plan.best(noisy)) == \
        "batch 40 is the largest of its family that ran steadily: +20% over batch 32"  # 224 was measured, not ranked
    tied = [dict(rows[0], throughput=205.0), *rows[1:]]  # chosen within the noise of a larger batch, on less memory
    plan = planner.Planner([r["config"] for r in rows], usable=1.26 * 2**30, limit=1.4 * 2**30, device="cpu")
    assert plan.best(tied)["number"] == 6
    assert plan.why(tied, plan.best(tied)) == ("batch 40: +20% over batch 32; batch 224 also fits and measured 1% "
                                               "faster, within the noise")


def test_why_does_not_give_best_a_loss_as_its_reason():
    """A CPU quickstart confirmed batch 48 x 2 at 207.2 samples/s (median of 3 runs) and chose it over batch
    40 x 2's single 211.8, then said why: "batch 48 is the largest of its family measured: -2% over batch 40"."""
    fp32 = {"precision": "fp32", "checkpointing": "none", "compile": "off", "accumulation": 2}
    runs = [{"status": "ok", "throughput": s, "round": k} for k, s in enumerate((202.2, 217.1))]
    rows = [{"number": n, "status": "ok", "config": {"batch_size": b, **fp32}, "throughput": speed,
             "peak_memory": peak * 2**20, "timing": {"step_s": {"cv": 0.013}}}
            for n, b, speed, peak in [(2, 40, 211.8, 270), (5, 48, 207.2, 320)]]
    rows[1]["repeats"] = runs
    plan = planner.Planner([r["config"] for r in rows], usable=0.9 * 24 * 2**30, limit=24 * 2**30, device="cpu")
    best = plan.best(rows)
    assert best["number"] == 5 and pareto.confirmed(best)
    assert plan.why(rows, best) is None  # the choice's own line says why: confirmed runs against one
    slower = [dict(rows[0], throughput=180.0), rows[1]]
    assert plan.why(slower, plan.best(slower)) == "batch 48 is the largest of its family measured: +15% over batch 40"


def test_a_batch_size_that_does_not_divide_the_effective_batch_is_left_out_with_a_note(tmp_path):
    raw = {"study": "a", "workload": {"name": "emberformer"},
           "search": {"batch_size": [4, 8, 12, 16], "accumulation": {"effective_batch": 32}}}
    spec, notes = specs.for_device(specs.build(raw, tmp_path / "s.yaml", None, ()), "cpu")
    assert spec.search["batch_size"].choices == (4, 8, 16)
    assert notes == ["search.batch_size: 12 left out: it does not divide effective_batch 32 (times each nproc)"]


def test_the_out_of_sample_eval_scores_final_answers_of_every_search(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "search_eval.py"), "--seeds", "0-1", "--trials", "8",
                          "--only", "bench,tpe,random,largest-fit", "--json"],
                         capture_output=True, text=True, timeout=1200, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(result) == {"bench", "tpe", "random", "largest-fit"}
    for name, figures in result.items():
        assert 0 <= figures["p10"] <= figures["median"] <= 1.0 + 1e-9 or name == "largest-fit"
        assert figures["runs_median"] >= 1
    assert result["bench"]["runs_median"] == result["tpe"]["runs_median"]  # equal runs, by construction


def test_the_bar_to_beat_is_the_report_s_leader_and_without_a_budget_the_wall_is_the_device(tmp_path):
    """The planner once judged improvement against the fastest measured row: one whose loss rose (the
    report marks it unsafe and never chooses it) raised the bar, so `--trials auto` could stop before
    finding what the report would choose; and with no memory budget nothing was over any wall, though
    the report caps best at the device's memory less the headroom."""
    sp = space(batches=(16, 32, 64))
    rising = {**row(0, sp[4]), "loss": {"first": 2.0, "last": 3.0}}
    steady = {**row(1, sp[0]), "loss": {"first": 2.0, "last": 1.9}}
    assert pareto.speed(rising) > pareto.speed(steady)
    plan = planner.Planner(sp, usable=2**40, limit=2**40, device="cuda")
    assert plan.best([rising, steady])["number"] == 1
    # a sweep with no budget: the trials measure the device's memory, and the planner walls there
    raw = {"study": "n", "workload": {"name": "emberformer", "preset": "tiny"},
           "search": {"batch_size": [16, 32, 64], "precision": ["fp32", "bf16-mixed"], "checkpointing": ["none", "full"]}}
    spec = specs.build(raw, tmp_path / "s.yaml", None, ())
    device_total = 1000 * MiB

    def runner(config, number, repeat=False):
        speed, peak = known(config)
        return {"status": "ok", "throughput": speed, "peak_memory": peak, "timing": {"step_s": {"cv": 0.005}},
                "memory": {"device_total": device_total}}

    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 2, None, auto=False, runner=runner)
    assert sweep.planner().limit is None  # nothing measured yet
    sweep.run()
    plan = sweep.planner()
    assert plan.limit == device_total and plan.usable == pytest.approx(0.9 * device_total)
    # a budget above what the device holds (the sweep warns): the device is the wall, as for the report
    above = specs.build({**raw, "memory": {"budget": "64GiB"}}, tmp_path / "s.yaml", None, ())
    study = ledger.create(above, optuna.storages.InMemoryStorage(), "cpu")
    sweep = studies.Sweep(above, study, "cpu", tmp_path, 2, None, auto=False, runner=runner)
    assert sweep.planner().limit == 64 * 2**30  # nothing measured: the budget is all there is
    sweep.run()
    assert sweep.planner().limit == device_total


def test_no_prediction_is_kept_from_trials_that_measured_no_speed():
    """Three errors and nothing else: the report printed "~0.7 samples/s ... beats best 100%" for configs
    never run, scaled from nothing."""
    configs = space()
    rows = [{"number": i, "status": "error", "config": c, "throughput": None, "peak_memory": None,
             "error": {"type": "RuntimeError", "message": "boom"}} for i, c in enumerate(configs[:3])]
    plan = planner.Planner(configs, usable=2 * 2**30, limit=2 * 2**30 / 0.9, device="cpu")
    assert plan.summary(rows, None)["predicted"] == []
    assert plan.summary([row(0, configs[0])], None)["predicted"]  # one speed measured: predictions again


def test_a_per_sample_effect_the_fit_extrapolates_past_4x_is_not_put_into_words():
    """"bf16-mixed saves 97% per sample: +70% over the best without it" contradicted itself."""
    words = planner.Planner.effect_words({"t": 0.03, "O": 1.0, "A": 1.0}, 32, False)
    assert "per sample" not in words
    assert planner.Planner.effect_words({"t": 1.3, "O": 1.0, "A": 0.3}, 64, True) == \
        "costs 30% per sample and lets batch 64 fit (activations x0.30)"


def test_why_does_not_say_a_knob_lets_a_batch_fit_where_memory_was_no_limit():
    """A user's MLP: fp32 at batch 256 peaked at 25 MiB of a 23.5 GiB budget, and why said
    "precision=bf16-mixed lets batch 64 fit (activations x0.61)"."""
    base = {"checkpointing": "none", "compile": "off", "accumulation": 1}
    rows = [{"number": n, "status": "ok", "config": {"batch_size": b, "precision": p, **base}, "throughput": speed,
             "peak_memory": peak * 2**20, "timing": {"step_s": {"cv": 0.01}}}
            for n, b, p, speed, peak in [(0, 16, "fp32", 100.0, 20.8), (1, 256, "fp32", 90.0, 40.0),
                                         (2, 64, "bf16-mixed", 200.0, 22.0), (3, 16, "bf16-mixed", 120.0, 20.5)]]
    plan = planner.Planner([r["config"] for r in rows], usable=0.9 * 23.5 * 2**30, limit=23.5 * 2**30, device="cpu")
    best = plan.best(rows)
    assert best["number"] == 2
    why = plan.why(rows, best)
    assert "lets batch" not in why, why
    gain, line = plan.knob_reason(("precision", "bf16-mixed"), best, rows, plan.candidates(rows), plan.fit(rows))
    assert line.startswith("precision=bf16-mixed saves") and "lets batch" not in line, line


def test_only_its_own_family_s_wall_says_a_knob_lets_a_batch_fit():
    """fp32 out of memory at batch 256 was taken as proof that bf16 at 128 needs checkpointing to fit,
    and why said "checkpointing ... lets batch 128 fit" where bf16 without it is predicted at 356 MiB of 900."""
    def cfg(b, p, c):
        return {"batch_size": b, "precision": p, "checkpointing": c, "compile": "off", "accumulation": 1}

    def ran(n, config, speed, peak_mib, status="ok"):
        return {"number": n, "status": status, "config": config, "throughput": speed,
                "peak_memory": peak_mib and peak_mib * MiB, "timing": {"step_s": {"cv": 0.01}}}
    rows = [ran(0, cfg(16, "fp32", "none"), 100, 164), ran(1, cfg(256, "fp32", "none"), None, None, "oom"),
            ran(2, cfg(16, "bf16-mixed", "none"), 200, 132), ran(3, cfg(64, "bf16-mixed", "none"), 260, 228),
            ran(4, cfg(128, "bf16-mixed", "full"), 300, 151)]
    plan = planner.Planner([cfg(b, p, c) for b in (16, 32, 64, 128, 256) for p in ("fp32", "bf16-mixed")
                            for c in ("none", "full")], usable=900 * MiB, limit=1000 * MiB, device="cuda")
    best, fitted = rows[4], plan.fit(rows)
    assert not plan.needed_to_fit(best["config"], "checkpointing", "none", rows, fitted)
    assert "lets batch" not in plan.why(rows, best), plan.why(rows, best)
    walled = rows + [ran(5, cfg(128, "bf16-mixed", "none"), None, None, "oom")]  # its own family's wall does
    assert plan.needed_to_fit(best["config"], "checkpointing", "none", walled, plan.fit(walled))


def test_why_claims_no_win_that_best_did_not_measure():
    """Best chosen from a tie on scarce memory (the lighter bf16 at 100 beside fp32 at 103) was said to
    be "the fastest config measured that fits" on a CPU and "saves 59% per sample: -3% over #0" on a GPU."""
    def cfg(b, p):
        return {"batch_size": b, "precision": p, "checkpointing": "none", "compile": "off", "accumulation": 1}
    rows = [{"number": n, "status": "ok", "config": cfg(4, p), "throughput": speed, "peak_memory": peak * MiB,
             "timing": {"step_s": {"cv": 0.03}}} for n, p, speed, peak in [(0, "fp32", 103, 800), (1, "bf16-mixed", 100, 790)]]
    for device in ("cpu", "cuda"):
        plan = planner.Planner([cfg(b, p) for b in (4, 8) for p in ("fp32", "bf16-mixed")], usable=900 * MiB,
                               limit=1000 * MiB, device=device)
        best = plan.best(rows)
        assert best["number"] == 1 and plan.why(rows, best) is None, plan.why(rows, best)
    alone = rows[1:]  # measured alone, it is the fastest
    assert plan.why(alone, plan.best(alone)) == "#1 is the fastest config measured that fits"


def test_why_does_not_call_best_the_fastest_where_a_faster_trial_was_ruled_out():
    """A compile measured at 177.2 samples/s that did not pay back, beside best at 172.9: best was said
    to be "the fastest config measured that fits"."""
    def cfg(c):
        return {"batch_size": 4, "precision": "fp32", "checkpointing": "none", "compile": c, "accumulation": 1}
    rows = [{"number": 0, "status": "ok", "config": cfg("off"), "throughput": 100.0, "peak_memory": 300 * MiB,
             "timing": {"step_s": {"cv": 0.03, "median": 0.04}, "first_step_s": 0.1}},
            {"number": 1, "status": "ok", "config": cfg("default"), "throughput": 102.0, "peak_memory": 300 * MiB,
             "timing": {"step_s": {"cv": 0.03, "median": 0.039}, "compile_s": 60.0}}]
    plan = planner.Planner([cfg(c) for c in ("off", "default")], usable=900 * MiB, limit=1000 * MiB, device="cpu")
    assert plan.best(rows)["number"] == 0
    assert plan.why(rows, plan.best(rows)) == ("#0 is the fastest config measured that fits and is not ruled out "
                                               "(the faster ones are, each with its reason)")
    assert plan.why(rows[:1], plan.best(rows[:1])) == "#0 is the fastest config measured that fits"


def test_why_survives_a_trial_from_before_a_knob_was_searched():
    """A resume whose spec added precision: the old baseline's config has no precision (a KeyError at
    the sweep's end, where the study keeps the model's words)."""
    rows = [{"number": n, "status": "ok", "config": config, "throughput": speed, "peak_memory": 300 * MiB,
             "timing": {"step_s": {"cv": 0.01}}}
            for n, config, speed in [(0, {"batch_size": 8}, 100.0), (1, {"batch_size": 8, "precision": "bf16-mixed"}, 200.0)]]
    plan = planner.Planner([{"batch_size": b, "precision": p} for b in (8, 16) for p in ("fp32", "bf16-mixed")],
                           usable=None, limit=None, device="cuda")
    assert plan.why(rows, plan.best(rows)) == "#1 is the fastest config measured that fits"


def test_a_batch_measured_over_the_memory_lets_a_saver_run_it_whatever_the_fit_says():
    """fp32 batch 64 ran at 461 MiB of 460 usable; the smooth fit put it at 459.5, a coin flip to fit, so
    checkpointing at 64, the only way to run that batch, was held to be a needless memory saver."""
    def cfg(b, c):
        return {"batch_size": b, "precision": "fp32", "checkpointing": c, "compile": "off", "accumulation": 1}
    rows = [{"number": n, "status": "ok", "config": cfg(b, "none"), "throughput": 1000 * b / (8 + b),
             "peak_memory": (461 if b == 64 else 200 + 4 * b) * MiB, "timing": {"step_s": {"cv": 0.01}}}
            for n, b in enumerate((4, 8, 16, 32, 64))]
    plan = planner.Planner([cfg(b, c) for b in (4, 8, 16, 32, 64, 128) for c in ("none", "full")],
                           usable=460 * MiB, limit=500 * MiB, device="cuda")
    fitted, twin = plan.fit(rows), cfg(64, "none")
    assert plan.fit_chance([twin], rows, fitted.predict([twin]))[0] == 0.0
    open_ = plan.open_configs(rows)
    needed = dict(zip((search.key(c) for c in open_), plan.saver_needed(open_, rows, fitted)))
    assert needed[search.key(cfg(64, "full"))]


def test_a_run_that_diverged_over_the_usable_memory_is_a_wall():
    rows = [{"number": 0, "status": "diverged", "config": {"batch_size": 64, "precision": "fp32"}, "throughput": 9.0,
             "peak_memory": 600 * MiB}]
    assert search.above_wall({"batch_size": 128, "precision": "fp32"}, rows, 500 * MiB)
    assert not search.above_wall({"batch_size": 128, "precision": "fp32"}, rows, 700 * MiB)


def test_a_knob_faster_at_the_same_batch_is_credited_against_that_batch_not_the_best_without_it():
    """The quickstart: "precision=bf16-mixed saves 4% per sample: +140% over the best without it (#0,
    batch_size=8 ...)" for a best at batch 128 x 2: the batch bought the +140%, not bf16."""
    base = {"checkpointing": "none", "compile": "off"}
    rows = [{"number": n, "status": "ok", "config": {"batch_size": b, "accumulation": a, "precision": p, **base},
             "throughput": speed, "peak_memory": peak * 2**20, "timing": {"step_s": {"cv": 0.01}}}
            for n, b, a, p, speed, peak in [(0, 8, 1, "fp32", 100.0, 60), (1, 32, 1, "fp32", 160.0, 90),
                                            (2, 32, 1, "bf16-mixed", 167.0, 85), (3, 128, 2, "bf16-mixed", 240.0, 200)]]
    space_ = [{"batch_size": b, "accumulation": a, "precision": p, **base}
              for b in (8, 16, 32, 64, 128) for a in (1, 2) for p in ("fp32", "bf16-mixed")]
    plan = planner.Planner(space_, usable=0.9 * 2**30, limit=2**30, device="cpu")
    best = plan.best(rows)
    why = plan.why(rows, best)
    saves = re.match(r"precision=bf16-mixed saves (\d+)% per sample \(fitted\): \+(\d+)% over the same with precision=fp32, "
                     r"predicted \d+\.\d samples/s$", why)  # in a unit, as every figure is
    assert best["number"] == 3 and saves and saves[1] == saves[2], why  # the gain is the knob's own, at batch 128 x 2
    measured = rows + [{**rows[1], "number": 4, "config": {**best["config"], "precision": "fp32"}, "throughput": 200.0}]
    assert plan.why(measured, plan.best(measured)).endswith(
        "+20% over #4, the same with precision=fp32"), plan.why(measured, plan.best(measured))


def test_a_knob_is_not_credited_with_a_batch_that_fit_without_it_nor_with_a_cost():
    """"precision=bf16-mixed lets batch 64 fit (activations x0.61)" where fp32 at 256 used 25 MiB of a
    23.5 GiB budget; and "bf16-mixed costs 149% per sample: +98% over the best without it", a cost
    credited with a gain the batch size made."""
    assert planner.Planner.effect_words({"t": 1.0, "O": 1.0, "A": 0.61}, 64, False) == "is faster as measured"
    assert planner.Planner.effect_words({"t": 2.49, "O": 1.0, "A": 0.61}, 64, False) is None
    assert planner.Planner.effect_words({"t": 0.7, "O": 1.0, "A": 0.61}, 64, False) == "saves 30% per sample"


def test_why_quotes_no_gain_the_side_by_side_runs_cannot_tell_and_says_a_tie_is_one():
    """An audit on a busy machine: "why best: ... +1279% over batch 8" where the report printed ?x for
    that pair (two rounds side by side at 1.5x and 26x tell nothing), and "+6% over batch 16" beside
    the report's 0.97x "a tie". Why gives the pair's figure only where the report can, with its tie."""
    fp32 = {"precision": "fp32", "checkpointing": "none", "compile": "off", "accumulation": 1}

    def confirmed(number, batch, own, rounds, baseline=False):
        return {"number": number, "status": "ok", "config": {"batch_size": batch, **fp32}, "throughput": own,
                "peak_memory": batch * 2**20, "timing": {"step_s": {"cv": 0.01}}, "baseline": baseline,
                "repeats": [{"status": "ok", "throughput": s, "round": k} for k, s in enumerate(rounds, 1)]}
    plan = planner.Planner([{"batch_size": b, **fp32} for b in (32, 64)], usable=0.9 * 2**30, limit=2**30,
                           device="cpu")
    wild = [confirmed(0, 32, 100.0, (100.0, 10.0), baseline=True), confirmed(1, 64, 150.0, (150.0, 260.0))]
    assert pareto.versus(wild[1], wild[0]).untellable
    assert plan.why(wild, wild[1]) is None
    # nor a figure one run made on a busy machine ("+2894% over batch 16": 12.1 samples/s, a 1.3 s step)
    busy = [confirmed(0, 32, 12.1, (), baseline=True) | {"busy": {"busy_cores": 1.9}}, confirmed(1, 64, 150.0, ())]
    assert pareto.versus(busy[1], busy[0]).paired == 0 and plan.why(busy, busy[1]) is None
    close = [confirmed(0, 32, 100.0, (100.0, 100.0), baseline=True), confirmed(1, 64, 103.0, (101.0, 105.0))]
    v = pareto.versus(close[1], close[0])
    assert v.tie and not v.untellable
    assert plan.why(close, close[1]) == (f"batch 64 is the largest of its family measured: {v.ratio - 1:+.0%} "
                                         "over batch 32 (within the noise)")


def test_why_gives_the_ratio_of_runs_made_side_by_side_as_the_report_does():
    """An audit's study said "why best: ... +48% over batch 32" (medians of runs made minutes apart) and,
    two lines below, 1.32x your config (the same two configs' confirmation rounds, run side by side):
    one pair, two figures. Where both were confirmed together, why uses the paired ratio."""
    fp32 = {"precision": "fp32", "checkpointing": "none", "compile": "off", "accumulation": 1}

    def confirmed(number, batch, own, rounds, baseline=False):
        return {"number": number, "status": "ok", "config": {"batch_size": batch, **fp32}, "throughput": own,
                "peak_memory": batch * 2**20, "timing": {"step_s": {"cv": 0.01}}, "baseline": baseline,
                "repeats": [{"status": "ok", "throughput": s, "round": k} for k, s in enumerate(rounds, 1)]}
    rows = [confirmed(0, 32, 100.0, (140.0, 90.0), baseline=True), confirmed(1, 64, 150.0, (150.0, 100.0))]
    plan = planner.Planner([r["config"] for r in rows], usable=0.9 * 2**30, limit=2**30, device="cpu")
    best = plan.best(rows)
    assert best["number"] == 1
    paired = pareto.versus(rows[1], rows[0])  # rounds 150/140 and 100/90: 1.09, not the medians' 1.50
    assert paired.tie  # as the report says: within the runs' own noise
    assert plan.why(rows, best) == (f"batch 64 is the largest of its family measured: {paired.ratio - 1:+.0%} "
                                    "over batch 32 (within the noise)")


# The planner on a busy machine: every run so far `noisy` (windows past 50% CV) still says how long a
# step takes, so the CPU's step-time limit keeps holding. With no steady run the limit was skipped
# altogether: the quickstart on a shared 2-core VM (three noisy runs, batch 160 x 2 at 44 samples/s)
# proposed batch 1280 x 2, a 58 s step, which ran into the 180 s trial timeout, and then its bf16 twin.
def noisy(r: dict) -> dict:
    return {**r, "timing": {"step_s": {"cv": 0.6}}}


def test_noisy_runs_still_bound_the_step_time_on_a_cpu():
    sp = space(batches=(4, 8, 16, 32, 64, 128, 256, 512))
    rows = [noisy(row(i, c)) for i, c in enumerate(c for c in sp if c["precision"] == "fp32"
                                                   and c["checkpointing"] == "none" and c["batch_size"] in (4, 8, 16))]
    limited = planner.Planner(sp, usable=None, limit=None, device="cpu", max_step_s=0.1)
    steady = [{**r, "timing": {"step_s": {"cv": 0.005}}} for r in rows]
    assert limited.next(steady)["batch_size"] < 64  # as with steady runs
    unlimited = planner.Planner(sp, usable=None, limit=None, device="cpu").next(rows)
    picked = limited.next(rows)
    assert picked["batch_size"] < unlimited["batch_size"]
    pred = limited.fit(rows).predict([picked])
    slow = math.exp(pred["speed"][0] - planner.SLOW_END * min(pred["speed_sd"][0], planner.SLOW_SD_CAP))
    assert picked["batch_size"] / slow <= 0.1  # its step is in time at the slow end of its prediction
    assert planner.Planner(sp, usable=None, limit=None, device="cpu", max_step_s=0.001).next(rows) is None
