"""Honest under load: a sweep looks before it starts and before each trial, waits for quiet up to a
bound it says out loud, never runs a trial twice into the same load, and says plainly when the
answer is noise. Load is staged through busy.now (it cannot be staged reliably on a shared machine)."""
import html
import io
import os
import re
import subprocess
import sys
import time

import optuna
import psutil
import pytest
from rich.console import Console

from harness import busy, ledger, live, report, spec as specs, study as studies, units
from tests.conftest import FAST_TRIAL, faulty_spec

BUSY = {"load1": 3.5, "cores": 2, "busy_cores": 1.9, "steal": 0.0, "gpu_processes": 0}
pytestmark = pytest.mark.usefixtures("faulty_path")


class Lines(studies.Progress):
    def __init__(self):
        self.lines = []

    def trial_started(self, number, done, total, config, baseline):
        self.lines.append(f"header #{number}")

    def trial_finished(self, number, rec, best, note=None):
        self.lines.append(f"finished #{number}")

    def note(self, message):
        self.lines.append(message)


def sweep(tmp_path, looks, wait_s, monkeypatch, fault="none", **overrides):
    monkeypatch.setattr(busy, "POLL_S", 0.01)
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: next(looks))
    monkeypatch.setenv(busy.WAIT_ENV, str(wait_s))
    spec = specs.load(faulty_spec(tmp_path, "load", [fault], **overrides))
    progress = Lines()
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    launched = []
    sw = studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=progress)
    real = sw.runner
    sw.runner = lambda config, number, repeat=False: launched.append(number) or real(config, number, repeat)
    sw.run()
    return ledger.rows_of(study), progress.lines, launched


def test_a_busy_machine_is_waited_for_then_measured_once(tmp_path, monkeypatch):
    looks = iter([None, BUSY, BUSY, None] + [None] * 20)  # quiet at the start, busy twice before trial 0
    rows, lines, launched = sweep(tmp_path, looks, 60, monkeypatch)
    assert launched == [0] and rows[0]["status"] == "ok"  # run once, not again into the same load
    text = "\n".join(lines)
    assert "machine busy before trial 0 (1.9 of 2 cores in use by others, load 3.5" in text
    assert "waiting up to 30s for quiet" in text and "quiet after" in text
    assert lines.index("header #0") < next(i for i, line in enumerate(lines) if "machine busy" in line)
    assert rows[0]["busy"] != BUSY  # the record keeps the verdict over its run, not the one it waited out


def test_a_machine_that_stays_busy_is_measured_in_bounded_time_and_called_noise(tmp_path, monkeypatch):
    looks = iter([BUSY] * 10_000)
    start = time.monotonic()
    rows, lines, launched = sweep(tmp_path, looks, 0.3, monkeypatch)  # the sweep may wait 0.3 s in all
    assert time.monotonic() - start < 120 and launched == [0]
    text = "\n".join(lines)
    assert "machine busy before the sweep starts" in text and "still busy after" in text
    assert ("no waiting left (the sweep's 0.3s of waiting for quiet are spent; BENCH_QUIET_WAIT=10m gives more): "
            "measuring anyway, its figures will be noise") in text  # it named a variable you never set
    assert rows[0]["busy"]["busy_cores"] == 1.9
    assert "1 run measured on a busy machine: the answer is noise" in lines[-1]
    choice = report.annotate(rows, {"name": "load"})
    assert any("the machine was busy during 1 of 1 trials: #0" in line for line in report.story(choice))
    assert "when the machine is quiet" in report.next_step(choice)


def test_runs_with_no_speed_are_not_called_noise(tmp_path, monkeypatch):
    """Every trial ran out of memory on a busy machine, and the sweep's last word was "3 runs measured on a
    busy machine: the answer is noise where their figures decide it": no figure of theirs decides anything."""
    rows, lines, launched = sweep(tmp_path, iter([BUSY] * 10_000), 0.3, monkeypatch, fault="oom",
                                  memory={"budget": "512MiB"})
    assert launched == [0] and rows[0]["status"] == "oom" and rows[0]["busy"]["busy_cores"] == 1.9
    assert not any("measured on a busy machine" in line for line in lines), lines


