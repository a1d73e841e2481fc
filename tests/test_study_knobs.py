"""Study-side knob correctness (issue #12): the objective's throughput everywhere, OOMs told
honestly, resumes that keep one study comparable."""

import json
import os
import re
import time

import optuna
import pytest
from click.testing import CliRunner

from harness import ledger, record, report, study as studies, spec as specs, storage as stores
from harness.cli import main
from harness.errors import UserError
from tests.conftest import FAST_TRIAL, faulty_spec

optuna.logging.set_verbosity(optuna.logging.WARNING)
GiB = 2**30
pytestmark = pytest.mark.usefixtures("faulty_path")  # the specs name the test-only faulty workload


def row(number, batch, samples, tokens):
    return {"number": number, "status": "ok", "config": {"batch_size": batch}, "throughput": samples,
            "samples_per_s": {"median": samples}, "tokens_per_s": {"median": tokens}, "peak_memory": GiB,
            "baseline": number == 0, "timing": {"step_s": {"cv": 0.01}}}


def test_objective_tokens_is_reported_in_tokens_per_second():
    """Best is chosen on tokens/s; it used to be printed and compared as samples/s."""
    rows = [row(0, 4, samples=100.0, tokens=1000.0), row(1, 8, samples=90.0, tokens=3000.0)]
    info = {"name": "s", "objective": "tokens", "memory_budget": 8 * GiB, "headroom": 0.1}
    choice = report.annotate(rows, info)
    assert choice.best.number == 1
    text = str(report.summary(choice, info))
    assert "3000.0 tokens/s" in text and "3.00× the tokens/s" in text and "samples/s" not in text


def spec_for(tmp_path, **overrides):
    return specs.load(faulty_spec(tmp_path, "s", ["none"], **overrides))


def test_an_oom_is_told_as_an_infeasible_penalty_not_a_measured_peak(tmp_path):
    spec = specs.load(faulty_spec(tmp_path, "s", ["none"], memory={"budget": "1GiB"}))
    study = optuna.create_study(directions=["maximize", "minimize"])
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 1, None)
    trial = study.ask()
    sweep.tell(trial, {"status": record.OOM, "config": {}, "throughput": None, "peak_memory": None})
    told = study.trials[0]
    assert told.state == optuna.trial.TrialState.COMPLETE and told.constraints["memory"] > 0
    assert told.values == [0.0, float(GiB)] and told.user_attrs["values_are_penalty"] is True
    assert told.user_attrs["record"]["peak_memory"] is None  # what reports show
    assert study.best_trials == []


def test_a_confirmation_run_is_told_in_the_objectives_unit(tmp_path):
    """A tokens/s study's trial lines read tokens/s and its confirmation lines samples/s: the report's
    median of the three could not be checked against what the sweep printed."""
    spec = spec_for(tmp_path, objective="tokens")
    study = optuna.create_study(directions=["maximize", "minimize"])
    notes = []

    class Notes(studies.Progress):
        def note(self, message):
            notes.append(message)
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 1, None, Notes())
    sweep.runner = lambda config, number, repeat=False: {"status": "ok", "throughput": 10.0, "peak_memory": GiB,
                                                         "tokens_per_s": {"median": 640.0}}
    sweep.confirm_runs([{"number": 0, "config": {"batch_size": 8}}], range(studies.CONFIRM_ROUNDS))
    assert notes and all(line.endswith("ok 640.0 tokens/s") for line in notes), notes


def test_a_resume_keeps_the_choices_the_study_was_sampled_with(tmp_path):
    """After `bench apply best` the old baseline value leaves the space; Optuna then raised
    "CategoricalDistribution does not support dynamic value space"."""
    spec = spec_for(tmp_path, search={"batch_size": [8, 16], "fault": ["none", "inf"]})
    first = ledger.including(spec, {"batch_size": 12})  # the user's old value, outside the list
    study = ledger.create(first, optuna.storages.InMemoryStorage(), "cpu")
    t = study.ask()
    ledger.suggest(t, first)
    study.tell(t, [1.0, 1.0])
    again = ledger.resumed(spec, study, "cpu")
    assert again.sampled["batch_size"] == (8, 16, 12)  # batch 16 keeps its position (index 2 of 8, 12, 16)
    assert again.search["batch_size"].choices == (8, 16)  # what is searched: the spec's list
    t = study.ask()
    ledger.suggest(t, again)  # raised before
    study.tell(t, [1.0, 1.0])


