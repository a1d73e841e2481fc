"""One study, one choice, told the same by every view: the terminal table and summary, the HTML page,
JSON, CSV, `bench apply` and the live sweep output state the same best, speedup (with its spread) and
tie. And `apply` changes only what the measurements justify: not a tie with the user's config, not a
config whose loss rose, not a compile that does not pay back within the run the target describes."""
import csv
import html
import io
import json
import re

import optuna
import pytest
from click.testing import CliRunner

import harness
from harness import ledger, spec as specs, storage as stores
from harness import study as studies
from harness.apply import plan
from harness.cli import main
from tests.conftest import write_spec

GiB = 1024**3
CONFIG = "examples/config.yaml"


def make_study(project, trials, repeats, name="one", **spec_overrides):
    """A study whose records are given: (config, samples/s, peak GiB, extra record keys)."""
    spec_path = write_spec(project, name, memory={"budget": "10GiB", "headroom": 0.1},
                           search={"batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-mixed", "bf16-true"],
                                   "compile": ["off", "default"]}, **spec_overrides)
    spec = specs.load(spec_path)
    study = ledger.create(spec, stores.open_storage(None, project / "results", name), "cpu")
    sweep = studies.Sweep(spec, study, "cpu", project / "results", len(trials), None)
    for i, (knobs, tput, peak, extra) in enumerate(trials):
        trial = study.ask({})
        config = spec.config(knobs)
        trial.set_user_attr("config", config)
        if i == 0:
            trial.set_user_attr("baseline", True)
        rec = {"status": "ok", "config": config, "throughput": tput, "peak_memory": int(peak * GiB),
               "timing": {"step_s": {"cv": 0.01, "median": knobs["batch_size"] / tput}, "compile_s": 0.0,
                          "first_step_s": 0.5},
               "loss": {"first": 4.8, "last": 4.6}, "env": {"device": "Test GPU"}, "error": None,
               "number": trial.number}
        for key, value in extra.items():
            rec[key] = {**rec[key], **value} if isinstance(value, dict) and isinstance(rec.get(key), dict) else value
        sweep.tell(trial, rec)
    study.set_user_attr("repeats", {str(n): [{"status": "ok", "throughput": t, "tokens_per_s": None,
                                               "peak_memory": None, "busy": None} for t in runs]
                                    for n, runs in repeats.items()})
    return project


def live_sweep(project, name="one") -> studies.Sweep:
    """The study as a sweep resuming it sees it."""
    spec = specs.load(project / f"{name}.yaml")
    study = ledger.create(spec, stores.open_storage(None, project / "results", name), "cpu")
    return studies.Sweep(spec, study, "cpu", project / "results", 0, None)


def bench(*args, **env):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, env=env)


def flat(text: str) -> str:
    return " ".join(text.split())


def views(project):
    """What each view says about best, the speedup and the tie."""
    table = flat(bench("report", COLUMNS="200").output)
    bench("report", "--format", "html")
    page = flat(re.sub(r"<[^>]+>", " ", (project / "results" / "one" / "report.html").read_text()))
    rows = json.loads(bench("report", "--format", "json").output)
    grid = list(csv.DictReader(io.StringIO(bench("report", "--format", "csv").output)))
    dry = flat(bench("apply", "best", "--dry-run").output)
    return table, page, rows, grid, dry


CLEAR = [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
         ({"batch_size": 32, "precision": "bf16-mixed"}, 141.0, 6.0, {}),
         ({"batch_size": 16, "precision": "bf16-mixed"}, 120.0, 4.0, {})]


def test_every_view_states_the_same_best_speedup_and_tie(project):
    make_study(project, CLEAR, {1: [150.0, 130.0], 0: [98.0, 102.0]})
    table, page, rows, grid, dry = views(project)
    best = [r for r in rows if r["best"]]
    assert [r["number"] for r in best] == [1] and best[0]["speed"]["value"] == 141.0 and best[0]["speed"]["runs"] == 3
    versus = best[0]["vs_baseline"]
    said = f"{versus['ratio']:.2f}× ± {versus['spread']:.2f}"
    assert said == "1.40× ± 0.18" and versus["tie"] is False  # the paired rounds: 150/98, 130/102
    worded = f"{versus['ratio']:.2f}× the samples/s, ± {versus['spread']:.2f} over 2 runs each side by side"
    assert "best: trial 1" in table and worded in table and "runs: measured runs the figure is the median of" in table
    assert "Best: trial #1" in page and said in page and "a tie" not in page and "141.0 samples/s" in page
    assert [r["best"] for r in grid] == ["False", "True", "False"] and grid[1]["speed"] == "141.0"
    assert [r["leader"] for r in grid] == ["False", "True", "False"] and grid[1]["speed_unit"] == "samples/s"
    assert [r["tiers"].split() for r in grid] == [r["tiers"] for r in rows]  # the CSV carries what JSON does
    assert (grid[1]["vs_baseline"], grid[1]["vs_baseline_spread"], grid[1]["vs_baseline_paired"], grid[1]["tie"]) == \
        tuple(str(versus[k]) for k in ("ratio", "spread", "paired", "tie"))  # the spread says over how many runs
    assert grid[1]["vs_baseline_bound"] == str(versus["bound"]) and grid[1]["vs_baseline_apart_this"] == ""
    verdict = f"{worded} — beyond the noise"  # the story's words: the summary and apply's header said no verdict
    assert f"vs baseline (trial 1 vs trial 0): {verdict}" in table and f"{worded}: beyond the noise" in page
    assert "trial 1:" in dry and f"vs your config as swept (trial 0) {verdict}" in dry
    assert f"# bench apply: vs your config as swept (trial 0): {verdict}" in \
        bench("apply", "best", "--dry-run").output
    assert "a tie" not in table + dry
    spec = specs.load(project / "one.yaml")
    sweep = studies.Sweep(spec, ledger.load(stores.open_storage(None, project / "results", "one"), "one"), "cpu",
                          project / "results", 3, None)
    assert sweep.leader_so_far()["number"] == 1 and sweep.best_as_reported()[0]["number"] == 1  # the live "best so far"


def test_the_csv_carries_runs_wholly_apart_as_json_does(project):
    """JSON said why a wide spread was no tie (`apart`); the CSV had no column for it."""
    make_study(project, CLEAR[:2], {1: [175.6, 164.5, 180.9, 166.2], 0: [143.6, 152.1, 112.0, 113.9]})
    rows = json.loads(bench("report", "--format", "json").output)
    grid = list(csv.DictReader(io.StringIO(bench("report", "--format", "csv").output)))
    assert rows[1]["vs_baseline"]["apart"] == [164.5, 152.1] and rows[1]["vs_baseline"]["tie"] is False
    assert (grid[1]["vs_baseline_apart_this"], grid[1]["vs_baseline_apart_yours"]) == ("164.5", "152.1")
    assert grid[1]["vs_baseline_bound"] == str(rows[1]["vs_baseline"]["bound"])


