"""What `bench sweep` shows while it runs: one line per trial (duplicates too), why a faster trial is
not best, the running trial's phase and elapsed time, lines that fit the terminal, whole --help."""
import io
import re
import warnings
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner
from rich.console import Console
from rich.spinner import Spinner

from harness import busy, cli, ledger, spec as specs, storage as stores, study as studies
from harness.cli import main
from harness.live import LiveProgress, RunningTrial
from tests.conftest import FAST_TRIAL, write_spec

GiB = 1024**3


class Recorder(studies.Progress):
    def __init__(self):
        self.events, self.phases = [], set()

    def trial_phase(self, heartbeat):
        if heartbeat:
            self.phases.add(heartbeat["phase"])

    def trial_finished(self, number, rec, best, note=None):
        self.events.append(("finished", number))

    def duplicate(self, number, of, config):
        self.events.append(("duplicate", number, of))


def test_a_duplicate_is_reported_and_the_child_phases_reach_the_display(project, faulty_path):
    # measuring lasts >= 3 steps of >= 0.3 s (a sleep: whatever the load, its windows cannot shrink under a
    # slow warm-up step), several of the parent's 0.2 s polls: the phase cannot slip between them
    trial = dict(FAST_TRIAL, window=0.5, min_windows=3, max_seconds=2)
    steady = {"factory": "faulty:build", "params": {"fault": "none", "steady_ms": 300}}
    spec = specs.load(write_spec(project, search={"batch_size": [4, 8]}, trial=trial, workload=steady))
    study = ledger.create(spec, stores.open_storage(None, project / "results", spec.study), "cpu")
    params = ledger.sampler_params(spec, {"batch_size": 4})  # batch size is ordinal: the sampler holds its index
    study.enqueue_trial(params)
    study.enqueue_trial(params)  # the same config again: reused, not run, but shown
    progress = Recorder()
    studies.Sweep(spec, study, "cpu", project / "results", 2, None, progress).run()
    assert progress.events == [("finished", 0), ("duplicate", 1, 0), ("finished", 2)]
    assert "measure" in progress.phases  # real heartbeats of the real child, seen while it ran


@pytest.fixture
def terminal(monkeypatch):
    """The CLI's console as a 60-column terminal, captured."""
    console = Console(file=io.StringIO(), force_terminal=True, width=60, color_system=None)
    monkeypatch.setattr(cli, "out", console)
    return console


def row(number, speed, peak_gib, cv=0.001, status="ok"):
    return {"number": number, "status": status, "throughput": speed, "peak_memory": int(peak_gib * GiB),
            "config": {"batch_size": 8}, "timing": {"step_s": {"cv": cv}, "trial_wall_s": 3.0}, "error": None}


def progress_for(project, **overrides):
    return LiveProgress(specs.load(write_spec(project, **overrides)), cli.out)


def test_a_faster_trial_that_lost_on_the_tie_rule_says_so(project, terminal):
    progress = progress_for(project)
    progress.text = "[2/3] #1 batch_size=8"
    progress.trial_finished(1, row(1, 103.0, 2.0, cv=0.02), row(0, 100.0, 1.0, cv=0.02))
    text = " ".join(terminal.file.getvalue().split())
    assert "best so far: #0 100.0 samples/s" in text
    assert "#1 is 2.9% faster, within the measured noise (±4.0%): a tie goes to the config with more headroom" in text


def test_a_leader_that_ties_with_your_config_says_why_your_config_is_best_so_far(project, terminal):
    progress = progress_for(project)
    progress.text = "[2/3] #1 batch_size=8"
    note = "trial 1 is 1.03× the samples/s (not confirmed side by side) — a tie: ...: your config stays"
    progress.trial_finished(1, row(1, 103.0, 2.0, cv=0.02), row(0, 100.0, 1.0, cv=0.02), note)
    text = " ".join(terminal.file.getvalue().split())
    assert "best so far: #0 100.0 samples/s" in text and note in text and "a tie goes to" not in text