def test_the_live_output_prints_a_note_about_a_trial_under_its_header(tmp_path):
    buf = io.StringIO()
    progress = live.LiveProgress(specs.load(faulty_spec(tmp_path, "s", ["none"])),
                                 Console(file=buf, width=200, force_terminal=False))
    progress.trial_started(3, 0, 2, {"batch_size": 8}, baseline=False)
    progress.note("machine busy before trial 3 (...)")
    progress.trial_finished(3, {"status": "crash", "error": {"message": "boom"}}, None)
    text = buf.getvalue().splitlines()
    assert text[0].startswith("[1/2] #3 batch_size=8") and "machine busy before trial 3" in text[1]
    assert text[2].strip() == "→ crash: boom"


def spinning(detached: bool) -> int:
    """A process spinning a core: our child, or (detached) one the shell left to init, not ours."""
    loop = f"{sys.executable} -c 'while 1: pass'"
    if not detached:
        return subprocess.Popen(["sh", "-c", f"exec {loop}"]).pid
    return int(subprocess.run(["sh", "-c", f"{loop} >/dev/null 2>&1 & echo $!"], capture_output=True,
                              text=True, check=True).stdout)


def test_looking_at_the_machine_counts_the_cores_another_process_uses():
    """One core spun by a process that is not ours: `now` sees at least part of a core in use."""
    pid = spinning(detached=True)
    try:
        time.sleep(0.3)
        flag = busy.now("cpu", sample_s=0.5)
    finally:
        os.kill(pid, 9)
    cores = os.cpu_count() or 1
    assert flag is None or flag["busy_cores"] > busy.OTHERS_CORES
    assert flag is not None or cores > 8  # on a many-core box one spinning core may stay under the sum


def test_our_own_processes_are_not_others():
    """The warm trial server importing torch as a sweep starts is the sweep itself: every sweep said
    "machine busy before the sweep starts (1.0 of 2 cores in use by others)" and waited for itself.
    A child of ours spinning a core is counted as ours, and `now` takes our CPU time out of what it calls others'."""
    pid = spinning(detached=False)
    try:
        time.sleep(0.2)
        before = busy.own_cpu_s()
        time.sleep(0.5)
        after = busy.own_cpu_s()
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    assert os.getpid() in after and pid in after
    assert after[pid] - before[pid] > 0.1  # it ran; how much of 0.5 s depends on what else competes
    # over 1 s of 2 cores (2 CPU seconds): 1.5 s used, 0.5 s of it ours -> one core others'
    assert busy.others_cores(used_s=1.5, ours_s=0.5, span_s=2.0, cores=2) == 1.0
    assert busy.others_cores(used_s=1.0, ours_s=1.0, span_s=2.0, cores=2) == 0.0  # all of it ours: quiet
    assert busy.others_cores(used_s=0.2, ours_s=0.5, span_s=2.0, cores=2) == 0.0  # a child's CPU from before the look


def test_now_takes_what_it_counts_as_ours_out_of_others(monkeypatch):
    """The wiring: a core spun by another process is others' work, until `own_cpu_s` says the same CPU
    time was ours (staged: far more than the look lasted), and then none of it is."""
    pid = spinning(detached=True)
    looks = iter([{1: 0.0}, {1: 1000.0}])
    monkeypatch.setattr(busy, "own_cpu_s", lambda: next(looks))
    try:
        time.sleep(0.3)
        flag = busy.now("cpu", sample_s=0.5)
    finally:
        os.kill(pid, 9)
    assert flag is None or flag["busy_cores"] == 0.0  # steal or a GPU may still flag it; cores in use may not


def spinning_on(core: int) -> int:
    """A process spinning on one core, left by the shell to init: not ours. Its pid."""
    loop = f"{sys.executable} -c 'import os; os.sched_setaffinity(0, {{{core}}})\nwhile 1: pass'"
    return int(subprocess.run(["sh", "-c", f"{loop} >/dev/null 2>&1 & echo $!"], capture_output=True,
                              text=True, check=True).stdout)


def looked_while(phase: str, times: int = 6) -> busy.OthersWhileMeasuring:
    others = busy.OthersWhileMeasuring()
    for _ in range(times):
        others.beat({"phase": phase})
        time.sleep(0.12)
    return others