def test_a_resume_refuses_a_new_choice(tmp_path):
    first = spec_for(tmp_path, search={"batch_size": [8, 16]})
    study = ledger.create(first, optuna.storages.InMemoryStorage(), "cpu")
    t = study.ask()
    ledger.suggest(t, first)
    study.tell(t, [1.0, 1.0])
    with pytest.raises(UserError, match=r"search.batch_size now has 32.*--study NAME"):
        ledger.resumed(spec_for(tmp_path, search={"batch_size": [8, 16, 32]}), study, "cpu")


def test_a_resume_on_another_kind_of_device_is_refused(tmp_path):
    study = optuna.create_study(directions=["maximize", "minimize"])
    study.set_user_attr("device", "cuda:0")
    study.set_user_attr("memory_budget", None)
    with pytest.raises(UserError, match=r"ran on cuda:0, this run is on cpu.*--study NAME"):
        ledger.resumed(spec_for(tmp_path), study, "cpu")
    ledger.resumed(spec_for(tmp_path), study, "cuda:1")  # another GPU of the same study: a second worker


def test_a_resume_with_another_memory_budget_is_refused_in_one_line(tmp_path, faulty_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # tf32 is left out on a CPU with a note, which came before the refusal: two lines
    path = faulty_spec(tmp_path, "s", ["none"], trials=1,
                       search={"batch_size": [8], "fault": ["none"], "precision": ["fp32", "tf32"]})
    first = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--memory-budget", "2GiB"])
    assert first.exit_code == 0 and "tf32" in first.stderr, first.output  # the note, once the study is open
    again = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--memory-budget", "3GiB", "--trials", "2"])
    assert again.exit_code == 2, again.output
    said = [line for line in again.stderr.splitlines() if line.strip()]
    assert len(said) == 1 and said[0].startswith("error: study 's' measured under memory budget 2 GiB, this run "
                                                 "asks for 3 GiB"), again.stderr
    assert "--study NAME" in again.output and "Traceback" not in again.output


def test_a_resume_with_another_workload_or_objective_is_refused_and_writes_nothing(tmp_path, faulty_path, monkeypatch):
    """A resume once checked only the budget, the device and the choices: a spec whose model changed
    (another preset, other params) or whose objective changed ran on into the old study, and the
    report ranked unlike trials together. A refused resume also appended to the journal, and then still
    touched it, which made it the latest study `bench report` shows."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=1)
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"]).exit_code == 0
    journal = tmp_path / "results" / "s" / "journal.log"
    before = journal.read_bytes()
    an_hour_ago = time.time_ns() - 3600 * 10**9
    os.utime(journal, ns=(an_hour_ago, an_hour_ago))  # not even touched: the latest study is the one last written
    bigger = faulty_spec(tmp_path, "s", ["none"], trials=2,
                         workload={"factory": "faulty:build", "params": {"fault": "none", "at_step": 5}})
    again = CliRunner().invoke(main, ["sweep", str(bigger), "--device", "cpu"])
    assert again.exit_code == 2, again.output
    assert "study 's' measured another workload (workload.params: " in again.output
    assert "'at_step': 3" in again.output and "'at_step': 5" in again.output and "--study NAME" in again.output
    tokens = faulty_spec(tmp_path, "s", ["none"], trials=2, objective="tokens")
    again = CliRunner().invoke(main, ["sweep", str(tokens), "--device", "cpu"])
    assert again.exit_code == 2 and "study 's' optimizes samples/s, this run asks for tokens/s" in again.output
    assert journal.read_bytes() == before and journal.stat().st_mtime_ns == an_hour_ago
    same = faulty_spec(tmp_path, "s", ["none"], trials=2)
    assert CliRunner().invoke(main, ["sweep", str(same), "--device", "cpu"]).exit_code == 0  # the same spec resumes


def test_a_smoke_run_and_a_real_sweep_never_share_a_study(tmp_path, faulty_path, monkeypatch):
    """BENCH_QUICK's second-long measurements of one's own `factory` workload (which, unlike a built-in
    one, keeps its size in a smoke run) went into the real sweep's study, either way round, and were
    ranked with its measurements."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=2)
    monkeypatch.setenv("BENCH_QUICK", "1")
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"]).exit_code == 0
    journal = tmp_path / "results" / "s" / "journal.log"
    before = journal.read_bytes()
    monkeypatch.delenv("BENCH_QUICK")
    real = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert real.exit_code == 2 and "study 's' is a BENCH_QUICK smoke run" in real.output, real.output
    assert "--study NAME" in real.output and journal.read_bytes() == before
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--study", "real"]).exit_code == 0
    monkeypatch.setenv("BENCH_QUICK", "1")
    smoke = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--study", "real"])
    assert smoke.exit_code == 2 and "study 'real' holds real measurements, and BENCH_QUICK is set" in smoke.output
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"]).exit_code == 0  # a smoke run resumes its own
    # every view of the smoke study says so (they looked like real ones); the real study's say nothing
    for args in (["report", "s"], ["report", "s", "--format", "html", "--out", "s.html"]):
        shown = CliRunner().invoke(main, args)
        page = (tmp_path / "s.html").read_text() if "html" in args else ""
        assert shown.exit_code == 0 and "BENCH_QUICK smoke run" in shown.output + page, (args, shown.output)
    assert "BENCH_QUICK smoke run" not in CliRunner().invoke(main, ["report", "real"]).output


def test_a_resume_that_narrows_a_knob_to_one_value_measures_the_configs_left(tmp_path, faulty_path, monkeypatch):
    """The sweep counted every measured config against the narrower space: 2 measured at batch 8 made
    "all 2 configs of the search space are measured" true before either config at batch 16 ran."""
    monkeypatch.chdir(tmp_path)
    first = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=2,
                        search={"batch_size": [8, 16], "accumulation": [1, 2], "fault": ["none"]})
    assert CliRunner().invoke(main, ["sweep", str(first), "--device", "cpu"]).exit_code == 0
    narrowed = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=4,
                           search={"batch_size": [16], "accumulation": [1, 2], "fault": ["none"]})
    again = CliRunner().invoke(main, ["sweep", str(narrowed), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    study = ledger.load(stores.existing_storage(None, tmp_path / "results", "s"), "s")
    ran = {(r["config"]["batch_size"], r["config"]["accumulation"]) for r in ledger.rows_of(study) if r["status"] == "ok"}
    assert {(16, 1), (16, 2)} <= ran, again.output


def test_a_resume_that_drops_a_value_never_runs_it_though_the_study_queued_it(tmp_path, faulty_path, monkeypatch):
    """Optuna keeps a study's choices, so the resumed space kept batch 8 after the spec dropped it, and
    the grid's queued batch-8 trial ran first."""
    monkeypatch.chdir(tmp_path)
    first = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=1,
                        search={"batch_size": [8, 16, 32], "accumulation": [1, 2], "fault": ["none"]})
    assert CliRunner().invoke(main, ["sweep", str(first), "--device", "cpu"]).exit_code == 0  # the baseline, 8 x 1
    narrowed = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=6,
                           search={"batch_size": [16, 32], "accumulation": [1, 2], "fault": ["none"]})
    again = CliRunner().invoke(main, ["sweep", str(narrowed), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    assert "not run: batch_size 8 is no longer in the spec's search space" in " ".join(again.output.split())
    study = ledger.load(stores.existing_storage(None, tmp_path / "results", "s"), "s")
    assert sorted((r["config"]["batch_size"], r["config"]["accumulation"]) for r in ledger.rows_of(study)) == [
        (8, 1), (16, 1), (16, 2), (32, 1), (32, 2)], again.output  # your config, and the narrowed space
    table = CliRunner().invoke(main, ["report", "--format", "json"])
    assert sorted(r["config"]["batch_size"] for r in json.loads(table.output)) == [8, 16, 16, 32, 32]


def test_a_confirmation_run_keeps_its_own_log_and_leaves_the_trials(tmp_path, faulty_path, monkeypatch):
    """Confirmation runs wrote their output over their trial's log: trial 0's own output was gone."""
    import os
    (tmp_path / "printer.py").write_text(
        "import os, sys\nfrom faulty import build as _build\n\n"
        "def build(params):\n    print(f'BUILT pid={os.getpid()}', file=sys.stderr, flush=True)\n    return _build(params)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=2, search={"batch_size": [8, 16], "fault": ["none"]},
                       workload={"factory": "printer:build", "params": {"fault": "none", "at_step": 3,
                                                                         "steady_ms": 20}})  # batch 16 leads, busy or not
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 0 and "confirmation run 2 of 2" in result.output, result.output
    logs = tmp_path / "results" / "s" / "logs"
    pids = {log.name: re.findall(r"BUILT pid=(\d+)", log.read_text()) for log in logs.glob("trial-*.log")}
    assert {"trial-0000.log", "trial-0000-confirm-1.log", "trial-0000-confirm-2.log"} <= set(pids), pids
    assert all(len(set(found)) == 1 for found in pids.values()), pids  # one process's output per log
    assert len({found[0] for found in pids.values()}) == len(pids), pids  # and every log another process's


def test_every_config_of_a_space_is_in_it_even_where_a_knob_is_dropped(tmp_path):
    """reshard_after_forward is dropped from a ddp config: comparing knob by knob left it out of its space."""
    import yaml
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"study": "s", "workload": {"name": "emberformer", "preset": "tiny"}, "trials": 2,
                                    "search": {"batch_size": [8], "parallel": ["ddp", "fsdp"],
                                               "reshard_after_forward": [False], "nproc": [2]}}))
    spec = specs.load(path)
    configs = list(specs.all_configs(spec))
    assert len(configs) == spec.space_size() == 2 and all(spec.contains(c) for c in configs)
    assert not spec.contains({**configs[0], "batch_size": 16})