def test_without_an_apply_section_the_sweep_offers_no_apply_and_calls_the_baseline_the_specs(project):
    spec = write_spec(project, search={"batch_size": [4]}, trials=1, apply=None)
    spec.write_text(spec.read_text().replace("apply: null\n", ""))
    result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, result.output
    assert "(baseline: the spec's defaults)" in text and "your current config" not in text
    assert "use the best config" not in text
    if "again when the machine is quiet" not in text:  # a busy machine's answer is none to apply: that line instead
        assert "an apply: section in the spec lets bench apply best" in text


def test_a_faster_trial_over_the_headroom_says_so(project, terminal):
    progress = progress_for(project, memory={"budget": "4GiB", "headroom": 0.1})
    progress.text = "[2/3] #1 batch_size=8"
    progress.trial_finished(1, row(1, 300.0, 3.9), row(0, 100.0, 1.0))
    text = " ".join(terminal.file.getvalue().split())
    assert "#1 is faster but its peak 3.90 GiB leaves less than the 10% headroom of 4.00 GiB" in text


def test_no_hint_when_the_trial_is_slower_or_best(project, terminal):
    progress = progress_for(project)
    progress.text = "x"
    progress.trial_finished(1, row(1, 90.0, 2.0), row(0, 100.0, 1.0))
    progress.trial_finished(0, row(0, 100.0, 1.0), row(0, 100.0, 1.0))
    assert "faster" not in terminal.file.getvalue()


def test_lines_fit_the_terminal_and_wrap_at_words(project, terminal):
    progress = progress_for(project)
    config = {f"knob_{i}": f"value_{i}" for i in range(12)}
    progress.trial_started(7, 6, 12, config, baseline=True)
    progress.trial_finished(7, {**row(7, 100.0, 1.0), "config": config}, row(7, 100.0, 1.0))
    progress.duplicate(8, 7, config)
    printed = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", terminal.file.getvalue())  # the spinner's cursor moves
    lines = [line for line in printed.splitlines() if line.strip()]
    assert max(map(len, lines)) <= 60
    words = set(printed.split())
    assert {f"knob_{i}=value_{i}" for i in range(12)} <= words  # wrapped between words, none cut
    assert "[dup] #8 repeats #7, not run again" in " ".join(printed.split())


@pytest.mark.parametrize("beat, compiles, phase", [
    (None, False, "starting"),
    ({"phase": "start", "step": 0}, False, "build"),
    ({"phase": "first_step", "step": 0}, True, "compile (first step)"),
    ({"phase": "first_step", "step": 0}, False, "first step"),
    ({"phase": "warmup", "step": 2}, False, "warm-up step 2"),
    ({"phase": "measure", "step": 40}, True, "measure step 40"),
])
def test_the_spinner_shows_phase_and_elapsed_time_in_one_line(beat, compiles, phase):
    running = RunningTrial("trial 3/12 (#4): " + "batch_size=64 " * 10, compiles)
    running.heartbeat = beat
    console = Console(file=io.StringIO(), width=50, color_system=None)
    console.print(Spinner("dots", running))  # what `out.status(...)` draws on every refresh
    shown = console.file.getvalue().splitlines()
    assert len(shown) == 1 and len(shown[0]) <= 50
    assert shown[0][2:].startswith(f"0s {phase} · trial 3/12") and shown[0].endswith("…")


def test_help_shows_whole_command_descriptions():
    shown = CliRunner().invoke(main, ["--help"], terminal_width=80).output.split("Commands:")[1]
    assert "..." not in shown
    flat = " ".join(shown.split())
    for command in main.commands.values():
        assert " ".join(command.help.split("\n\n")[0].split()) in flat