def test_a_study_with_no_trial_yet_has_a_csv_header_that_pandas_reads(project):
    """A study killed before its first trial printed an empty line as its CSV: pandas.read_csv refused it."""
    import pandas
    make_study(project, [], {})
    text = bench("report", "--format", "csv").output
    assert text.splitlines()[0].startswith("number,status,baseline,") and "peak_memory" in text.splitlines()[0]
    frame = pandas.read_csv(io.StringIO(text))
    assert len(frame) == 0 and {"speed", "peak_memory", "error"} <= set(frame.columns)


def test_apply_of_a_trial_set_aside_or_a_repeat_says_so_and_names_what_stands_in(project):
    """`bench apply 2` of a trial the live output showed, since set aside (or a repeat of another's
    config), said "not in study", as if mistyped."""
    make_study(project, CLEAR, {})
    study = live_sweep(project).study
    ledger.supersede(study, [2])
    repeat = study.ask({})
    repeat.set_user_attr("duplicate_of", 1)
    study.tell(repeat, state=optuna.trial.TrialState.FAIL)
    before = (project / CONFIG).read_bytes()
    aside, twice, absent = bench("apply", "2"), bench("apply", str(repeat.number)), bench("apply", "9")
    assert aside.exit_code == 2 and "trial 2: it was set aside, its config queued to run again" in flat(aside.output)
    assert twice.exit_code == 2 and "already measured as trial 1; say `bench apply 1`" in flat(twice.output)
    assert absent.exit_code == 2 and "trial 9: not in study one" in flat(absent.output)
    config = study.trials[2].user_attrs["config"]
    study.enqueue_trial({}, user_attrs={"config": config})  # queued, not yet run: it did not "run again"
    assert "its config is queued to run again as trial 4;" in flat(bench("apply", "2").output)
    rerun = study.ask({})
    rerun.set_user_attr("config", config)
    rerun.set_user_attr("record", {"status": "crash", "config": config})
    study.tell(rerun, state=optuna.trial.TrialState.FAIL)
    assert f"its config ran again as trial {rerun.number};" in flat(bench("apply", "2").output)
    assert (project / CONFIG).read_bytes() == before


def test_the_live_line_says_why_a_single_faster_run_is_not_best(project):
    """A one-run 130 against a confirmed median of 100: the live output named #0 best and said nothing."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 16, "precision": "fp32"}, 116.0, 3.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 130.0, 3.0, {})],
               {1: [117.0, 115.0], 0: [99.0, 101.0]})
    sweep = studies.Sweep(specs.load(project / "one.yaml"),
                          ledger.load(stores.open_storage(None, project / "results", "one"), "one"), "cpu",
                          project / "results", 3, None)
    best, note = sweep.best_as_reported(2)
    rows = json.loads(bench("report", "--format", "json").output)
    assert best["number"] == [r["number"] for r in rows if r["best"]][0]
    assert best["number"] == 1  # a single run the confirmed best outranks: the report's reason, live
    assert note.startswith("trial 2 measured") and "not chosen" in note, note


def test_the_live_line_gives_the_reports_reason_a_faster_trial_is_ruled_out(project):
    """The live line's own rule (pareto.why_not) knew nothing of a loss that rose: a lighter trial 1.4%
    faster than best, whose loss rose beyond chance, was said to lose "a tie [that] goes to the config with
    more headroom (#1 peaks at 6.00 GiB, #2 at 3.00 GiB)"; and beyond the noise it said nothing at all."""
    risen = {"loss": {"first": 4.81, "last": 4.875}}
    make_study(project, CLEAR[:2] + [({"batch_size": 16, "precision": "bf16-true"}, 143.0, 3.0, risen),
                                     ({"batch_size": 16, "precision": "bf16-mixed"}, 190.0, 3.0, risen)], {})
    sweep = live_sweep(project)
    rows = json.loads(bench("report", "--format", "json").output)
    assert [r["number"] for r in rows if r["best"]] == [1] and rows[2]["unsafe"] and rows[3]["unsafe"]
    for number in (2, 3):
        best, note = sweep.best_as_reported(number)
        assert best["number"] == 1 and note is not None, number
        assert note.startswith(f"trial {number} is faster (") and "but not chosen: its loss rose 4.81 → 4.875" in note
        assert "a tie goes to" not in note
    table = flat(bench("report", COLUMNS="200").output)
    assert sweep.best_as_reported(3)[1] in table  # the fastest such trial: the report's own line, word for word


def test_without_an_apply_section_no_view_offers_bench_apply(project):
    """Every view said "next: `bench apply best` writes trial #1 into your config", and apply then
    refused: the spec names no config file."""
    make_study(project, CLEAR, {1: [150.0, 130.0], 0: [98.0, 102.0]})
    spec = project / "one.yaml"
    spec.write_text(spec.read_text().split("\napply:")[0] + "\n")
    table = flat(bench("report", COLUMNS="200").output)
    bench("report", "--format", "html")
    page = flat(re.sub(r"<[^>]+>", " ", (project / "results" / "one" / "report.html").read_text()))
    for view in (table, page):
        assert "bench apply best" not in view
        assert "next: trial #1 is best; to write it into your config, add an apply: section to the spec" in view
        assert "your current config" not in view  # the baseline is the spec's first values: no config was read


def test_a_tie_with_the_users_config_is_not_applied_and_every_view_says_so(project):
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 103.0, 6.0, {})],
               {1: [100.0, 106.0], 0: [101.0, 99.0]})
    before = (project / CONFIG).read_text()
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [0]  # the user's config stays best
    leader = next(r for r in rows if r["leader"])
    assert leader["number"] == 1 and leader["vs_baseline"]["tie"] is True
    assert "a tie: within the noise (1× ± " in table and "so your config stays" in table
    assert "a tie: within the noise (1× ± " in page and "so your config stays" in page
    assert all(r["tier"] is None for r in rows[1:])  # the tiers keep the user's config too
    assert "Your config stays best: trial #0" in page
    result = bench("apply", "best")
    assert result.exit_code == 0 and "keeping your config" in result.output and "nothing written" in result.output
    under = bench("apply", "best", "--budget", "9GiB")  # the choice made again says why it keeps yours too
    assert under.exit_code == 0 and "keeping your config" in under.output and "nothing written" in under.output
    assert (project / CONFIG).read_text() == before and not list((project / "examples").glob("*.bench-backup-*"))