def test_while_a_trial_measures_another_process_on_its_cores_is_counted(monkeypatch):
    """A 2 s run slowed 50x by a process that started mid-trial was called quiet: the 1-minute load average
    lags. The parent's looks while the heartbeat says `measure` see a core another process spins; looks in
    any other phase count nothing."""
    monkeypatch.setattr(busy, "LOOK_EVERY_S", 0.1)
    here = busy.my_cores()[0]
    spinner = spinning_on(here)
    try:
        time.sleep(0.3)
        warming, measuring = looked_while("warmup"), looked_while("measure")
    finally:
        os.kill(spinner, 9)
    assert warming.cores() == 0.0 and warming.span_s == 0.0
    assert measuring.cores() > busy.OTHERS_CORES
    flag = busy.verdict(busy.snapshot(), busy.snapshot(), measuring.cores())
    assert flag is not None and flag["busy_cores"] == round(measuring.cores(), 2)
    assert busy.describe(flag).startswith(f"{flag['busy_cores']:.1f} of {units.count(len(busy.my_cores()), 'core')} "
                                          "in use by others")


def test_a_pinned_sweeps_load_is_said_to_be_the_whole_machines(monkeypatch):
    """The load average is the machine's: a sweep pinned to one of two cores read "load 0.6 on 1 cores"."""
    monkeypatch.setattr(busy, "my_cores", lambda: [1])
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    flag = busy.verdict(busy.snapshot(), busy.snapshot(), others_cores=0.8)
    assert (flag["cores"], flag["machine_cores"]) == (1, 2)
    said = busy.describe({**flag, "load1": 0.6, "steal": 0.0})
    assert said.startswith("0.8 of 1 core in use by others, load 0.6 on the machine's 2 cores,")
    old = {"load1": 3.5, "cores": 2, "steal": 0.0}  # a record from before machine_cores
    assert busy.describe(old).startswith("load 3.5 on 2 cores,")


def test_load_on_a_core_the_sweep_may_not_use_is_not_others(monkeypatch):
    """A sweep pinned by taskset or a cgroup (each test worker too) is not slowed by a process spinning on
    a core it may not use: only the cores it may run on are looked at. Staged per-core times (a spinner
    on a shared machine cannot keep the other core quiet): core 1 busy, core 0 idle."""
    Times = type(psutil.cpu_times())
    zero = {field: 0.0 for field in Times._fields}
    looks = iter([[Times(**zero), Times(**zero)],
                  [Times(**{**zero, "idle": 1.0}), Times(**{**zero, "user": 1.0})]] * 2)
    monkeypatch.setattr(psutil, "cpu_times", lambda percpu=False: next(looks))
    monkeypatch.setattr(busy, "own_cpu_s", lambda: {})
    for mine, others in (([0], 0.0), ([1], 1.0)):
        monkeypatch.setattr(busy, "my_cores", lambda: mine)
        assert busy.between(busy.look(), busy.look())[:2] == (others, 1.0)


def test_a_run_slowed_by_another_process_while_it_measured_is_recorded_busy(tmp_path, monkeypatch):
    """The wiring: the machine is quiet before the trial (staged), two processes spin on its cores while it
    runs, and its record says busy, with the cores they took."""
    monkeypatch.setattr(busy, "LOOK_EVERY_S", 0.05)
    slow = {"factory": "faulty:build", "params": {"fault": "none", "at_step": 3, "steady_ms": 100}}
    spinners = [spinning_on(core) for core in busy.my_cores()[:1] * 2]
    try:
        rows, lines, launched = sweep(tmp_path, iter([None] * 50), 0, monkeypatch, workload=slow,
                                      trial={**FAST_TRIAL, "window": 0.3, "min_windows": 3, "max_windows": 3})
    finally:
        for spinner in spinners:
            os.kill(spinner, 9)
    assert launched == [0] and rows[0]["status"] == "ok"
    assert rows[0]["busy"] is not None and rows[0]["busy"]["busy_cores"] > busy.OTHERS_CORES, rows[0]["busy"]
    assert "1 run measured on a busy machine: the answer is noise" in lines[-1]