def test_a_resume_past_a_smaller_cap_does_not_say_3_of_2(project):
    buf = io.StringIO()
    progress = LiveProgress(specs.load(write_spec(project)), Console(file=buf, width=200, force_terminal=False))
    progress.started(3, 2, "tiny")
    progress.started(2, 2, "tiny")
    progress.started(1, 5, "tiny", running=1)
    assert buf.getvalue().splitlines() == ["resuming: 3 trials already measured, more than the 2 asked for",
                                           "resuming: 2 of 2 trials already measured",
                                           "resuming: 1 of 5 trials already measured or running "
                                           "(1 running in another worker)"]


@pytest.mark.parametrize("speed, busy, said", [
    (lambda batch: 100.0 * batch, None, "next: bench report to see the measurements, bench apply best to use the best config"),
    (lambda batch: 200.0 - abs(batch - 8), None,
     "next: bench report to see the measurements; your config stays best, so bench apply best has nothing to change"),
    # "the answer is noise", and then the last line offered to apply it
    (lambda batch: 100.0 * batch, {"load1": 3.5, "cores": 2, "busy_cores": 1.9, "steal": 0.0, "gpu_processes": 0},
     "next: run the same bench sweep again when the machine is quiet: it measures again what a busy machine or "
     "noise spoiled; bench report shows which"),
])
def test_the_sweeps_last_line_offers_apply_only_where_it_would_change_your_config(project, monkeypatch, speed, busy, said):
    """Your config stayed best and the last line still said "bench apply best to use the best config"."""
    def steady(self, config, number, repeat=False):  # steady figures, whatever the machine's load
        return {"status": "ok", "throughput": speed(config["batch_size"]), "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.005}}, "busy": busy}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    spec = write_spec(project, search={"batch_size": [4, 8, 16]}, trials=3)  # your config: batch 8
    result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    last = " ".join(result.output.strip().splitlines()[-1].split())
    assert last == said, result.output


def test_a_noisy_trial_taken_out_of_the_search_is_not_measured_again(project, monkeypatch):
    """A value the last sweep took out of the search is never chosen: measuring its noisy trial again on
    a quiet machine spends a trial on nothing."""
    launched = []

    def steady_but_16(self, config, number, repeat=False):
        launched.append(config["batch_size"])
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.9 if config["batch_size"] == 16 else 0.005}}, "busy": None}
    monkeypatch.setattr(studies.Sweep, "launch", steady_but_16)
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: None)
    monkeypatch.setenv(busy.WAIT_ENV, "60")  # the tests' 0 never measures again
    for search in ([4, 8, 16], [4, 8]):
        result = CliRunner().invoke(main, ["sweep", str(write_spec(project, search={"batch_size": search}, trials=3)),
                                           "--device", "cpu"])
        assert result.exit_code == 0, result.output
    assert launched.count(16) == 1, launched
    assert "measuring again" not in result.output, result.output


def test_once_applied_the_sweeps_last_line_says_there_is_nothing_to_apply(project, monkeypatch):
    """After `bench apply best`, a rerun of the sweep still ended "bench apply best to use the best config",
    which then said it had nothing to change."""
    def steady(self, config, number, repeat=False):
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.005}}, "busy": None}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    spec = write_spec(project, search={"batch_size": [4, 8, 16]}, trials=3)

    def last_line():
        result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.strip().splitlines()[-1].split())

    assert last_line() == "next: bench report to see the measurements, bench apply best to use the best config"
    applied = CliRunner().invoke(main, ["apply", "best"])
    assert applied.exit_code == 0, applied.output
    assert last_line() == ("next: bench report to see the measurements; config.yaml holds the best config already, "
                           "so bench apply best has nothing to change")
    assert "nothing to change" in CliRunner().invoke(main, ["apply", "best"]).output