def test_after_a_stop_on_one_error_the_fixed_code_runs_the_failed_configs_again(tmp_path, faulty_path, monkeypatch):
    """"fix it there and re-run the same command" ran nothing: the three failed configs stayed errors."""
    import os
    flag = tmp_path / "broken"
    flag.write_text("")
    (tmp_path / "mine.py").write_text(
        "import os\nfrom faulty import build as _build\n\n"
        f"def build(params):\n    if os.path.exists({str(flag)!r}):\n        raise RuntimeError('boom in build')\n"
        "    return _build(params)\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ["PYTHONPATH"]]))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "fix", ["none"], trials=3, search={"batch_size": [8, 16, 32], "fault": ["none"]},
                       workload={"factory": "mine:build", "params": {"fault": "none", "at_step": 3}})
    first = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert first.exit_code == 2 and "the first 3 trials all failed with RuntimeError: boom in build" in first.output
    flag.unlink()  # the fix
    again = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert again.exit_code == 0 and "running again the 3 config(s)" in again.output, again.output
    rows = json.loads(CliRunner().invoke(main, ["report", "--format", "json"]).output)
    assert sorted(r["status"] for r in rows) == ["ok"] * 3 and sum(r["baseline"] for r in rows) == 1, rows


def test_a_space_smaller_than_three_that_fails_alike_stops_too(tmp_path, faulty_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "two", ["raise"], trials=2, search={"batch_size": [8, 16], "fault": ["raise"]})
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 2 and "the first 2 trials all failed with" in result.output, result.output