def test_apply_under_a_budget_names_it_in_the_header_and_refuses_one_larger_than_the_sweeps(project):
    """`apply safe --budget 1GiB` of a study swept under 400 MiB chose among configs measured under the smaller
    wall (those that ran out of memory there never ran above it), and no header said which choice was written."""
    make_study(project, CLEAR, {1: [150.0, 130.0], 0: [98.0, 102.0]})
    header = bench("apply", "safe", "--budget", "8GiB", "--dry-run").output
    assert "# bench apply: written by bench" in header and "trial 1 (the safe tier under --budget 8.00 GiB)" in header
    assert "(best)" not in bench("apply", "best", "--dry-run").output  # plain best needs no words
    larger = bench("apply", "safe", "--budget", "12GiB")
    assert larger.exit_code == 2 and larger.output.strip().splitlines()[-1] == (
        "error: --budget 12.00 GiB: more than the 10.00 GiB budget the study was swept under, so configs that ran out "
        "of memory there were never measured above it; say at most 10.00 GiB, or sweep a new study with "
        "--memory-budget SIZE")
    assert bench("apply", "safe", "--budget", "10.004GiB", "--dry-run").exit_code == 0  # the size it says, as typed back
    assert not list((project / "examples").glob("*.bench-backup-*"))


def test_a_confirmed_figure_over_an_even_number_of_runs_is_their_median(project):
    """Four runs (a trial and three confirmation runs) gave the upper middle one, 141.0, not the median."""
    make_study(project, CLEAR, {1: [150.0, 130.0, 120.0], 0: [98.0, 102.0]})
    rows = json.loads(bench("report", "--format", "json").output)
    assert rows[1]["speed"]["value"] == 135.5 and rows[1]["speed"]["runs"] == 4  # (130 + 141) / 2


def test_a_kept_tie_names_whom_the_models_line_is_about_and_apply_says_when_it_writes_your_config_back(project):
    """With a tie kept, "why best:" explained the leader, and `bench apply best` said it "changes nothing"
    above a diff that wrote the swept values back over a file edited since."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 103.0, 6.0, {})],
               {1: [100.0, 106.0], 0: [101.0, 99.0]})
    study = ledger.load(stores.open_storage(None, project / "results", "one"), "one")
    study.set_user_attr("model", {"predicted": [], "why": "batch 32 is the fastest of its family", "why_for": 1})
    table, page, rows, grid, dry = views(project)
    assert "why trial #1 leads: batch 32" in table and "why trial #1 leads: batch 32" in page
    assert "why best" not in table + page
    assert "changes nothing" not in table + page + dry
    config = project / CONFIG
    config.write_text(config.read_text().replace("batch_size: 8", "batch_size: 64"))
    result = flat(bench("apply", "best").output)
    assert "keeping your config" in result and "no longer holds your config as swept" in result and "wrote" in result
    assert "batch_size: 8" in config.read_text()


def test_the_live_best_so_far_is_the_reports_best_and_says_why_the_leader_is_not(project, monkeypatch):
    """The sweep's live line said "best so far: #1" (the leader) while the report, from the same records,
    said your config stays best: two sources for one number."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 103.0, 6.0, {})],
               {1: [100.0, 106.0], 0: [101.0, 99.0]})
    spec = specs.load(project / "one.yaml")
    shown = []

    class Shown(studies.Progress):
        def trial_finished(self, number, rec, best, note=None):
            shown.append((best["number"], note))
    sweep = studies.Sweep(spec, ledger.load(stores.open_storage(None, project / "results", "one"), "one"), "cpu",
                          project / "results", 3, None, Shown())
    monkeypatch.setattr(sweep, "runner", lambda config, number, repeat=False: {
        "status": "ok", "throughput": 50.0, "peak_memory": 1 * GiB, "timing": {"step_s": {"cv": 0.01}}})
    sweep.plan_next()
    sweep.run_one()
    rows = json.loads(bench("report", "--format", "json").output)
    assert [r["number"] for r in rows if r["best"]] == [0] and shown[-1][0] == 0
    assert shown[-1][1].startswith("trial 1 is 1.03× the samples/s") and "your config stays" in shown[-1][1]