def swept_busy(tmp_path, monkeypatch):
    """A one-trial study swept while the machine was busy: (spec, study, its one row)."""
    monkeypatch.setattr(busy, "POLL_S", 0.01)
    # steady_ms: the re-measured trial is never `noisy`, which would make "when the machine is quiet" the
    # right advice after all; 20 ms was not enough beside a second worker's trials on 2 cores (a scheduler's
    # few ms of delay are a share of the step)
    steady = {"factory": "faulty:build", "params": {"fault": "none", "at_step": 3, "steady_ms": 100}}
    spec = specs.load(faulty_spec(tmp_path, "load", ["none"], workload=steady))
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    monkeypatch.setenv(busy.WAIT_ENV, "0")
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: BUSY)
    studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=Lines()).run()
    (first,) = ledger.rows_of(study)
    return spec, study, first


def test_run_again_on_a_quiet_machine_measures_again_what_a_busy_one_spoiled(tmp_path, monkeypatch):
    """The advice "run the same command again when the machine is quiet" once measured nothing: the
    resume found every trial measured. Now the busy trial runs again in a new one, which says why."""
    spec, study, first = swept_busy(tmp_path, monkeypatch)
    assert first["busy"]["busy_cores"] == 1.9
    run = {"status": "ok", "throughput": 1.0, "peak_memory": 1, "busy": None}
    study.set_user_attr(ledger.confirm_key(first["number"], 0), {"state": "done", "run": {**run, "busy": BUSY}})
    for round_ in (0, 1):  # a busy confirmation run, too, and two quiet runs: its round's partner and another
        study.set_user_attr(ledger.confirm_key(7, round_), {"state": "done", "run": run})

    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: None)  # quiet now
    monkeypatch.setattr(busy, "verdict", lambda before, after, others_cores=0.0: None)  # and during the trial, whatever this host's load
    monkeypatch.setenv(busy.WAIT_ENV, "0")
    studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=Lines()).run()  # 0: the machine as it is
    assert [r["number"] for r in ledger.rows_of(study)] == [first["number"]]
    monkeypatch.setenv(busy.WAIT_ENV, "120")
    progress = Lines()
    studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=progress).run()
    (again,) = ledger.rows_of(study)
    assert again["number"] != first["number"] and again["status"] == "ok" and not again["busy"]
    assert again["remeasured_after"]["busy_cores"] == 1.9
    assert "measuring again 1 trial a busy machine or noise spoiled (#0)" in "\n".join(progress.lines)
    assert study.user_attrs[ledger.confirm_key(first["number"], 0)] == {"state": "free", "kept": {**run, "busy": BUSY}}
    # its partner runs again with it, to be side by side again; the other round stays as measured
    assert [study.user_attrs[ledger.confirm_key(7, k)]["state"] for k in (0, 1)] == ["free", "done"]
    assert "1 confirmation run made on a busy machine run again, with the 1 run side by side with them" \
        in "\n".join(progress.lines)
    choice = report.annotate(ledger.rows_of(study), {"name": "load"})
    said = f"#1 re-measured #0 ({report.describe(again['config'])}): the machine was busy during its first run (1.9 of 2 cores"
    assert said in str(report.summary(choice, {}))
    assert said in html.unescape(report.render_html(choice, {"name": "load"}))  # the page said nothing of it
    assert "when the machine is quiet" not in report.next_step(choice), ledger.rows_of(study)

    progress = Lines()  # measured quiet: the next resume has nothing to measure again
    studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=progress).run()
    assert [r["number"] for r in ledger.rows_of(study)] == [again["number"]]
    assert not any("measuring again" in line for line in progress.lines)