def test_errors_that_differ_only_in_their_numbers_are_one_error():
    """A batch function of the wrong width fails at every batch size, naming each: it never stopped."""
    from harness import failures
    rows = [{"status": "error", "error": {"type": "RuntimeError", "message":
             f"mat1 and mat2 shapes cannot be multiplied ({b}x33 and 32x64)"}} for b in (128, 32, 64)]
    assert failures.hopeless(rows) is not None
    rows[2]["error"]["message"] = "expected scalar type Float but found Half"
    assert failures.hopeless(rows) is None


def test_a_study_header_cut_off_while_written_is_written_whole_by_the_next_sweep(tmp_path, monkeypatch):
    """Ctrl-C while a new study's header was written left `spec_path` and nothing after it; every later
    sweep took the header as written, and a resume on another device or workload went unrefused."""
    storage = optuna.storages.InMemoryStorage()
    spec = spec_for(tmp_path)
    real, writes = optuna.Study.set_user_attr, []

    def cut_at_the_third(self, key, value):
        writes.append(key)
        if len(writes) == 3:
            raise KeyboardInterrupt
        real(self, key, value)

    monkeypatch.setattr(optuna.Study, "set_user_attr", cut_at_the_third)
    with pytest.raises(KeyboardInterrupt):
        ledger.create(spec, storage, "cuda:0")
    monkeypatch.setattr(optuna.Study, "set_user_attr", real)
    study = ledger.create(spec, storage, "cuda:0")
    assert {"spec_path", "device", "workload", "memory_budget", "objective"} <= set(study.user_attrs)
    with pytest.raises(UserError, match=r"ran on cuda:0, this run is on cpu"):
        ledger.resumed(spec, study, "cpu")