def test_a_trial_that_stayed_noisy_is_not_met_with_run_again_forever(project, monkeypatch):
    """A rerun measures a noisy trial again once; when that stays noisy, the next rerun measures nothing, and
    the sweep's last line said "run the same bench sweep again when the machine is quiet" every time, while
    `bench report` said to give trials longer. Narrowed away from the search, a noisy trial decides nothing."""
    def steady_but_16(self, config, number, repeat=False):
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.9 if config["batch_size"] == 16 else 0.005}}, "busy": None}
    monkeypatch.setattr(studies.Sweep, "launch", steady_but_16)
    monkeypatch.setattr(busy, "now", lambda device, sample_s=busy.SAMPLE_S: None)
    monkeypatch.setenv(busy.WAIT_ENV, "60")  # the tests' 0 never measures again
    spec = write_spec(project, search={"batch_size": [4, 8, 16]}, trials=3)

    def last_line(path=spec):
        result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
        assert result.exit_code == 0, result.output
        return " ".join(result.output.strip().splitlines()[-1].split())

    assert last_line().startswith("next: run the same bench sweep again when the machine is quiet")
    assert last_line().startswith("next: trial #")  # #16's re-measurement stayed noisy
    for _ in range(2):
        said = last_line()
        assert "stayed noisy when measured again on a quiet machine: give trials longer (trial.max_seconds)" in said
    narrowed = write_spec(project, search={"batch_size": [4, 8]}, trials=3)
    assert last_line(narrowed).startswith("next: bench report to see the measurements; your config stays best")


@pytest.mark.parametrize("space", [
    {"batch_size": [16, 32], "precision": ["bf16-mixed", "fp16-mixed"]},  # your batch 8 and fp32 in neither list
    {"batch_size": {"low": 14, "high": 16}, "precision": "bf16-mixed"},  # below the range; a fixed value not yours
])
def test_your_config_outside_the_search_is_measured_and_never_searched(project, monkeypatch, space):
    """Your batch 8 and fp32 were added to the search: fp32 was searched in every family (a range 14..16
    became 8..16), so a sweep asked for bf16 could end on an fp32 config, and a resume searched the spec's
    own space, another one."""
    def steady(self, config, number, repeat=False):  # steady figures, whatever the machine's load
        return {"status": "ok", "throughput": 100.0 * config["batch_size"] * (2 if config["precision"] == "fp32" else 1),
                "peak_memory": 2**20 * config["batch_size"], "timing": {"step_s": {"cv": 0.005}}}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    spec = write_spec(project, search=space, trials=8, sampler="random")
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Fixed parameter")  # Optuna's "out of range" warning for your batch 8 under a range 14..16
        result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert ("note: your config's batch_size 8, precision fp32 are not in the spec's search: it is measured "
            "as your config, and no other config is searched with them") in said, said
    assert "not in the spec's search space" not in said  # a draw of your config's value is set aside without a word
    study = ledger.load(stores.existing_storage(None, project / "results", "tiny"), "tiny")
    ran = [t.user_attrs["config"] for t in study.get_trials(deepcopy=False) if "record" in t.user_attrs]
    assert (ran[0]["batch_size"], ran[0]["precision"]) == (8, "fp32")  # your config first
    searched = {(c["batch_size"], c["precision"]) for c in ran[1:]}
    assert searched and all(b >= 14 and p != "fp32" for b, p in searched), searched


def test_without_an_apply_section_the_baseline_outside_the_search_is_not_called_yours(project, monkeypatch):
    """No config file was read: the baseline is bench's defaults (fp32), and the note must not call it yours."""
    monkeypatch.setattr(studies.Sweep, "launch", lambda self, config, number, repeat=False: {
        "status": "ok", "throughput": 100.0, "peak_memory": 2**20, "timing": {"step_s": {"cv": 0.005}}})
    path = write_spec(project, search={"batch_size": [4, 8], "precision": ["bf16-mixed", "fp16-mixed"]}, trials=1)
    spec = yaml.safe_load(path.read_text())
    del spec["apply"]
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert ("note: the baseline's (bench's defaults: the spec has no apply: section) precision fp32 is not in the "
            "spec's search: it is measured as the baseline") in said and "your config's" not in said, said