def test_a_sweep_stopped_before_the_re_measurement_loses_nothing(tmp_path, monkeypatch):
    """The busy trial was set aside and its confirmation runs freed before anything ran again: Ctrl-C (or
    --timeout) right after the quiet machine's resume began dropped measured trials and changed the best."""
    spec, study, first = swept_busy(tmp_path, monkeypatch)
    run = {"status": "ok", "throughput": 1.0, "peak_memory": 1, "busy": BUSY}
    study.set_user_attr(ledger.confirm_key(first["number"], 0), {"state": "done", "run": run})

    def stopped(config, number, repeat=False):
        raise KeyboardInterrupt
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: None)  # quiet now
    monkeypatch.setenv(busy.WAIT_ENV, "120")
    with pytest.raises(KeyboardInterrupt):
        studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=Lines(), runner=stopped).run()
    (kept,) = [r for r in ledger.rows_of(study) if r["status"] != "interrupted"]  # the re-measurement shows, to run again
    assert kept["number"] == first["number"] and kept["throughput"] == first["throughput"]
    assert kept["repeats"] == [{**run, "round": 0}]
    assert ledger.why_not_shown(study, first["number"]) is None

    progress = Lines()  # the resume measures it again, once, and then the new trial stands in for it
    monkeypatch.setattr(busy, "verdict", lambda before, after, others_cores=0.0: None)
    studies.Sweep(spec, study, "cpu", tmp_path, 1, None, progress=progress).run()
    (again,) = [r for r in ledger.rows_of(study) if r["status"] != "interrupted"]
    assert again["number"] != first["number"] and not again["busy"]
    assert sum(t.user_attrs.get("remeasures") == first["number"] for t in study.trials
               if t.state == optuna.trial.TrialState.COMPLETE) == 1
    assert f"ran again as trial {again['number']}" in ledger.why_not_shown(study, first["number"])


def oom(number: int, busy_flag=None) -> dict:
    return {"number": number, "status": "oom", "config": {"batch_size": 8 << number}, "throughput": None,
            "peak_memory": None, "busy": busy_flag, "baseline": number == 0, "error": {"type": "OutOfMemory"}}


def test_the_next_step_of_a_study_that_ran_out_of_memory_on_a_busy_machine_is_the_memory_advice():
    """Load does not change what fits: the busy advice (run again when quiet) was given, which changes nothing."""
    choice = report.annotate([oom(0, BUSY), oom(1, BUSY)], {"name": "load"})
    assert report.next_step(choice).startswith("no config fits")


def test_a_best_whose_confirmation_runs_were_busy_is_not_acted_on():
    """The baseline's confirmation runs ran at 50 and 8 samples/s against 749 alone, and the answer was
    "keep your config": its figure was the busy runs'."""
    def ok(number, speed, runs):
        return {"number": number, "status": "ok", "config": {"batch_size": 8 << number}, "throughput": speed,
                "peak_memory": 1 << 30, "busy": None, "baseline": number == 0, "error": None,
                "timing": {"step_s": {"cv": 0.01, "median": 0.1}},
                "repeats": [{"status": "ok", "throughput": r, "peak_memory": 1 << 30, "busy": BUSY} for r in runs]}
    choice = report.annotate([ok(0, 749.2, [50.3, 8.0]), ok(1, 1205.7, [1188.7, 1153.1]), ok(2, 700.0, []),
                              ok(3, 690.0, [])], {"name": "load"})
    assert "when the machine is quiet" in report.next_step(choice)


def test_a_run_that_turned_busy_after_it_started_is_counted_in_the_sweeps_last_word(tmp_path, monkeypatch):
    """The live output marked 5 trials busy and the last line said "4 run(s) started on a busy machine":
    it counted only the runs the machine was busy before."""
    during = {"load1": 4.2, "cores": 2, "steal": 0.0, "gpu_processes": 0}
    monkeypatch.setattr(busy, "verdict", lambda before, after, others_cores=0.0: during)
    rows, lines, launched = sweep(tmp_path, iter([None] * 50), 60, monkeypatch)
    assert rows[0]["busy"] == during
    assert lines[-1].startswith("1 run measured on a busy machine: the answer is noise")


def test_the_next_step_while_a_sweep_runs_is_to_wait_for_it():
    """`bench report` beside a live sweep told the user to run `bench sweep` again when the machine is quiet."""
    running = {**oom(1), "status": "running", "error": None}
    choice = report.annotate([oom(0, BUSY), running], {"name": "load"})
    assert report.next_step(choice) == "a sweep is running (trial #1): `bench report` again when it ends"


def test_a_re_measurement_lost_with_its_worker_keeps_its_reason_when_queued_again():
    """A database study's dead worker is found by Optuna's heartbeat, whose callback queued the trial again
    with only its config: the report lost "re-measured #N", and a noisy trial could be re-measured twice."""
    from harness import storage
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.enqueue_trial({}, user_attrs={"config": {"batch_size": 8}, "remeasured_after": {"noisy_cv": 0.2}})
    lost = study.ask()
    storage.requeue_stale(study, study.trials[lost.number])
    again = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))[0]
    assert again.user_attrs["remeasured_after"] == {"noisy_cv": 0.2} and again.user_attrs["retry_of"] == lost.number