def test_a_resume_on_another_model_of_device_is_refused(tmp_path):
    """A study swept on one GPU (or CPU) model and resumed on another mixed their figures in one choice."""
    spec = spec_for(tmp_path)
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cuda:0", "NVIDIA H100 80GB HBM3")
    with pytest.raises(UserError, match=r"measured on NVIDIA H100 80GB HBM3, this run is on NVIDIA A100-SXM4-80GB: "
                                         r"their figures would not compare.*--study NAME"):
        ledger.resumed(spec, study, "cuda:0", "NVIDIA A100-SXM4-80GB")
    ledger.resumed(spec, study, "cuda:1", "NVIDIA H100 80GB HBM3")  # a second worker on the same model
    ledger.resumed(spec, study, "cuda:0", None)  # NVML cannot tell: the kind's check alone
    old = ledger.create(spec_for(tmp_path), optuna.storages.InMemoryStorage(), "cuda:0")  # a study from before
    ledger.resumed(spec, old, "cuda:0", "NVIDIA A100-SXM4-80GB")


def test_a_cli_resume_on_another_cpu_model_is_one_line_and_writes_nothing(tmp_path, faulty_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], trials=1)
    assert CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"]).exit_code == 0
    journal = tmp_path / "results" / "s" / "journal.log"
    before = journal.read_bytes()
    from harness import doctor
    monkeypatch.setattr(doctor, "cpu_model", lambda: "Another CPU 9000")
    again = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--trials", "2"])
    assert again.exit_code == 2, again.output
    assert "this run is on Another CPU 9000: their figures would not compare" in again.output
    assert journal.read_bytes() == before