def test_a_sure_win_is_best_where_the_faster_leader_only_ties_with_your_config(project):
    """Ties are not transitive: the leader's runs spread too wide to beat your config, another config's
    runs beat it clearly. Every view kept the user's config and never named the sure win."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 134.0, 3.0, {}),
                         ({"batch_size": 16, "precision": "bf16-mixed"}, 124.0, 4.0, {})],
               {0: [99.0, 101.0], 1: [100.0, 170.0], 2: [123.0, 125.0]})
    table, page, rows, grid, dry = views(project)
    marks = {r["number"]: (r["best"], r["leader"], r["vs_baseline"] and r["vs_baseline"]["tie"]) for r in rows}
    assert marks == {0: (False, False, None), 1: (False, True, True), 2: (True, False, False)}, marks
    said = "trial 1 leads but ties with your config within the noise; trial 2 is 1.24×"
    assert said in table and said in page
    why = next(line for line in table.split(" next: ")[0].split("trial 1 leads")[1:])
    assert why.count("beyond the noise") == 1 and "beyond the noise: trial 2 is best" in why, why  # it said it twice
    assert "vs baseline (trial 2 vs trial 0): 1.24× the samples/s, ±" in table and "trial #2 vs #0" in page
    assert "trial 2:" in dry and "vs your config as swept (trial 0) 1.24× the samples/s, ±" in dry and "keeping your config" not in dry
    assert "your config stays" not in table + page
    assert rows[2]["tier"] == "safe" and rows[2]["tiers"] == ["safe", "balanced", "aggressive"]  # JSON held only one


def test_a_config_whose_loss_rose_is_never_best_but_shown_as_fastest_but_unsafe(project):
    make_study(project, CLEAR[:2] + [({"batch_size": 32, "precision": "bf16-true"}, 190.0, 3.0,
                                      {"loss": {"first": 4.81, "last": 4.875}})], {})
    table, page, rows, grid, dry = views(project)
    unsafe = rows[2]
    assert not unsafe["best"] and not unsafe["pareto"] and "its loss rose 4.81 → 4.875" in unsafe["unsafe"]
    assert [r["number"] for r in rows if r["best"]] == [1]
    assert "trial 2 is faster (190.0 samples/s) but not chosen: its loss rose" in table
    assert "trial 2 is faster (190.0 samples/s) but not chosen" in page
    assert "trial 1:" in dry and "bf16-true" not in dry.split("---")[0]


def test_a_config_with_a_value_the_spec_no_longer_searches_is_never_best_in_any_view(project):
    """bf16-true won; the user took it out of the spec's search and swept again: `bench apply best` still
    wrote bf16-true into their config."""
    make_study(project, CLEAR[:2] + [({"batch_size": 32, "precision": "bf16-true"}, 190.0, 3.0, {}),
                                      ({"batch_size": 16, "precision": "fp32", "compile": "default"}, 90.0, 3.0, {})], {})
    narrowed = specs.load(write_spec(project, "one", memory={"budget": "10GiB", "headroom": 0.1}, search={
        "batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-mixed"], "compile": ["off", "default"]}))
    study = ledger.load(stores.open_storage(None, project / "results", "one"), "one")
    assert ledger.mark_unsearched(study, narrowed) == {"2": ["precision=bf16-true"]}
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [1] and rows[2]["unsearched"] == ["precision=bf16-true"]
    said = "trial 2 is faster (190.0 samples/s) but not chosen: precision=bf16-true is not in the search as last swept"
    assert said in table and said in html.unescape(page) and "tag-unsearched" in \
        (project / "results" / "one" / "report.html").read_text()
    lines = [line.split() for line in bench("report", COLUMNS="200").output.splitlines()]
    marks = {cells[0]: cells[1] for cells in lines if cells[:1] in (["2"], ["3"])}  # the mark column, else the batch
    assert marks == {"2": "x", "3": "16"} and "x a value not in the search as last swept" in table
    assert "tag-unsearched" in \
        (project / "results" / "one" / "report.html").read_text()
    assert [r["unsearched"] for r in grid] == ["", "", "precision=bf16-true", ""] and grid[1]["best"] == "True"
    assert "trial 1:" in dry and "bf16-true" not in dry.split("---")[0]
    assert "never chosen as best: precision=bf16-true" in flat(bench("apply", "2", "--dry-run").output)
    widened = specs.load(write_spec(project, "one", memory={"budget": "10GiB", "headroom": 0.1}, search={
        "batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-mixed", "bf16-true"], "compile": ["off", "default"]}))
    assert ledger.mark_unsearched(study, widened) == {}  # put back: searched, and choosable, again
    no_compile = specs.load(write_spec(project, "one", memory={"budget": "10GiB", "headroom": 0.1}, search={
        "batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-mixed", "bf16-true"]}))
    assert ledger.mark_unsearched(study, no_compile) == {"3": ["compile=default"]}  # a knob no longer searched
    ledger.mark_unsearched(study, widened)
    assert [r["number"] for r in json.loads(bench("report", "--format", "json").output) if r["best"]] == [2]


@pytest.mark.parametrize("last", [float("nan"), float("inf")])
def test_a_baseline_whose_loss_went_non_finite_neither_condemns_nor_clears_a_rise(project, last):
    # a NaN rise made every "within chance" comparison false: a 0.2% rise (scatter 0.2) read as unsafe;
    # an inf one would have cleared any rise
    sound = {"loss": {"first": 4.8, "last": 4.81, "scatter": 0.2}}
    rose = {"loss": {"first": 4.8, "last": 5.4, "scatter": 0.01}}
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0,
                          {"status": "diverged", "loss": {"first": 4.8, "last": last, "finite": False}}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 200.0, 4.0, sound),
                         ({"batch_size": 16, "precision": "bf16-mixed"}, 150.0, 3.0, {}),
                         ({"batch_size": 64, "precision": "bf16-mixed"}, 300.0, 6.0, rose)], {})
    rows = json.loads(bench("report", "--format", "json").output)
    assert [r["number"] for r in rows if r["best"]] == [1]
    assert rows[1]["unsafe"] is None and "its loss rose 4.8 → 5.4" in rows[3]["unsafe"]


def test_a_diverged_baseline_is_compared_with_nothing_in_every_view(project):
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0,
                          {"status": "diverged", "loss": {"last": float("nan"), "finite": False}})] + CLEAR[1:], {})
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [1]
    assert [r["vs_baseline"] for r in rows] == [None] * 3 and {r["vs_baseline"] for r in grid} == {""}
    assert "baseline (trial 0) ended diverged: nothing to compare against" in table and "×" not in table
    assert "your config (#0) ended diverged: nothing to compare against" in page
    assert "vs your config - your config ended diverged" in page and "your config 100 samples/s" not in page
    assert "trial 1:" in dry and "vs your config as swept (trial 0) no ratio: your config ended diverged" in dry

def test_a_noisy_baseline_is_compared_with_nothing_and_apply_says_nothing_shows_a_pick_is_faster(project):
    """Your config's windows spread 159% CV on a busy host; the report still said "1.36× the samples/s:
    beyond the noise" (its noise capped at 10%), and `apply safe` wrote a config 0.14× of yours with no word."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0,
                          {"timing": {"step_s": {"cv": 1.59, "median": 0.08}}})] + CLEAR[1:], {})
    table, page, rows, grid, dry = views(project)
    assert rows[0]["noisy"] and [r["vs_baseline"] for r in rows] == [None] * 3 and {r["vs_baseline"] for r in grid} == {""}
    said = "timed windows disagree (159% CV, most often a busy machine): not a measurement to compare against"
    assert f"baseline (trial 0): its {said}" in table and f"your config (#0)'s {said}" in html.unescape(page)
    assert "×" not in table and "beyond the noise" not in page
    assert "runs:" not in table  # every figure is one run: no runs column, and no legend for one
    tile = "your config&#x27;s windows disagree (159% CV): nothing to compare with"  # the speedup tile said "best is your config"
    assert tile in page and "best is your config" not in page
    assert "your config 100.0 samples/s" not in page  # the best tile set the two figures side by side all the same
    warned = "your config (trial 0) ran too noisy to compare against (159% CV, most often a busy machine), so nothing shows trial"
    assert "vs your config as swept (trial 0) no ratio: your config ran too noisy to compare (159% CV)" in dry
    assert warned in dry
    assert warned in flat(bench("apply", "safe", "--dry-run").output)


def test_a_noisy_trial_is_compared_with_your_config_in_no_view(project):
    """A trial whose windows disagreed (never ranked) carried `vs_baseline: {ratio: 3.0, tie: false}` in
    JSON and CSV, a verdict its own runs cannot bear."""
    make_study(project, CLEAR + [({"batch_size": 64, "precision": "bf16-mixed"}, 300.0, 8.0,
                                  {"timing": {"step_s": {"cv": 0.9, "median": 64 / 300}}})], {})
    table, page, rows, grid, dry = views(project)
    assert rows[3]["noisy"] and rows[3]["vs_baseline"] is None and grid[3]["vs_baseline"] == grid[3]["tie"] == ""
    assert rows[1]["vs_baseline"]["ratio"] == pytest.approx(1.41)  # a steady trial still is
    # the CSV's status is the table's ("noisy"): a script's `status == "ok"` picked it as the fastest config
    assert "off noisy 300.0" in table and [g["status"] for g in grid] == ["ok", "ok", "ok", "noisy"]
    frame = harness.load_study("one", results=project / "results")
    assert list(frame.status) == ["ok", "ok", "ok", "noisy"]
    noisy = bench("apply", "3", "--dry-run").output
    assert "trial 3:" in noisy and "vs your config as swept (trial 0) no ratio: trial 3 ran too noisy to compare (90% CV)" in noisy