def test_the_wait_for_quiet_ends_at_the_sweeps_time_limit(monkeypatch):
    """`--timeout 5s` on a busy machine waited the full 60 s for quiet before the sweep, then said
    "measuring anyway" and measured nothing: the limit had passed."""
    monkeypatch.setattr(busy, "POLL_S", 0.01)
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: BUSY)
    said = []
    quiet = busy.Quiet("cpu", say=said.append, budget_s=120, deadline=time.monotonic() + 0.3)
    began = time.monotonic()
    assert quiet.wait("the sweep starts", longest=60) == BUSY
    assert time.monotonic() - began < 10 and re.search(r"waiting up to 0\.\ds for quiet \(the sweep's time limit\)", said[0])
    # the limit came while waiting: nothing is measured after it, so nothing says "measuring anyway"
    assert said[1].startswith("still busy after 0s") and said[1].endswith("the sweep's time limit is reached"), said[1]
    assert "no waiting left (the sweep's time limit)" in (quiet.wait("trial 0"), said[-1])[1]


def test_the_reports_worst_busy_figure_is_the_one_with_most_cores_taken():
    """"at worst" named the verdict with the highest load average, which counts bench's own child too:
    load 4.0 with 0.5 cores others', over load 3.0 with 1.9 cores others' (the one that slowed a trial)."""
    light = {"load1": 4.0, "cores": 2, "busy_cores": 0.5, "steal": 0.0, "gpu_processes": 0}
    def ok(number, flag):
        return {"number": number, "status": "ok", "config": {"batch_size": 8 << number}, "throughput": 100.0 + number,
                "peak_memory": 1 << 30, "busy": flag, "baseline": number == 0, "error": None,
                "timing": {"step_s": {"cv": 0.01, "median": 0.1}}}
    choice = report.annotate([ok(0, light), ok(1, BUSY), ok(2, None)], {"name": "load"})
    said = " ".join(" ".join(report.story(choice)).split())
    assert "at worst 1.9 of 2 cores in use by others" in said, said


def test_a_busy_trial_without_a_figure_is_not_said_to_have_a_low_one():
    """"busy during 2 of 3 trials: #0, #1; ...; their figures may be low" named #1, an error with no figure."""
    def row(number, status, flag):
        return {"number": number, "status": status, "config": {"batch_size": 8 << number}, "busy": flag,
                "throughput": 100.0 if status == "ok" else None, "peak_memory": 1 << 30 if status == "ok" else None,
                "baseline": number == 0, "error": None if status == "ok" else {"type": "ValueError", "message": "x"},
                "timing": {"step_s": {"cv": 0.01, "median": 0.1}}}
    said = " ".join(report.story(report.annotate([row(0, "ok", BUSY), row(1, "error", BUSY), row(2, "ok", None)],
                                                 {"name": "load"})))
    assert "the machine was busy during 2 of 3 trials: #0 (and 1 that measured no speed); at worst" in said, said
    said = " ".join(report.story(report.annotate([row(0, "error", BUSY), row(1, "error", None)], {"name": "load"})))
    assert "the machine was busy during 1 of 2 trials, none of which measured a speed" in said, said


@pytest.mark.parametrize("budget, said", [
    (0.0, "no waiting left (BENCH_QUIET_WAIT=0: no waiting)"),  # it said "the sweep's 0.0s ... are spent"
    (120.0, "no waiting left (the sweep's 120s of waiting for quiet are spent; BENCH_QUIET_WAIT=10m gives more)"),
    (900.0, "no waiting left (the sweep's 900s of waiting for quiet are spent; BENCH_QUIET_WAIT=30m gives more)"),
])
def test_no_waiting_left_says_what_would_give_more(monkeypatch, budget, said):
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: BUSY)
    told = []
    quiet = busy.Quiet("cpu", say=told.append, budget_s=budget)
    quiet.left = 0.0  # spent by earlier waits
    assert quiet.wait("trial 0") == BUSY
    assert said in told[-1], told