def test_the_space_tried_note_says_how_its_configs_ended(tmp_path, faulty_path, monkeypatch):
    """"all 2 configs of the search space are measured" was printed where one had run out of memory
    (a reviewer's sweep said 4 measured where 2 were skipped as predicted not to fit)."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none", "oom"], sampler="grid", trials=5, memory={"budget": "512MiB"})
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "all 2 configs of the search space are tried: 1 measured, 1 oom" in said, said
    assert "are measured" not in said


def test_a_resume_measuring_otherwise_says_so(tmp_path, faulty_path, monkeypatch):
    """A resume with another trial.max_seconds ranked trials measured two ways with no word of it."""
    monkeypatch.chdir(tmp_path)
    first = faulty_spec(tmp_path, "s", ["none"], search={"batch_size": [8, 16], "fault": ["none"]}, trials=1)
    assert CliRunner().invoke(main, ["sweep", str(first), "--device", "cpu"]).exit_code == 0
    same = CliRunner().invoke(main, ["sweep", str(first), "--device", "cpu"])
    assert same.exit_code == 0 and "measures trials otherwise" not in same.output, same.output
    longer = faulty_spec(tmp_path, "s", ["none"], search={"batch_size": [8, 16], "fault": ["none"]}, trials=2,
                         trial={**FAST_TRIAL, "max_seconds": 2})
    again = CliRunner().invoke(main, ["sweep", str(longer), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    said = " ".join(again.output.split())
    assert (f"note: this run measures trials otherwise than the study's first (trial.max_seconds "
            f"{float(FAST_TRIAL['max_seconds'])} -> 2.0): its figures are ranked with theirs; start a new study "
            "with --study NAME to keep them apart") in said, said


def test_a_resume_whose_narrowed_space_is_all_tried_sets_the_queued_rest_aside(tmp_path, faulty_path, monkeypatch):
    """The grid's queued batch-16 and -32 trials stayed WAITING in the journal, without the note the README
    promises, once the narrowed space (batch 8) was all tried: the sweep stopped before asking for them."""
    monkeypatch.chdir(tmp_path)
    grid = {"batch_size": [8, 16, 32], "fault": ["none"]}
    first = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=1, search=grid)
    assert CliRunner().invoke(main, ["sweep", str(first), "--device", "cpu"]).exit_code == 0
    narrowed = faulty_spec(tmp_path, "s", ["none"], sampler="grid", trials=3, search={**grid, "batch_size": [8]})
    again = CliRunner().invoke(main, ["sweep", str(narrowed), "--device", "cpu"])
    said = " ".join(again.output.split())
    assert again.exit_code == 0, said
    for batch in (16, 32):
        assert f"not run: batch_size {batch} is no longer in the spec's search space" in said, said
    assert "all 1 configs of the search space are tried: 1 measured" in said, said
    study = ledger.load(stores.existing_storage(None, tmp_path / "results", "s"), "s")
    assert not study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [r["config"]["batch_size"] for r in ledger.rows_of(study)] == [8]


def test_a_draw_of_your_configs_value_is_set_aside_without_a_word(tmp_path):
    """Your batch 12, outside the list, is a sampler's choice so that it can be enqueued: a draw of it by
    another trial is set aside, and said nothing, where it said "no longer in the spec's search space
    (... before the spec changed)" of a spec no one changed. A value the spec dropped is still said."""
    spec = ledger.including(spec_for(tmp_path, search={"batch_size": [8, 16]}), {"batch_size": 12})
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    ledger.enqueue_baseline(study, spec, spec.config({"batch_size": 12}))
    notes = []

    class Notes(studies.Progress):
        def note(self, message):
            notes.append(message)
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 1, None, Notes())
    study.ask()  # the baseline's trial
    sweep.set_aside(study.ask(), spec.config({"batch_size": 12}), drawn=True)
    assert notes == []
    sweep.set_aside(study.ask(), spec.config({"batch_size": 4}), drawn=True)  # drawn before a resume narrowed the list
    assert notes == ["trial 2 not run: batch_size 4 is no longer in the spec's search space (the study queued or "
                     "drew it before the spec changed)"]


def test_a_draw_of_your_config_itself_is_set_aside_not_told_as_a_repeat(tmp_path):
    """Drawn with your config's own values (batch 12 beside [8, 16]), a trial was told "[dup] #1 repeats
    #0" and counted as the sampler re-proposing a measured config, which stops a sweep early."""
    spec = ledger.including(spec_for(tmp_path, search={"batch_size": [8, 16]}), {"batch_size": 12})
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    ledger.enqueue_baseline(study, spec, spec.config({"batch_size": 12}))
    repeats = []

    class Repeats(studies.Progress):
        def duplicate(self, number, of, config):
            repeats.append(number)
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 3, None, Repeats(),
                          runner=lambda config, number, repeat=False: {"status": "ok", "throughput": 10.0,
                                                                       "peak_memory": GiB, "timing": {"step_s": {"cv": 0.01}}})
    assert sweep.run_one()  # your config
    study.enqueue_trial(ledger.sampler_params(spec, spec.config({"batch_size": 12})))  # as the sampler draws it: no config
    assert not sweep.run_one()
    drawn = study.trials[1]
    assert drawn.user_attrs.get("outside_space") and "duplicate_of" not in drawn.user_attrs and repeats == []