def test_a_faster_config_tied_with_best_where_memory_is_scarce_is_said_why_it_lost(project):
    # a landscape of the CPU gpt stand-in: batch 16 ran 5.6% faster once than batch 8's confirmed median,
    # within batch 8's noise, at a peak over 75% of the budget: the tie goes to the lighter, in every view
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 16, "precision": "fp32"}, 150.0, 3.0, {}),
                         ({"batch_size": 32, "precision": "fp32"}, 158.0, 8.0, {})],
               {1: [160.0, 140.0], 0: [99.0, 101.0]})
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [1]
    said = ("trial 2 measured 5.3% faster than trial 1 (158.0 samples/s, its trial's run) but is not chosen: it ties with trial 1 "
            "within the noise (±10%), and where a tied config peaks over 75% of the 10,240 MiB budget a tie "
            "goes to the lighter")
    assert said in table and said in html.unescape(page)


def compile_trials():
    eager = ({"batch_size": 32, "precision": "bf16-mixed", "compile": "off"}, 141.0, 6.0, {})
    compiled = ({"batch_size": 32, "precision": "bf16-mixed", "compile": "default"}, 160.0, 6.0,
                {"timing": {"compile_s": 60.5}})
    return CLEAR[:1] + [eager, compiled]


@pytest.mark.parametrize("max_steps, chosen", [(None, 2), (2_000, 1), (200_000, 2)])
def test_compile_is_chosen_only_where_it_pays_back_within_the_run_the_target_describes(project, max_steps, chosen):
    # 32 / 141 - 32 / 160 s saved a step = 27 ms; 60 s of compiling pays back after ~2,240 steps
    if max_steps:
        text = (project / CONFIG).read_text().replace("  max_epochs: 50\n", f"  max_epochs: 50\n  max_steps: {max_steps}\n")
        (project / CONFIG).write_text(text)
    make_study(project, compile_trials(), {})
    table = flat(bench("report", COLUMNS="200").output)
    rows = json.loads(bench("report", "--format", "json").output)
    assert [r["number"] for r in rows if r["best"]] == [chosen]
    sweep = live_sweep(project)  # the sweep's own bar (its live "best so far", the race, the slow cut) is the same
    assert sweep.choice().best.number == chosen and sweep.leader_so_far()["number"] == chosen
    assert "pays for itself after 2,2" in table
    if chosen == 1:  # the live line says why the faster compile is not best, as the report does (it said nothing)
        assert sweep.best_as_reported(2)[1] == "trial 2 (compile) pays back only after 2,226 steps; the run is the " \
            "2,000-step run config.yaml describes (trainer.max_steps): not chosen"
        assert sweep.best_as_reported(2)[1] in table
    if max_steps is None:  # the example config says max_epochs 50, and nothing about an epoch's length
        assert "an assumed run of 10,000 steps (config.yaml says trainer.max_epochs 50 but not how many " \
               "steps an epoch has)" in table
    else:
        assert f"the {max_steps:,}-step run config.yaml describes (trainer.max_steps)" in table


def test_a_report_whose_spec_no_longer_loads_says_what_it_judges_without_it(project):
    """The study's spec broken after the sweep: the report fell back to an assumed 10,000-step run (compile
    chosen) without a word, where `bench apply` refuses the spec."""
    text = (project / CONFIG).read_text().replace("  max_epochs: 50\n", "  max_epochs: 50\n  max_steps: 2000\n")
    (project / CONFIG).write_text(text)
    make_study(project, compile_trials(), {})
    (project / "one.yaml").write_text((project / "one.yaml").read_text() + "search: [\n")
    report = bench("report", COLUMNS="200")
    assert report.exit_code == 0
    said = flat(report.stderr)
    assert said.startswith("note: ") and "one.yaml at its end (line " in said and "no longer loads" in said and \
        "an assumed run of 10,000 steps" in said and "fix it for `bench apply`" in said, said
    assert bench("apply", "best", "--dry-run").exit_code == 2


def test_load_study_marks_the_best_the_report_marks_where_compile_pays_back_only_in_a_longer_run(project):
    """`harness.load_study` (the README's "same trials as a pandas DataFrame") made the choice again without
    the run the apply target describes: a 2,000-step run, where compile pays back only after ~2,240 steps,
    had `bench report` and `bench apply best` say trial 1 and the DataFrame say trial 2."""
    import harness
    text = (project / CONFIG).read_text().replace("  max_epochs: 50\n", "  max_epochs: 50\n  max_steps: 2000\n")
    (project / CONFIG).write_text(text)
    make_study(project, compile_trials(), {})
    rows = json.loads(bench("report", "--format", "json").output)
    assert [r["number"] for r in rows if r["best"]] == [1]
    assert "trial 1:" in bench("apply", "best", "--dry-run").output
    frame = harness.load_study("one", results=project / "results")
    marks = ("best", "leader", "tier", "pareto", "fits")
    assert frame[frame["best"]]["number"].tolist() == [1]
    assert [{k: (None if v != v else v) for k, v in zip(marks, row)} for row in frame[list(marks)].itertuples(index=False)] \
        == [{k: r[k] for k in marks} for r in rows]


def test_a_compile_slower_than_eager_is_said_slower_not_a_negative_saving(project):
    eager = ({"batch_size": 32, "precision": "bf16-mixed", "compile": "off"}, 141.0, 6.0, {})
    slower = ({"batch_size": 32, "precision": "bf16-mixed", "compile": "default"}, 10.0, 6.0, {"timing": {"compile_s": 69.9}})
    make_study(project, CLEAR[:1] + [eager, slower], {})
    table = flat(bench("report", COLUMNS="200").output)
    assert "compile: trial 2 spent 69.9s compiling, 2973.0 ms/step slower vs trial 1: never pays for itself " \
           "(slower than eager)" in table


def test_apply_warns_about_every_comment_a_change_makes_stale_precision_too(tmp_path):
    from tests.test_apply import target_for
    file = tmp_path / "train.yaml"
    file.write_text("trainer:\n  precision: 32-true   # bf16 never tried\n  accumulate_grad_batches: 1\n")
    p = plan(target_for(file, preset="lightning"), {"precision": "bf16-true"}, {"study": "s"})
    assert len(p.warnings) == 1 and "trainer.precision" in p.warnings[0] and "speaks of bf16" in p.warnings[0]
    listing = tmp_path / "list.yaml"
    listing.write_text("trainer:\n  precision: 32-true   # 32-true | bf16-mixed | 16-mixed\n")
    assert plan(target_for(listing, preset="lightning"), {"precision": "bf16-mixed"}, {"study": "s"}).warnings == ()