def test_trials_auto_searches_a_space_far_above_your_batch(project, monkeypatch):
    """Your batch 8 beside batch sizes 160..256: the planner proposed nothing within 16x of the batches
    that ran, and `--trials auto` stopped after your config alone."""
    monkeypatch.setattr(studies.Sweep, "launch", lambda self, config, number, repeat=False: {
        "status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
        "timing": {"step_s": {"cv": 0.005}}})
    path = write_spec(project, search={"batch_size": {"low": 160, "high": 256}, "precision": ["fp32"]})
    spec = yaml.safe_load(path.read_text())
    del spec["trials"]  # --trials auto, the default
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    study = ledger.load(stores.existing_storage(None, project / "results", "tiny"), "tiny")
    ran = [t.user_attrs["config"]["batch_size"] for t in study.get_trials(deepcopy=False) if "record" in t.user_attrs]
    assert ran[0] == 8 and any(160 <= b <= 256 for b in ran[1:]), result.output


def test_a_resume_names_your_config_as_swept_outside_the_search_not_the_files_new_value(project, monkeypatch):
    """Your file said batch 12 by the resume, and the note named batch 12 while the study's baseline, as
    first swept, was batch 8 and no trial ever ran 12."""
    monkeypatch.setattr(studies.Sweep, "launch", lambda self, config, number, repeat=False: {
        "status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
        "timing": {"step_s": {"cv": 0.005}}})
    spec = write_spec(project, search={"batch_size": [16, 32], "precision": ["fp32"]}, trials=1)
    assert CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"]).exit_code == 0  # your config alone
    config = project / "examples" / "config.yaml"
    config.write_text(config.read_text().replace("batch_size: 8 ", "batch_size: 12 "))
    again = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu", "--trials", "2"])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert "note: your config's batch_size 8 is not in the spec's search" in said and "batch_size 12" not in said, said


def test_your_batch_that_does_not_divide_the_effective_batch_runs_as_it_is_and_no_other_config_takes_it(project, monkeypatch):
    """Your batch 8 under effective_batch 100 was added to the search: the sweep then ran batch 8 x
    accumulation 12 (an effective batch of 96) as a config like any other, and apply would write it."""
    def steady(self, config, number, repeat=False):  # steady figures, whatever the machine's load
        return {"status": "ok", "throughput": 100.0 * config["batch_size"] * (2 if config["precision"] == "fp32" else 1),
                "peak_memory": 2**20 * config["batch_size"], "timing": {"step_s": {"cv": 0.005}}}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    spec = write_spec(project, search={"batch_size": [4, 8, 20, 25, 50], "precision": ["fp32", "bf16-mixed"],
                                       "accumulation": {"effective_batch": 100}}, trials=10, sampler="random")
    result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert "your current config's batch_size 8 does not divide effective_batch 100" in " ".join(result.output.split())
    study = ledger.load(stores.existing_storage(None, project / "results", "tiny"), "tiny")
    ran = [t.user_attrs["config"] for t in study.get_trials(deepcopy=False) if "record" in t.user_attrs]
    assert ran[0]["batch_size"] == 8 and len(ran) == 9  # your config, then the 4 sizes that divide 100 x 2 precisions
    assert all(c["batch_size"] * c["accumulation"] == 100 for c in ran[1:]), ran


# A sweep whose trial waits for another bench trial on the device says so in a log or pipe too, once,
# under that trial's header (README, `bench sweep`: "the live line says 'waiting for another bench trial on
# cpu to end'"); before, only a terminal's spinner showed it and a piped sweep sat silent while it waited.
def test_a_piped_sweep_says_once_that_its_trial_waits_for_the_device():
    out = io.StringIO()
    live = LiveProgress(SimpleNamespace(objective="samples", apply=True), Console(file=out, width=200))
    live.trial_started(0, 0, 3, {"batch_size": 8, "precision": "fp32"}, baseline=True)
    for _ in range(3):
        live.trial_phase({"phase": "waiting for another bench trial on cpu to end"})
    live.trial_phase({"phase": "start"})
    live.stop()
    text = out.getvalue()
    assert text.count("waiting for another bench trial on cpu to end") == 1, text
    assert text.index("[1/3] #0") < text.index("waiting for another")