def test_your_accumulation_that_makes_another_effective_batch_is_said(tmp_path):
    """Your batch 16 with accumulation 1 under effective_batch 64 ran at an effective batch of 16 beside
    configs at 64, and nothing said so."""
    spec = spec_for(tmp_path, search={"batch_size": [16, 32], "accumulation": {"effective_batch": 64}})
    assert spec.outside({"batch_size": 16, "accumulation": 1}) == [
        "accumulation 1 (an effective batch of 16, not effective_batch 64)"]
    assert spec.outside({"batch_size": 16, "accumulation": 4}) == []
    assert spec.outside({"batch_size": 8, "accumulation": 8}) == ["batch_size 8"]  # not in the list, yet it makes 64


def test_a_drawn_config_outside_the_space_for_no_value_of_yours_is_still_said(tmp_path):
    """The set-aside's silence is for your config's values only: a draw outside the space with no knob
    value to name (its derived accumulation is not the spec's) is said, as before."""
    spec = spec_for(tmp_path, search={"batch_size": [8, 16]})
    study = ledger.create(spec, optuna.storages.InMemoryStorage(), "cpu")
    notes = []

    class Notes(studies.Progress):
        def note(self, message):
            notes.append(message)
    sweep = studies.Sweep(spec, study, "cpu", tmp_path, 1, None, Notes())
    sweep.set_aside(study.ask(), {**spec.config({"batch_size": 8}), "accumulation": 3}, drawn=True)
    assert len(notes) == 1 and notes[0].startswith("trial 0 not run: ") and "accumulation=3" in notes[0], notes


def test_a_misspelt_factory_fixed_as_the_error_says_runs_in_the_same_study(tmp_path, faulty_path, monkeypatch):
    """"cannot import faulty:buidl ...; fix it and re-run": the re-run was refused, as the study had
    "measured another workload", though nothing of it was measured. (A name the module's source never
    spells is now refused at load; `params` is spelled there, as an argument, so only a trial finds it.)"""
    monkeypatch.chdir(tmp_path)
    def typo():
        return faulty_spec(tmp_path, "s", ["none"], trials=1, workload={"factory": "faulty:params", "params": {"fault": "none"}})
    first = CliRunner().invoke(main, ["sweep", str(typo()), "--device", "cpu"])
    assert first.exit_code == 2 and "cannot import faulty:params" in first.output, first.output
    said = CliRunner().invoke(main, ["report"], env={"COLUMNS": "300"}).output  # not "nothing ran yet: resume"
    assert "next: the sweep stopped on your code: cannot import faulty:params" in said, said
    fixed = faulty_spec(tmp_path, "s", ["none"], trials=1)
    again = CliRunner().invoke(main, ["sweep", str(fixed), "--device", "cpu"])
    assert again.exit_code == 0, again.output
    shown = CliRunner().invoke(main, ["report", "--format", "json"])
    rows = json.loads(shown.output)
    assert [r["status"] for r in rows] == ["ok"], rows  # the interrupted trial of the typo is set aside
    # once something was measured, the identity holds again
    typo_again = CliRunner().invoke(main, ["sweep", str(typo()), "--device", "cpu", "--trials", "2"])
    assert typo_again.exit_code == 2 and "measured another workload" in typo_again.output


def test_the_spec_s_timeout_limits_the_sweep_as_timeout_does(tmp_path, faulty_path, monkeypatch):
    """`timeout: 2h` in a spec was read and then ignored: only --timeout stopped a sweep."""
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "s", ["none"], timeout="1s", search={"batch_size": [4, 8, 16], "fault": ["none"]})
    result = CliRunner().invoke(main, ["sweep", str(path), "--device", "cpu", "--trials", "3"])
    assert result.exit_code == 0, result.output
    assert studies.TIME_UP in result.output
    rows = json.loads(CliRunner().invoke(main, ["report", "--format", "json"]).output)
    assert len(rows) < 3, rows