def test_old_records_read_through_the_typed_record():
    from harness.record import VERSION, Record
    old = {"status": "ok", "number": 4, "throughput": 10.0, "tokens_per_s": 512.0, "peak_memory": 5,
           "cuda_graphs": False, "repeats": [{"status": "ok", "throughput": 12.0, "tokens_per_s": {"median": 600.0}}]}
    rec = Record.of(old)
    assert rec.version == 1 and rec.tokens_per_s == 512.0 and rec.runs("tokens") == [512.0, 600.0]
    assert rec.extra == {"cuda_graphs": False} and rec.to_dict()["cuda_graphs"] is False
    assert Record.of({**old, "version": VERSION}).version == VERSION


@pytest.mark.parametrize("leak, read", [
    ({"bytes": 2**20, "steps": 4, "bytes_per_step": 2**18}, True),
    ("lots", False), ({"bytes": "1 MiB", "steps": 4, "bytes_per_step": 2**18}, False),
    ({"bytes": 2**20, "steps": True, "bytes_per_step": 2**18}, False), ({"bytes": 2**20, "steps": 4}, False),
])
def test_a_leak_is_read_only_where_the_record_holds_one_and_a_hand_edited_one_is_not(leak, read):
    """The trial line, the report and apply format its figures: a word there would be a TypeError in all three."""
    from harness.cli import leak_warning
    from harness.record import Record
    row = {"status": "ok", "number": 3, "throughput": 10.0, "peak_memory": 5, "memory": {"leak": leak}}
    assert (Record.of(row).leak is not None) == read
    assert (leak_warning([row]) or "").startswith("trial 3: memory the steps keep grew in every window, 1.0 MiB "
                                                  "over 4 steps (256.0 KiB a step)") == read


@pytest.mark.parametrize("status, said", [
    ("interrupted", "nothing ran to a result yet: run the same `bench sweep` to resume"),
    ("crash", "no trial trained: see the statuses"),
])
def test_a_study_with_nothing_measured_says_what_to_do_next_and_claims_no_quiet_machine(status, said):
    """An interrupted first trial read "no config fits ... try smaller batch sizes" and "the machine was
    quiet for every trial", though nothing had run."""
    from harness import report
    config = {"batch_size": 8, "precision": "fp32"}
    rows = [{"number": n, "status": status, "config": config, "throughput": None, "peak_memory": None,
             "baseline": n == 0, "error": {"type": "X", "message": "exited with code 3"}} for n in range(3)]
    choice = report.annotate(rows, {"name": "s", "memory_budget": GiB, "headroom": 0.1})
    assert report.next_step(choice).startswith(said)
    quiet = any("quiet for every trial" in line for line in report.story(choice))
    assert quiet == (status == "crash")  # a crash ran, and the machine was checked for it; an interrupted try did not


@pytest.mark.parametrize("baseline, said", [
    ({"timing": {"step_s": {"cv": 0.7}}}, "your config (#0)'s timed windows disagree (70% CV"),
    ({"peak_memory": int(9.5 * GiB)}, "your config (#0) ran, but no config leaves the 10% headroom of the 10.00 GiB budget"),
])
def test_the_story_says_why_there_is_nothing_to_compare_with_a_baseline_that_ran(baseline, said):
    """Both read "your config (#0) ended ok: nothing to compare against"."""
    from harness import report
    rows = [{"number": 0, "status": "ok", "config": {"batch_size": 8}, "throughput": 100.0, "peak_memory": 2 * GiB,
             "baseline": True, "timing": {"step_s": {"cv": 0.01}}},
            {"number": 1, "status": "ok", "config": {"batch_size": 16}, "throughput": 200.0, "peak_memory": int(9.8 * GiB),
             "timing": {"step_s": {"cv": 0.01}}}]
    rows[0].update(baseline)
    choice = report.annotate(rows, {"name": "s", "memory_budget": 10 * GiB, "headroom": 0.1})
    assert report.story(choice)[0].startswith(said) and "ended ok" not in " ".join(report.story(choice))
    page = report.render_html(choice, {"name": "s"})
    assert "No measured configuration qualifies as best" in page and "finished inside the budget" not in page


def test_apply_leaves_out_a_knob_never_searched_that_the_file_lacks(project):
    """The file has no checkpointing key and the sweep never varied it: applying your own config, or a trial
    that changes the batch and precision, was refused for a key that would change nothing."""
    config = project / CONFIG
    config.write_text(config.read_text().replace("  activation_checkpointing: false", ""))
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 103.0, 6.0, {})],
               {1: [100.0, 106.0], 0: [101.0, 99.0]})
    kept = bench("apply", "best")
    assert kept.exit_code == 0 and "nothing to change" in kept.output, kept.output
    other = bench("apply", "1")
    assert other.exit_code == 0 and "wrote" in other.output, other.output
    assert "batch_size: 32" in config.read_text() and "checkpointing" not in config.read_text().split("model:")[1][:300]


def test_apply_best_says_so_when_it_writes_your_swept_config_back_over_an_edit(project):
    """Your config won outright and the file was edited since: the diff reverted it without a word."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 150.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 100.0, 6.0, {})],
               {0: [149.0, 151.0], 1: [99.0, 101.0]})
    config = project / CONFIG
    config.write_text(config.read_text().replace("batch_size: 8 ", "batch_size: 64 "))
    result = flat(bench("apply", "best").output)
    assert "no longer holds your config as swept (edited since)" in result and "keeping your config" not in result
    assert "batch_size: 8 " in config.read_text()


def test_a_confirmed_figures_spread_is_its_runs_in_every_view(project):
    """`± cv` beside a confirmed median showed the first run's step-time CV (1.0%), though the median's
    three runs spread 10%: the spread the choice's noise is made of was in no view."""
    make_study(project, CLEAR, {1: [155.1, 127.0], 0: [98.0, 102.0]})
    table = bench("report", COLUMNS="200").output
    row = next(line for line in table.splitlines() if re.match(r"\s*1\s", line))
    assert "141.0" in row and "10.0%" in row and "1.0%" not in row, table
    third = next(line for line in table.splitlines() if re.match(r"\s*2\s", line))
    assert "1.0%" in third  # one run: its timed windows' spread
    rows = json.loads(bench("report", "--format", "json").output)
    assert round(rows[1]["speed"]["cv"], 4) == 0.0996 and rows[2]["speed"]["cv"] == 0.01
    grid = list(csv.DictReader(io.StringIO(bench("report", "--format", "csv").output)))
    assert round(float(grid[1]["speed_cv"]), 4) == 0.0996 and grid[1]["step_cv"] == "0.01"


def test_a_trial_cut_after_one_warm_up_step_shows_no_spread_in_any_view(project):
    """A trial cut after its first warm-up step has one timing, whose step-time "CV" is 0.0 in the raw record:
    the table showed `-` (Record.step_cv: one timing has no spread) while the HTML page said "±0%" and the
    CSV's step_cv 0.0, the steadiest figure in the study for its least measured one (the quickstart's #3, #4)."""
    cut = ({"batch_size": 16, "precision": "fp32"}, 60.0, 3.0,
           {"timing": {"windows": 0, "step_s": {"cv": 0.0, "median": 16 / 60}, "cut_short": "60.0 samples/s in its "
                       "first warm-up step, under the sweep's cut of 70.5: not timed further"}})
    make_study(project, [*CLEAR, cut], {})
    table = bench("report", COLUMNS="200").output
    row = next(line for line in table.splitlines() if re.match(r"\s*3\s", line))
    assert "60.0" in row and "0.0%" not in row and "-" in row, table
    rows = json.loads(bench("report", "--format", "json").output)
    assert rows[3]["speed"]["cv"] is None
    grid = list(csv.DictReader(io.StringIO(bench("report", "--format", "csv").output)))
    assert grid[3]["speed_cv"] == "" and grid[3]["step_cv"] == "", grid[3]
    assert grid[1]["step_cv"] == "0.01"  # a timed trial keeps its windows' spread
    bench("report", "--format", "html")
    page = (project / "results" / "one" / "report.html").read_text()
    trial = re.search(r'<tr class="[^"]*" data-trial="3">(.*?)</tr>', page).group(1)
    assert "266.7" in trial and "±0%" not in trial, trial  # its step time, with no spread beside it
    assert "±1%" in re.search(r'<tr class="[^"]*" data-trial="1">(.*?)</tr>', page).group(1)


def test_an_oom_rows_figure_is_empty_in_csv_as_it_is_null_in_json(project):
    """CSV gave an OOM row `speed_unit` samples/s and `runs` 0 where JSON has `speed: null`: CSV now
    reads the figure JSON carries."""
    oom = ({"batch_size": 64, "precision": "fp32"}, 1.0, 0.0,
           {"status": "oom", "throughput": None, "peak_memory": None, "timing": {"step_s": None}})
    make_study(project, [*CLEAR, oom], {})
    rows = json.loads(bench("report", "--format", "json").output)
    grid = list(csv.DictReader(io.StringIO(bench("report", "--format", "csv").output)))
    assert rows[3]["status"] == "oom" and rows[3]["speed"] is None
    assert {k: grid[3][k] for k in ("speed", "speed_unit", "runs", "speed_cv")} == dict.fromkeys(
        ("speed", "speed_unit", "runs", "speed_cv"), "")
    assert (grid[1]["speed"], grid[1]["speed_unit"], grid[1]["runs"]) == ("141.0", "samples/s", "1")


def test_a_resume_with_a_value_taken_out_of_the_search_says_so_and_chooses_among_the_rest(tmp_path, faulty_path,
                                                                                        monkeypatch):
    """Through `bench sweep` as a user resumes it: batch 32 won, the spec's list then stopped at 16."""
    from tests.conftest import faulty_spec
    monkeypatch.chdir(tmp_path)

    def steady(self, config, number, repeat=False):  # a figure per batch, whatever the machine's load
        return {"status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
                "timing": {"step_s": {"cv": 0.005}}}
    monkeypatch.setattr(studies.Sweep, "launch", steady)
    path = faulty_spec(tmp_path, "narrowed", ["none"], trials=3, search={"batch_size": [8, 16, 32], "fault": ["none"]})
    first = bench("sweep", path, "--device", "cpu")
    assert first.exit_code == 0, first.output
    best = lambda: [(r["number"], r["config"]["batch_size"]) for r in json.loads(bench("report", "--format", "json").output)
                    if r["best"]]
    assert [b for _, b in best()] == [32]
    faulty_spec(tmp_path, "narrowed", ["none"], trials=3, search={"batch_size": [8, 16], "fault": ["none"]})
    second = bench("sweep", path, "--device", "cpu")
    assert second.exit_code == 0, second.output
    assert "note: trial #2 measured batch_size=32, which this sweep does not search (the spec's search, on this " \
           "machine): kept as measured, never chosen as best" in flat(second.output), second.output
    assert [b for _, b in best()] == [16]


def test_a_trial_over_the_budget_shows_no_speed_in_any_view(project):
    """A CPU trial that ran to the end with its peak over the budget is `oom` (OverBudget), and its
    record keeps the throughput it measured: every view showed that speed, and a ratio to your config,
    for a config the budget does not allow (the CSV's docs: speed empty for an OOM)."""
    over = ({"batch_size": 64, "precision": "fp32"}, 777.0, 12.0,
            {"status": "oom", "error": {"type": "OverBudget", "message": "peak 12.0 GiB over the 10.0 GiB budget"}})
    make_study(project, CLEAR + [over], {})
    table, page, rows, grid, _ = views(project)
    assert "777" not in table and "7.8" not in table and "777" not in page
    (row,) = [r for r in rows if r["status"] == "oom"]
    assert row["speed"] is None and row["vs_baseline"] is None
    (line,) = [g for g in grid if g["status"] == "oom"]
    assert line["speed"] == "" and line["vs_baseline"] == ""
    # nor its own run's rate: the record's keeps it, Record.rate (what the table reads) does not
    assert row["throughput"] is None and line["throughput"] == "" and "777" not in json.dumps(row)


def test_apply_of_an_answer_a_busy_machine_decided_says_it_is_noise(project):
    """`bench report` called the answer noise (best measured on a busy machine) while `bench apply best`
    wrote it with no word of it, in its output or in the header it leaves in the file."""
    busy = {"load1": 3.5, "cores": 2, "busy_cores": 1.9, "steal": 0.0, "gpu_processes": 0}
    trials = [CLEAR[0], (*CLEAR[1][:3], {"busy": busy}), *CLEAR[2:]]
    make_study(project, trials, {})
    assert "quiet" in bench("report").output
    applied = bench("apply", "best")
    assert applied.exit_code == 0, applied.output
    assert "warning: the figures deciding this study's answer were measured on a busy machine" in flat(applied.output)
    assert "the study's answer is noise" in (project / CONFIG).read_text()
    make_study(project, CLEAR, {}, name="quiet")  # and not a word of it where the machine was quiet
    calm = bench("apply", "best", "--dry-run", "--study", "quiet")
    assert calm.exit_code == 0 and "busy machine" not in calm.output and "answer is noise" not in calm.output, calm.output


def test_your_faster_config_over_the_headroom_is_said_in_every_view_and_by_apply(project):
    """An audit: your config ran 665.9 samples/s at 45.4 MiB of a 50 MiB budget (10% headroom: 45 MiB),
    and best was a config at 0.67x your speed, said only as "the fastest config measured that fits":
    nothing said your own, faster config was set aside for the headroom, or that apply slows you down."""
    make_study(project, [({"batch_size": 32, "precision": "fp32"}, 150.0, 9.5, {}),
                         ({"batch_size": 16, "precision": "fp32"}, 100.0, 5.0, {}),
                         ({"batch_size": 8, "precision": "fp32"}, 80.0, 3.0, {})],
               {0: [149.0, 151.0], 1: [99.0, 101.0]})
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [1]
    said = ("your config (trial 0) is faster (150.0 samples/s) but peaks at 9.50 GiB and leaves less than the "
            "10% headroom of the 10.00 GiB budget: trial 1 is the fastest config that leaves it")
    assert said in table and said in html.unescape(page)
    assert said in dry  # apply says it before the diff that slows you down
    assert f"# bench apply: note={said}" in bench("apply", "best", "--dry-run").output  # and so does the file, later
    # JSON and CSV: whether each config's peak leaves the headroom
    assert [(r["number"], r["fits"]) for r in rows] == [(0, False), (1, True), (2, True)]
    assert [r["fits"] for r in grid] == ["False", "True", "True"]
    # a tier's pick slower than yours for its own headroom is said too
    balanced = flat(bench("apply", "balanced", "--dry-run").output)
    assert "leaves less than the 15% headroom of the 10.00 GiB budget: trial 1 is the fastest config that leaves it" in balanced
    assert "your config (trial 0) is faster" not in flat(bench("apply", "2", "--dry-run").output)  # one you named


def test_a_resume_after_your_file_was_edited_says_whose_config_it_compares_with(project):
    """An audit edited the config file after a sweep (by hand, or with `bench apply 1`) and resumed: the
    sweep said nothing, kept comparing with the config as first swept, and ended "your config stays best,
    so bench apply best has nothing to change" though apply best then reverted the file."""
    make_study(project, [({"batch_size": 8, "precision": "fp32"}, 150.0, 2.0, {}),
                         ({"batch_size": 32, "precision": "bf16-mixed"}, 100.0, 6.0, {})],
               {0: [149.0, 151.0], 1: [99.0, 101.0]})
    config = project / CONFIG
    said = flat(bench("sweep", "one.yaml", "--trials", "2").output)
    assert "holds" not in said and "writes it back" not in said  # the file as swept: nothing to say of it
    assert "ended on its trial cap" in said  # 2 of 24 configs: the next step is to measure more
    config.write_text(config.read_text().replace("batch_size: 8 ", "batch_size: 64 "))
    said = flat(bench("sweep", "one.yaml", "--trials", "2").output)
    assert ("note: config.yaml makes batch_size=64 now, but this study measured your config as first swept "
            "(batch_size=8): every comparison with your config is with that one; to have your file as it is "
            "now measured as your config, sweep a new study (--study NAME)") in said
    assert "has nothing to change" not in said
    assert ("your config as swept stays best; config.yaml holds batch_size=64 now, so bench apply best "
            "writes it back") in said
    # and apply of another trial says whose config its ratio is against, on screen and in the file's header
    applied = flat(bench("apply", "1", "--dry-run").output)
    assert "config.yaml makes batch_size=64 now, not your config as swept (batch_size=8)" in applied
    header = bench("apply", "1", "--dry-run").output
    assert "# bench apply: vs your config as swept (trial 0): " in header
    assert "note=config.yaml made batch_size=64 before this apply, not your config as swept (batch_size=8)" in header


# your config, a leader whose rounds beside yours disagree (a tie, so yours is kept), and a faster trial
KEPT_TIE = [({"batch_size": 8, "precision": "fp32"}, 100.0, 2.0, {}),
            ({"batch_size": 16, "precision": "fp32"}, 160.0, 3.0, {}),
            ({"batch_size": 32, "precision": "fp32"}, 250.0, 4.0, {})]


def test_a_faster_config_that_is_no_sure_win_over_a_kept_tie_is_said_why(project):
    """A second audit: the leader (confirmed) tied with your config, so yours stayed; trial 2 had measured
    2.71x yours in one run beside it, and no view said why it was not best. Only a win beyond the noise of
    two or more rounds side by side replaces your config over a tied leader."""
    make_study(project, KEPT_TIE,
               {0: [100.0, 100.0], 1: [300.0, 60.0]})  # the leader's rounds beside yours disagree: a tie
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [0]
    said = ("trial 2 measured 2.50× your config's speed (250.0 samples/s, its trial's run, against your config's "
            "100.0) but is not chosen: "
            "the leader, trial 1, ties with your config, and only a win beyond the noise of two or more rounds "
            "run side by side with your config replaces it; trial 2 has none")
    assert said in table and said in html.unescape(page)


def test_a_ratio_over_rounds_side_by_side_says_so_beside_the_median(project):
    """"1.00× your config's speed (128.4 samples/s, median of 5 runs)" read as 128.4 over your 123.6: the 1.00
    was the rounds' own ratio, taken side by side, and nothing said so."""
    make_study(project, KEPT_TIE,
               {0: [100.0, 100.0], 1: [300.0, 60.0], 2: [125.0, 80.0]})
    table, page, rows, grid, dry = views(project)
    assert [r["number"] for r in rows if r["best"]] == [0]
    said = ("trial 2 measured 1.00× your config's speed over 2 rounds run side by side (125.0 samples/s, median of "
            "3 runs) but is not chosen: the leader, trial 1, ties with your config, and only a win beyond the noise "
            "of two or more rounds run side by side with your config replaces it; its 2 are within their noise")
    assert said in table and said in html.unescape(page)


@pytest.mark.parametrize("which, whose", [("best", "the spec keeps"), ("safe", "the safe tier keeps")])
def test_a_budget_nothing_fits_under_says_whose_headroom(project, which, whose):
    """It said "no measured config fits with the 10% headroom of best; sweep with a smaller search space"."""
    make_study(project, CLEAR, {})
    said = bench("apply", which, "--budget", "1GiB", "--dry-run")
    assert said.exit_code == 2 and "--budget 1.00 GiB: no measured config fits under it with the " in flat(said.output)
    assert f"headroom {whose}; give a larger --budget, or sweep smaller batch sizes" in flat(said.output), said.output
