"""The end-to-end path through the CLI: sweep -> report -> apply, with real trials on the CPU."""
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness import report
from harness.cli import main
from tests.conftest import write_spec


def bench(*args):
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One small real sweep shared by the read-only tests below."""
    import os
    import shutil
    from tests.conftest import EMBERFORMER_CONFIG
    folder = tmp_path_factory.mktemp("swept")
    (folder / "examples").mkdir()
    shutil.copy(EMBERFORMER_CONFIG, folder / "examples" / "config.yaml")
    spec = write_spec(folder, trials=4)
    old = os.getcwd()
    os.chdir(folder)
    try:  # four trials, not an auto stop: the views below need several rows
        result = bench("sweep", spec, "--device", "cpu", "--trials", "4")
    finally:
        os.chdir(old)
    return folder, spec, result


def in_folder(folder, *args):
    import os
    old = os.getcwd()
    os.chdir(folder)
    try:
        return bench(*args)
    finally:
        os.chdir(old)


def test_sweep_runs_real_trials_and_measures_the_baseline_first(swept):
    folder, spec, result = swept
    assert result.exit_code == 0, result.output
    assert "(baseline: your current config)" in result.output.split("\n[2/")[0]
    assert result.output.count("→ ok") >= 3
    assert (folder / "results" / "tiny" / "journal.log").stat().st_size > 0
    assert list((folder / "results" / "tiny" / "logs").glob("trial-*.log"))


def test_report_json_contract(swept):
    folder, _, _ = swept
    result = in_folder(folder, "report", "--format", "json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) >= 4
    for row in rows:
        for key in ("number", "status", "config", "throughput", "peak_memory", "pareto", "best", "baseline"):
            assert key in row
        assert isinstance(row["config"], dict) and "batch_size" in row["config"]
        for flag in ("pareto", "best", "baseline"):
            assert isinstance(row[flag], bool)
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["throughput"] > 0 and r["peak_memory"] > 0 for r in ok)
    ranked = [r for r in ok if not r["noisy"] and not r["unsafe"]]  # a loaded machine can make any trial noisy
    assert sum(r["best"] for r in rows) == (1 if ranked else 0)
    assert sum(r["baseline"] for r in rows) == 1
    baseline = next(r for r in rows if r["baseline"])
    # the example config says batch_size 8, 32-true, no checkpointing, no compile
    assert baseline["config"]["batch_size"] == 8 and baseline["config"]["precision"] == "fp32"
    assert baseline["config"]["checkpointing"] == "none"
    for best in (r for r in rows if r["best"]):  # off the front only where a tie with your config decided it
        assert best["status"] == "ok" and (best["pareto"] or best["baseline"] or not best["leader"])
    # nothing on the front is dominated by another ranked trial, on the figure the choice was made on
    for r in (r for r in rows if r["pareto"]):
        assert not any(o["speed"]["value"] > r["speed"]["value"] and o["peak_memory"] < r["peak_memory"] for o in ranked)
    for r in ok:
        assert r["speed"]["unit"] == "samples/s" and r["speed"]["runs"] == 1 + len(r["repeats"] or [])


def test_report_table_and_csv(swept):
    folder, _, result = swept
    table = in_folder(folder, "report")
    assert table.exit_code == 0
    # the sweep ends with the report's answer (it ended on "next: bench report"), unless noise decided it
    sweep_words, words = " ".join(result.output.split()), " ".join(table.output.split())
    best = re.search(r"best: trial .*?MiB", words).group(0)
    assert best in sweep_words or "when the machine is quiet" in sweep_words, (best, result.output[-2000:])
    assert "★" in table.output and "samples/s" in table.output and "best: trial" in table.output
    # whichever config won on this machine's load: compared with the baseline, or the baseline itself
    words = " ".join(table.output.split())
    assert any(said in words for said in ("vs baseline (trial", "— your config as swept", "leader (trial"))
    csv_out = in_folder(folder, "report", "tiny", "--format", "csv")
    header = csv_out.output.splitlines()[0].split(",")
    assert {"number", "status", "throughput", "peak_memory", "config.batch_size"} <= set(header)
    # --study, as sweep and apply take it ("No such option"), reads the same study; two names are refused
    assert in_folder(folder, "report", "--study", "tiny", "--format", "csv").output == csv_out.output
    assert in_folder(folder, "report", "results/tiny", "--study", "tiny", "--format", "csv").output == csv_out.output
    twice = in_folder(folder, "report", "tiny", "--study", "other")
    assert twice.exit_code == 2 and "study named twice, as tiny and as --study other: give one" in twice.output


def test_report_out_never_replaces_what_the_report_is_made_from(swept):
    folder, spec, _ = swept
    own = [folder / "results" / "tiny" / "journal.log", spec, folder / "examples" / "config.yaml"]
    before = [path.read_bytes() for path in own]
    for path, fmt in zip(own, ("json", "html", "table")):
        result = in_folder(folder, "report", "--format", fmt, "--out", path)
        assert result.exit_code == 2 and "which bench reads to report and apply" in result.output, result.output
    assert [path.read_bytes() for path in own] == before
    lock = in_folder(folder, "report", "--out", folder / "results" / "tiny" / "claim.lock")
    assert lock.exit_code == 2 and "only report files go" in lock.output
    for path in own[:2]:  # apply --to: the config would replace the study's journal or its spec
        result = in_folder(folder, "apply", "best", "--to", path)
        assert result.exit_code == 2 and "which bench reads to report and apply" in result.output, result.output
    inside = in_folder(folder, "apply", "best", "--to", folder / "results" / "tiny" / "best.yaml")
    assert inside.exit_code == 2 and "only report files go" in inside.output, inside.output
    assert [path.read_bytes() for path in own] == before and not (folder / "results" / "tiny" / "best.yaml").exists()
    import os
    hard = folder / "my-copy.yaml"  # a hard link of the spec is the spec: apply wrote a training config into it
    os.link(spec, hard)
    try:
        linked = in_folder(folder, "apply", "best", "--to", hard)
        assert linked.exit_code == 2 and "that is the study's spec" in linked.output, linked.output
        assert [path.read_bytes() for path in own] == before
    finally:
        hard.unlink()
    os.environ["FORCE_COLOR"] = "1"
    try:  # the table to a file, as printed, without escape codes
        table = in_folder(folder, "report", "--out", folder / "report.txt")
    finally:
        del os.environ["FORCE_COLOR"]
    text = (folder / "report.txt").read_text()
    assert table.exit_code == 0 and "best: trial" in text and "\x1b[" not in text


def test_an_html_page_that_cannot_be_written_where_it_goes_says_so_not_out(swept, monkeypatch):
    """Under a read-only results folder, `bench report --format html` said "--out results/s/report.html:
    cannot write", though no --out was given."""
    folder, _, _ = swept

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")
    monkeypatch.setattr("harness.apply.replace_file", read_only)
    page = in_folder(folder, "report", "--format", "html")
    said = " ".join(page.output.split())
    assert page.exit_code == 2 and "report.html (the page's own place): cannot write (Read-only file system); " \
        "give --out with a writable path" in said and "--out results" not in said, said


def test_a_copied_study_folder_read_by_its_new_name_says_what_it_holds(swept, tmp_path):
    """It said "no study named 'copy' in that storage: it holds 's'; name it", and naming it read the
    original folder, not the copy."""
    import shutil
    folder, _, _ = swept
    [study] = [p for p in (folder / "results").iterdir() if p.is_dir()]
    shutil.copytree(study, tmp_path / "results" / "copy")
    said = " ".join(in_folder(tmp_path, "report", "copy").output.split())
    assert f"no study named 'copy' in results/copy/journal.log: it holds '{study.name}' (its folder copied or " \
        "renamed); rename the folder back to its study's name to read it here" in said, said


def test_report_out_names_its_kind_by_its_suffix_and_a_format_that_disagrees_is_refused(swept, tmp_path):
    """`--format html --out r.csv` wrote a page into a .csv file, `--out r.json` a table into a .json
    one, and `--wide` was silently ignored with json."""
    folder, _, _ = swept
    page = in_folder(folder, "report", "--format", "html", "--out", tmp_path / "r.csv")
    assert page.exit_code == 2 and "a .csv file for --format html; name it r.html, or give --format csv" in page.output
    wide = in_folder(folder, "report", "--format", "json", "--wide")
    assert wide.exit_code == 2 and "--wide: only the table has columns to widen" in wide.output, wide.output
    sheet = in_folder(folder, "report", "--out", tmp_path / "r.xlsx")  # wrote the text table, exit 0
    assert sheet.exit_code == 2 and "not .xlsx; name it r.csv for a spreadsheet" in " ".join(sheet.output.split())
    # `--out ""` said "--out .: cannot write (Is a directory)", then "--out .: a folder"
    for folder_named, said in (("", "'' is empty; name a file, or leave --out out"),
                               (str(tmp_path), "a folder, not a file; name a file in it for the report")):
        folder_out = in_folder(folder, "report", "--out", folder_named)
        assert folder_out.exit_code == 2 and said in folder_out.output
    assert list(tmp_path.iterdir()) == []
    assert in_folder(folder, "report", "--format", "csv", "--out", tmp_path / "r.log").exit_code == 0
    assert in_folder(folder, "report", "--out", tmp_path / "plain").exit_code == 0  # no suffix: the table
    assert "best: trial" in (tmp_path / "plain").read_text()
    for name in ("r.json", "r.csv", "r.html", "r.md"):
        assert in_folder(folder, "report", "--out", tmp_path / name).exit_code == 0, name
    assert json.loads((tmp_path / "r.json").read_text())[0]["status"] == "ok"
    assert (tmp_path / "r.csv").read_text().startswith("number,status")
    assert (tmp_path / "r.html").read_text().lower().startswith("<!doctype html>")
    assert "best: trial" in (tmp_path / "r.md").read_text()


def test_report_out_replaces_an_earlier_report_and_never_a_file_of_yours(swept, tmp_path):
    """`bench report --out README.md` replaced the project's README with the table: any existing .md,
    .json, .csv or .html counted as a report."""
    folder, _, _ = swept
    yours = {"README.md": "# my project\n\nGiB = 1024³ bytes, a line that reads like the table's legend\n",
             "package.json": '{"name": "mine"}\n', "data.csv": "a,b\n1,2\n", "index.html": "<title>mine</title>\n",
             "notes.txt": "values: mine\n"}
    for name, text in yours.items():
        (tmp_path / name).write_text(text)
        result = in_folder(folder, "report", "--out", tmp_path / name)
        assert result.exit_code == 2 and "exists and is not a report bench wrote" in result.output, (name, result.output)
        assert (tmp_path / name).read_text() == text
    for name in ("r.md", "r.json", "r.csv", "r.html", "wide.txt"):  # bench's own, written again
        extra = ("--wide",) if name == "wide.txt" else ()
        for _ in range(2):
            result = in_folder(folder, "report", *extra, "--out", tmp_path / name)
            assert result.exit_code == 0, (name, result.output)


def test_report_out_writes_through_a_link_and_into_a_device_and_leaves_its_neighbours(swept, tmp_path):
    """--out renamed a temp file over the path: a symlink, a FIFO or /dev/full (as root) became a regular
    file, and the user's own `<out>.tmp` was deleted."""
    folder, _, _ = swept
    real, link, mine = tmp_path / "real.csv", tmp_path / "link.csv", tmp_path / "r.csv.tmp"
    real.write_text("number,status,best\n")  # an earlier report
    link.symlink_to(real)
    mine.write_text("mine\n")
    for out in (link, tmp_path / "r.csv"):
        result = in_folder(folder, "report", "--format", "csv", "--out", out)
        assert result.exit_code == 0, result.output
    assert link.is_symlink() and real.read_text().startswith("number,status")  # written through the link
    assert mine.read_text() == "mine\n" and (tmp_path / "r.csv").read_text().startswith("number,status")
    piped = subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", "report", "--format", "csv",
                            "--out", "/dev/stdout"], cwd=folder, capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout.startswith("number,status"), piped.stderr  # stdout a pipe
    full = in_folder(folder, "report", "--format", "csv", "--out", "/dev/full")  # a device: written, not replaced
    assert full.exit_code == 2 and "No space left" in full.output, full.output
    import stat
    assert stat.S_ISCHR(Path("/dev/full").stat().st_mode)


def test_report_from_a_sqlite_file_that_is_not_there_creates_none(tmp_path):
    missing = tmp_path / "none.db"
    result = bench("report", "--storage", f"sqlite:///{missing}", "--results", tmp_path)
    assert result.exit_code == 2 and "no database at" in result.output
    assert not missing.exists()
    from harness.storage import sqlite_path
    assert sqlite_path(f"sqlite:///{missing}") == missing and sqlite_path("sqlite:///:memory:") is None
    assert sqlite_path("sqlite:///file:x.db?mode=ro&uri=true") is None  # SQLite's own URI: not a path to check


@pytest.mark.parametrize("command", ["report", "apply"])
def test_report_or_apply_from_a_sqlite_file_no_sweep_wrote_leaves_it_as_it_was(tmp_path, command):
    """Optuna's connect created its tables in any file it was pointed at: an empty file, or another
    program's database, came back from `bench report --storage` with a study schema in it."""
    import sqlite3
    empty, other = tmp_path / "empty.db", tmp_path / "other.db"
    empty.write_bytes(b"")
    with sqlite3.connect(other) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    db.close()
    for database in (empty, other):
        before = database.read_bytes()
        result = bench(command, "--storage", f"sqlite:///{database}", "--results", tmp_path)
        assert result.exit_code == 2 and "holds no Optuna study" in result.output, result.output
        assert database.read_bytes() == before


def test_apply_best_keeps_comments_and_backs_up(swept):
    folder, _, _ = swept
    target = folder / "examples" / "config.yaml"
    before = target.read_text()
    rows = json.loads(in_folder(folder, "report", "--format", "json").output)
    best = next(r for r in rows if r["best"])
    if best["baseline"]:  # best is what the file holds (nothing to write): write another measured trial
        best = next(r for r in rows if r["status"] == "ok" and not r["baseline"])
    which = "best" if best["best"] else str(best["number"])
    dry = in_folder(folder, "apply", which, "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert target.read_text() == before
    result = in_folder(folder, "apply", which)
    assert result.exit_code == 0, result.output
    after = target.read_text()
    comments = [line.strip() for line in before.splitlines() if line.strip().startswith("#")]
    for comment in comments:
        assert comment in after
    backups = list(target.parent.glob("config.yaml.bench-backup-*"))
    assert len(backups) == 1 and backups[0].read_text() == before
    import yaml
    data = yaml.safe_load(after)
    assert data["data_loader"]["batch_size"] == best["config"]["batch_size"]
    assert data["model"]["activation_checkpointing"] == (best["config"]["checkpointing"] == "full")
    assert data["seed_everything"] == 42 and data["optimizer"]["weight_decay"] == 0.01


def test_a_mapped_knob_the_spec_does_not_search_runs_and_stays_as_your_file_has_it(project):
    """A user's accumulate_grad_batches: 2 was measured at bench's default of 1 in every trial, and apply
    then wrote 1 over it (rescaling the lr for an effective batch the user never had)."""
    config = project / "examples" / "config.yaml"
    config.write_text(config.read_text().replace("accumulate_grad_batches: 1", "accumulate_grad_batches: 2"))
    spec = write_spec(project, "held", search={"batch_size": [4, 8]}, trials=2,
                      apply={"file": "examples/config.yaml", "preset": "lightning",
                             "keys": {"batch_size": "data_loader.batch_size"},
                             "lr": {"key": "optimizer.lr", "scale": "linear"}})
    result = bench("sweep", spec, "--device", "cpu", "--trials", "2")
    assert result.exit_code == 0, result.output
    rows = json.loads(bench("report", "--format", "json").stdout)
    assert {(r["config"]["batch_size"], r["config"]["accumulation"]) for r in rows} == {(8, 2), (4, 2)}, rows
    other = next(r["number"] for r in rows if r["config"]["batch_size"] == 4)
    applied = bench("apply", str(other))
    assert applied.exit_code == 0, applied.output
    text = config.read_text()
    assert "accumulate_grad_batches: 2" in text and "precision: 32-true" in text
    assert "batch_size: 4 " in text and "lr: 1.5e-4 " in text, text  # effective batch 16 -> 8: half the lr


def test_python_dash_m_harness_is_the_bench_command():
    """Where the console script is not on PATH; `python -m harness.entry` printed nothing and exited 0."""
    done = subprocess.run([sys.executable, "-m", "harness", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.startswith("bench, version "), (done.stdout, done.stderr)


def test_trial_prints_its_json_record(project):
    spec = write_spec(project)
    result = bench("trial", spec, "--set", "batch_size=4", "--set", "precision=bf16-mixed", "--device", "cpu")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["status"] == "ok"
    assert record["config"]["batch_size"] == 4 and record["config"]["precision"] == "bf16-mixed"
    assert record["throughput"] > 0 and record["peak_memory"] > 0
    assert record["timing"]["step_s"]["median"] > 0 and record["timing"]["measured_steps"] >= 2
    assert record["env"]["torch"] and record["env"]["bench"]
    assert result.stderr.splitlines()[-1].startswith("ok: "), result.stderr  # the record's outcome, said in words


def test_trial_under_a_small_memory_budget_is_a_real_oom(project):
    spec = write_spec(project)
    result = bench("trial", spec, "--set", "batch_size=8", "--memory-budget", "8MiB", "--device", "cpu")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["status"] == "oom", record
    # oneDNN's words, counted as OOM only once the wall has refused memory, may come from forward or backward
    assert re.search(r"can't allocate memory|out of memory|MemoryError|could not (create|execute) a primitive",
                     record["error"]["message"] + record["error"]["type"])
    # torch's CUDA message opens with the whole GPU's free memory (a 24 GiB cap on an H200 read "120 GiB
    # free"), so the line says which wall it hit
    assert result.stderr.splitlines()[-1].startswith("oom under the 8.0 MiB budget: "), result.stderr


def test_rerunning_a_finished_sweep_runs_nothing_new(swept):
    folder, spec, _ = swept
    result = in_folder(folder, "sweep", spec, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "resuming: 4 of 4" in result.output
    assert "    → " not in result.output and "[5/" not in result.output


def test_load_study_gives_a_dataframe_for_notebooks(swept):
    import harness
    folder, _, _ = swept
    frame = harness.load_study("tiny", results=folder / "results")
    assert len(frame) >= 4
    assert {"number", "status", "throughput", "peak_memory", "config.batch_size", "best", "pareto"} <= set(frame.columns)
    assert frame["best"].sum() == 1


def test_custom_model_example_sweeps_and_applies_through_the_cli(tmp_path, monkeypatch):
    """The README's `cd examples/custom && bench sweep sweep.yaml && bench apply best`, on a copy."""
    import shutil
    import yaml
    from tests.conftest import ROOT
    folder = tmp_path / "custom"
    shutil.copytree(ROOT / "examples" / "custom", folder, ignore=shutil.ignore_patterns("results", "*.bench-backup-*"))
    (folder / "train.yaml").write_text((ROOT / "tests" / "data" / "projects" / "custom-train.yaml").read_text())
    monkeypatch.chdir(folder)
    monkeypatch.setenv("BENCH_QUICK", "2")
    result = bench("sweep", "sweep.yaml", "--device", "cpu")
    assert result.exit_code == 0, result.output
    # on a loaded 2-core machine the bf16 trial can run past its time limit: ended, never crashed
    assert "BENCH_QUICK is set" in result.output and result.output.count("→ ok") >= 1
    assert result.output.count("→ ok") + result.output.count("→ timeout") == 2
    assert (folder / "results" / ".gitignore").read_text().splitlines()[-1] == "*"
    rows = json.loads(bench("report", "--format", "json").output)
    best = next((r for r in rows if r["best"]), None)
    applied = bench("apply", "best")
    if best is None:  # a loaded machine made every trial noisy: apply refuses in one line and says why
        assert all(r["noisy"] for r in rows if r["status"] == "ok"), rows
        assert applied.exit_code == 2 and "noisy: their timed windows disagree" in applied.output
        return
    assert applied.exit_code == 0, applied.output
    # a smoke run's figures are written, as the README's walk-through does, marked as what they are
    assert "this study is a BENCH_QUICK smoke run" in applied.output
    if not best["baseline"]:
        assert "# bench apply: note=a BENCH_QUICK smoke run, not numbers to act on" in (folder / "train.yaml").read_text()
    data = yaml.safe_load((folder / "train.yaml").read_text())
    assert data["train"]["batch_size"] == best["config"]["batch_size"] and data["model"]["depth"] == best["config"]["depth"]
    assert data["model"]["checkpointing"] == (best["config"]["checkpointing"] == "full")


def test_apply_with_nothing_to_change_writes_nothing(swept):
    """The trial's values are what the file holds: no rewrite, no backup, no new header; it says so."""
    folder, _, _ = swept
    target = folder / "examples" / "config.yaml"
    for _ in range(2):  # once to make the file hold a trial's values (unless it did), once with nothing to do
        first = in_folder(folder, "apply", "1")
        assert first.exit_code == 0, first.output
    text, backups = target.read_text(), sorted(target.parent.glob("config.yaml.bench-backup-*"))
    mtime = target.stat().st_mtime_ns
    again = in_folder(folder, "apply", "1")
    assert again.exit_code == 0, again.output
    assert "nothing to change" in again.output and "wrote" not in again.output
    assert target.read_text() == text and target.stat().st_mtime_ns == mtime
    assert sorted(target.parent.glob("config.yaml.bench-backup-*")) == backups


def test_scenarios_run_as_separate_studies_and_report_and_apply_take_them(project):
    spec = write_spec(project, "scen", trials=1,
                      scenarios={"small-card": {"memory": {"budget": "8GiB"}},
                                 "wide": {"workload": {"params": {"d_model": 48}}}})
    result = bench("sweep", spec, "--device", "cpu")
    assert result.exit_code == 0, result.output
    assert "scen-small-card" in result.output and "scen-wide" in result.output
    assert {p.name for p in (project / "results").iterdir()} == {"scen-small-card", "scen-wide", ".gitignore"}
    small = json.loads(bench("report", "--scenario", "small-card", "--format", "json").output)
    wide = json.loads(bench("report", "scen-wide", "--format", "json").output)
    assert len(small) == 1 and len(wide) == 1
    assert small[0]["workload"]["params"]["d_model"] == 32 and wide[0]["workload"]["params"]["d_model"] == 48
    dry = bench("apply", str(wide[0]["number"]), "--scenario", "wide", "--dry-run")  # by number: a busy machine
    assert dry.exit_code == 0, dry.output                                               # can leave no best
    assert "nothing written" in dry.output


def test_a_scenario_named_by_a_number_or_its_study_renamed_is_the_one_report_takes(project, monkeypatch):
    """`--scenario 24` said "no scenario '24' (did you mean '24'?)"; `report custom --scenario b` showed
    scen-b, not the study `custom` swept as scenario b; `report scen-b --scenario 24` showed scen-24 silently."""
    from harness import study as studies
    monkeypatch.setattr(studies.Sweep, "launch", lambda self, config, number, repeat=False: {
        "status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
        "timing": {"step_s": {"cv": 0.005}}})
    spec = write_spec(project, "scen", trials=1, scenarios={24: {"memory": {"budget": "8GiB"}}, "b": {}})
    twice = bench("sweep", spec, "--device", "cpu", "--scenario", "24", "--scenario", "24")
    assert twice.exit_code == 0 and twice.output.count("bench sweep scen-24") == 1, twice.output
    assert bench("sweep", spec, "--device", "cpu", "--scenario", "b").exit_code == 0
    assert bench("sweep", spec, "--device", "cpu", "--scenario", "b", "--study", "custom").exit_code == 0
    for args, study in ((["scen", "--scenario", "24"], "scen-24"), (["custom", "--scenario", "b"], "custom"),
                        (["scen-24", "--scenario", "24"], "scen-24")):
        shown = bench("report", *args)
        assert shown.exit_code == 0 and shown.output.startswith(f"study {study}:"), (args, shown.output)
    plain = write_spec(project, "plain", trials=1)  # the most recent study now has no scenarios
    assert bench("sweep", plain, "--device", "cpu").exit_code == 0
    other = bench("report", "--scenario", "24")  # said only "plain.yaml: no scenario '24'; scenarios: none"
    assert other.exit_code == 2 and "--scenario 24: looked for in the spec of the most recent study, plain:" in \
        other.output and "`bench report STUDY --scenario 24`" in other.output, other.output
    assert bench("report", "scen", "--scenario", "24").output.startswith("study scen-24:")
    both = bench("report", "scen-b", "--scenario", "24")
    assert both.exit_code == 2 and "study 'scen-b' was swept as scenario b, and --scenario 24 names another" \
        in both.output, both.output


def test_every_scenario_is_checked_before_the_first_one_runs(project, monkeypatch):
    """A resume refused for scenario b (another memory budget), or b's apply target misspelt, came after
    scenario a had run a trial and its confirmations: exit 2 with a's trials written. And the refusal said
    "start a new study with --study NAME", which a spec of several scenarios refuses without --scenario."""
    from harness import study as studies
    monkeypatch.setattr(studies.Sweep, "launch", lambda self, config, number, repeat=False: {
        "status": "ok", "throughput": 100.0 * config["batch_size"], "peak_memory": 2**20 * config["batch_size"],
        "timing": {"step_s": {"cv": 0.005}}})
    spec = write_spec(project, "scen", trials=1, scenarios={"a": {"memory": {"budget": "8GiB"}},
                                                            "b": {"memory": {"budget": "4GiB"}}})
    assert bench("sweep", spec, "--device", "cpu").exit_code == 0
    journal = project / "results" / "scen-a" / "journal.log"
    before = journal.read_bytes()
    spec.write_text(spec.read_text().replace("budget: 4GiB", "budget: 6GiB"))
    refused = bench("sweep", spec, "--device", "cpu", "--trials", "3")
    assert refused.exit_code == 2 and journal.read_bytes() == before, refused.output
    assert refused.output.strip().splitlines()[-1].endswith(
        "start a new study with --scenario b --study NAME"), refused.output
    spec.write_text(spec.read_text().replace("budget: 6GiB", "budget: 4GiB").replace(
        "b:\n", "b:\n    apply: {file: examples/confg.yaml, preset: lightning}\n"))
    misspelt = bench("sweep", spec, "--device", "cpu", "--trials", "3")
    assert misspelt.exit_code == 2 and "confg.yaml: file not found" in misspelt.output, misspelt.output
    assert journal.read_bytes() == before


def test_apply_and_the_html_report_warn_when_the_target_describes_another_size(swept):
    """The tiny preset was measured; the emberformer config describes the GPU model (d_model 128, 6 layers)."""
    folder, _, _ = swept
    dry = in_folder(folder, "apply", "1", "--dry-run")  # a trial by number: on a busy machine best can be none
    assert dry.exit_code == 0, dry.output
    assert "warning: config.yaml describes model.d_model 128, model.layers 6" in dry.stderr
    assert "but preset tiny measured d_model 32, layers 1" in dry.stderr
    html = in_folder(folder, "report", "--format", "html", "--out", folder / "r.html")
    assert html.exit_code == 0, html.output
    page = (folder / "r.html").read_text()
    assert "measured: emberformer preset tiny on " in page and 'class="size-warning"' in page
    table = " ".join(in_folder(folder, "report").output.split())  # the terminal warns as the page does
    assert "warning: config.yaml describes model.d_model 128, model.layers 6" in table


def test_no_size_warning_when_the_target_matches_what_was_measured(project):
    (project / "examples" / "config.yaml").write_text(
        "model:\n  d_model: 32   # the tiny preset's size\n  layers: 1\n  activation_checkpointing: false\n"
        "  compile: false\ndata_loader:\n  batch_size: 8\noptimizer:\n  lr: 0.001\n"
        "trainer:\n  precision: 32-true\n  accumulate_grad_batches: 1\n")
    spec = write_spec(project, trials=1)
    assert bench("sweep", spec, "--device", "cpu").exit_code == 0
    dry = bench("apply", "best", "--dry-run")
    noisy = dry.exit_code == 2 and "noisy: their timed windows disagree" in dry.output  # a loaded machine: nothing to apply
    # a loaded machine may add its noise warning; the size warning ("describes ..., but ... measured") never
    assert (dry.exit_code == 0 or noisy) and "describes" not in dry.stderr, dry.output


def table_lines(output: str, rows: list[dict]) -> dict[int, str]:
    """Each trial's line of the terminal table, by trial number."""
    lines = {}
    for line in output.splitlines():
        first = line.split()[0] if line.split() else ""
        if re.fullmatch(r"\d+", first) and int(first) in {r["number"] for r in rows} and int(first) not in lines:
            lines[int(first)] = line
    return lines


@pytest.mark.parametrize("columns", ["80", None])  # an 80-column terminal; piped (CliRunner is not a tty)
def test_report_fits_the_terminal_and_never_cuts_a_number(swept, monkeypatch, columns):
    folder, _, _ = swept
    if columns:
        monkeypatch.setenv("COLUMNS", columns)
    else:
        monkeypatch.delenv("COLUMNS", raising=False)
    table = in_folder(folder, "report")
    rows = json.loads(in_folder(folder, "report", "--format", "json").output)
    assert table.exit_code == 0 and "…" not in table.output
    assert max(len(line) for line in table.output.splitlines()) <= 80
    lines = table_lines(table.output, rows)
    for r in rows:
        cells = lines[r["number"]].split()
        shown = f"{r['speed']['value']:.1f}" if r["speed"] else "-"  # the figure the choice was made on
        assert str(r["config"]["batch_size"]) in cells and shown in cells
        # peaks under 1 GiB are shown in MiB; the highest over the trial's runs (`peak`), which a confirmation
        # run may raise above the trial's own (`peak_memory`): a CI run failed on 54.8 against the shown 55.x
        assert f"{r['peak'] / 1024**2:.1f}" in cells
    # the legend breaks between its entries: "! loss rose beyond" / "chance" read as two of them
    legend = table.output[table.output.index("★ best"):table.output.index("1024² bytes")]
    for entry, marked in (("! loss rose beyond chance", any(r["unsafe"] for r in rows)),
                          ("noisy: windows disagree, not ranked", any(r["noisy"] for r in rows)),
                          ("GiB = 1024³ bytes, MiB", True)):
        assert any(entry in line for line in legend.splitlines()) == marked, legend
    wide = in_folder(folder, "report", "--wide")
    assert "checkpointing" in wide.output and "% mem" in wide.output


@pytest.mark.parametrize("cv, loss_rose", [(0.01, False), (0.9, False), (0.01, True)])
def test_the_legend_names_only_the_marks_a_row_bears(cv, loss_rose):
    """"! loss rose beyond chance" and "noisy" were in every legend, beside tables no row of which bore them."""
    from harness.report._terminal import legend

    def ok(number, speed):
        return {"number": number, "status": "ok", "config": {"batch_size": 8 << number}, "throughput": speed,
                "peak_memory": 1 << 30, "busy": None, "baseline": number == 0, "error": None,
                "timing": {"step_s": {"cv": cv if number else 0.01, "median": 0.1}},
                "loss": {"first": 2.0, "last": 3.0 if loss_rose and number else 1.9, "scatter": 0.01}}
    choice = report.annotate([ok(0, 100.0), ok(1, 200.0)], {"name": "marks"})
    text = legend(choice, shows_runs=False)
    assert ("noisy: windows disagree" in text) == (cv > 0.5)
    assert any(s.unsafe for s in choice.rows) == loss_rose  # the rows are as staged
    assert ("! loss rose beyond chance" in text) == loss_rose
    assert "★ best" in text and "GiB = 1024³ bytes" in text


@pytest.mark.parametrize("columns", ["0", "1"])
def test_a_terminal_narrower_than_any_table_gets_the_narrowest_one(swept, monkeypatch, columns):
    folder, _, _ = swept
    monkeypatch.setenv("COLUMNS", columns)
    result = in_folder(folder, "report")
    lines = result.output.splitlines()
    assert result.exit_code == 0 and "best: trial" in result.output and 10 < len(lines) < 200, len(lines)
    assert max(map(len, lines)) <= 40


def test_narrow_table_abbreviates_and_drops_columns_but_keeps_every_number():
    import io
    from rich.console import Console
    from harness import pareto, report
    rows = [{"number": n, "status": "ok", "throughput": 123456.7 + n, "peak_memory": (70 + n) * 1024**3,
             "config": {"batch_size": 1024 * (n + 1), "accumulation": 16, "precision": "bf16-mixed",
                        "checkpointing": "selective", "compile": "max-autotune-no-cudagraphs", "num_workers": 8,
                        "seq_len": 4096 * (n + 1), "optimizer": "fused"},
             "timing": {"step_s": {"median": 0.1, "cv": 0.0123}}} for n in range(3)]
    choice = pareto.choose(rows, 80 * 1024**3, 0.1, "samples")
    for width in (40, 60, 80):  # every width fits: narrower tables drop columns, then become a line per trial
        buf = io.StringIO()
        Console(file=buf, width=width).print(report.table(choice, {"name": "x"}, width), crop=False)
        text = buf.getvalue()
        lines = table_lines(text, rows)
        assert "…" not in text and all(len(line) <= width for line in text.splitlines())
        for r in rows:
            assert str(r["config"]["batch_size"]) in lines[r["number"]].split()
            assert f"{r['throughput']:.1f}" in lines[r["number"]] and f"{r['peak_memory'] / 1024**3:.2f}" in lines[r["number"]]
        assert "same in every trial: accumulation=16" in text
    buf = io.StringIO()
    Console(file=buf, width=1 << 16, soft_wrap=True).print(report.table(choice, {"name": "x"}, None))
    assert "max-autotune-no-cudagraphs" in buf.getvalue() and "seq len" in buf.getvalue()


def test_an_empty_tier_says_nothing_fits_only_where_something_was_measured():
    """A study whose only trial was interrupted printed "safe  nothing fits": nothing had been measured."""
    from harness import pareto
    from harness.report import _terminal
    ok = {"number": 1, "status": "ok", "throughput": 100.0, "peak_memory": 900 * 1024**2,  # over the safe tier's 75%
          "config": {"batch_size": 8}, "timing": {"step_s": {"cv": 0.01}}}
    cases = {"nothing measured": [{"number": 0, "status": "interrupted", "config": {"batch_size": 8}}],
             "no run steady enough to rank": [dict(ok, timing={"step_s": {"cv": 0.9}})],
             "nothing fits": [ok]}
    for said, rows in cases.items():
        lines = _terminal.summary_lines(pareto.choose(rows, 1024**3, 0.1, "samples"), {"name": "x"})
        # tiers alike share a line: the 900 MiB trial fits only the aggressive tier's 95%
        alike = "safe, balanced" if said == "nothing fits" else "safe, balanced, aggressive"
        assert f"  {alike} {said}" in lines, (said, lines)
        assert ("  aggressive trial 1: 100.0 samples/s, peak 900.0 MiB" in lines) == (said == "nothing fits"), lines


def test_a_study_named_as_a_spec_with_scenarios_names_their_studies(tmp_path, monkeypatch):
    """`bench report sc` of a spec whose scenarios swept sc-roomy and sc-tight said only "no study 'sc'"."""
    monkeypatch.chdir(tmp_path)
    for name in ("sc-roomy", "sc-tight", "other"):
        (tmp_path / "results" / name).mkdir(parents=True)
        (tmp_path / "results" / name / "journal.log").write_text("")
    result = CliRunner().invoke(main, ["report", "sc"])
    assert result.exit_code == 2
    assert ("no study 'sc' under results/; its scenarios' studies are there: sc-roomy, sc-tight (name one, or add "
            "--scenario NAME)") in " ".join(result.output.split()), result.output


def test_a_study_without_trials_says_so():
    """A sweep stopped before its first trial: the summary's first line was "trials: " and nothing after it."""
    from harness import pareto
    from harness.report import _terminal
    assert _terminal.summary_lines(pareto.choose([], 1024**3, 0.1, "samples"), {"name": "x"})[0] == "trials: none yet"


@pytest.mark.parametrize("n_bytes, said", [(2**30 - 1, "1.00 GiB"), (1023.9 * 2**20, "1023.9 MiB"), (2**30, "1.00 GiB"),
                                            (90 * 2**20, "90.0 MiB"), (None, "-")])
def test_a_size_just_under_a_gib_is_not_shown_as_1024_mib(n_bytes, said):
    from harness.units import size
    assert size(n_bytes) == said


def test_the_next_step_after_an_interrupted_sweep_is_to_resume_it():
    """A sweep preempted after your config's trial: the report said "keep your config: no config measured is
    chosen over it; to look further, widen the search space". Once the interrupted config has run since, it
    is no longer the next step."""
    def row(number, status, batch):
        return {"number": number, "status": status, "config": {"batch_size": batch}, "baseline": number == 0,
                "throughput": 100.0 * batch if status == "ok" else None, "peak_memory": 2**20 if status == "ok" else None,
                "timing": {"step_s": {"cv": 0.01}}}
    stopped = [row(0, "ok", 8), row(1, "interrupted", 16), row(2, "interrupted", 32)]
    said = report.next_step(report.annotate(stopped, {"name": "x"}))
    assert said == ("the sweep was stopped before it ended (2 trials interrupted and not measured since, #1 first): "
                    "run the same `bench sweep` to resume; they run again")
    resumed = stopped + [row(3, "ok", 16), row(4, "ok", 32)]
    assert "stopped" not in report.next_step(report.annotate(resumed, {"name": "x"}))


def test_a_skip_inferred_from_one_trial_says_trial():
    from harness import pareto
    from harness.report import _terminal
    oom = {"number": 0, "status": "oom", "config": {"batch_size": 8}}
    skipped = {"number": 1, "status": "skipped", "config": {"batch_size": 16},
               "skip": {"reason": "a smaller batch of its family ran out of memory", "from": [0]}}
    lines = _terminal.watch_lines(pareto.choose([oom, skipped], 1024**3, 0.1, "samples"))
    assert any("(inferred from trial 0); not measured" in line for line in lines), lines


def test_a_line_per_trial_has_one_word_under_each_name():
    """Empty cells were left out and "peak MiB" named two: under "# marks batch", trial 1 (no marks)
    showed its batch as the marks and its precision as the batch."""
    from harness import pareto
    from harness.report import _terminal
    rows = [{"number": n, "status": "ok", "throughput": 100.0 - n, "peak_memory": (50 + 5 * n) * 1024**2,
             "config": {"batch_size": 8, "precision": p}, "timing": {"step_s": {"cv": 0.01}}}
            for n, p in enumerate(("fp32", "bf16-mixed"))]
    choice = pareto.choose(rows, None, 0.1, "samples")
    head, *lines = _terminal.as_lines(_terminal.columns_for(choice), choice.rows)
    names = head.split()[1:]
    assert "peak_MiB" in names and all(len(line.split()) == len(names) for line in lines), (head, lines)
    assert dict(zip(names, lines[1].split()))["marks"] == "-"


def test_a_failed_trials_progress_line_is_one_line_whatever_its_error_message():
    """A CPU OOM raised in C++ ends its message with a newline, which left an empty line in the output."""
    from harness import live
    rec = {"status": "oom", "error": {"type": "MemoryError", "message": "MemoryError: std::bad_alloc\n"}}
    assert live.outcome(rec) == "oom: MemoryError: std::bad_alloc"
    assert live.outcome(rec, budget=24 * 2**30) == "oom under the 24.00 GiB budget: MemoryError: std::bad_alloc"



def test_a_long_error_in_the_progress_line_is_cut_at_a_word_and_says_so():
    """Cut at 160 characters mid-phrase ("...memory filled in"), with nothing to say the rest is in the log."""
    from harness import live
    long = "RuntimeError: " + " ".join(f"word{i}" for i in range(60))
    said = live.outcome({"status": "error", "error": {"type": "RuntimeError", "message": long}})
    assert said.endswith(" …") and len(said) <= len("error: ") + 162
    assert said.removesuffix(" …").split()[-1] in long.split()  # a whole word last


@pytest.mark.parametrize("batch", [32, 16_000_000])  # under --set's 2**24, which refuses before any trial
def test_a_batch_larger_than_the_dataset_fails_at_once_and_says_so(project, batch):
    """The loader drops a partial batch, so a batch over the dataset yields none: the first step once
    looped over empty passes until the trial's timeout (the 512-sample tiny preset at batch 576). And
    the reference pass, before any step, built a batch of that many samples from a synthetic dataset
    that answers any index (`--set batch_size=100000000` ran on until the timeout)."""
    spec = write_spec(project, workload={"name": "emberformer", "preset": "tiny", "params": {"samples": 16}})
    result = bench("trial", spec, "--set", f"batch_size={batch}", "--device", "cpu", "--timeout", "60s")
    assert result.exit_code == 1, result.output  # a trial that failed
    record = json.loads(result.stdout)
    assert record["status"] == "error" and record["error"]["type"] == "BatchOverDataset", record
    assert f"batch_size {batch} is more than the dataset's 16 samples" in record["error"]["message"]
    assert record["error"]["dataset_samples"] == 16  # the search's bound: no batch over it is proposed again
    assert record["timing"]["trial_wall_s"] < 30  # not the timeout
    # a failed trial says why on stderr too, not only inside the JSON (it exited 1 silently)
    assert f"error: batch_size {batch} is more than" in result.stderr.splitlines()[-1], result.stderr


def test_a_trials_progress_line_is_in_the_objectives_unit():
    """With objective: tokens the trial lines said samples/s and "best so far" said tokens/s."""
    from harness import live
    rec = {"status": "ok", "throughput": 12.5, "tokens_per_s": {"median": 1600.0}, "peak_memory": 2**20,
           "timing": {"step_s": {"cv": 0.01}, "trial_wall_s": 3}}
    assert live.outcome(rec, "tokens").startswith("ok: 1600.0 tokens/s, peak 1.0 MiB")
    assert live.outcome(rec).startswith("ok: 12.5 samples/s")


def test_a_quick_smoke_run_compiles_nothing_and_keeps_a_fixed_compile(tmp_path, monkeypatch):
    """BENCH_QUICK's second trial was a cold compile (54 s of the README walk's 59 s quickstart): a smoke
    run leaves a searched compile out, but not a compile the spec pins."""
    from harness import cli, spec as specs
    from tests.conftest import ROOT
    monkeypatch.setenv("BENCH_QUICK", "2")
    searched = specs.load(ROOT / "sweeps" / "emberformer.yaml")
    assert len(searched.search["compile"].choices) > 1
    quick = cli.quick(searched)
    assert quick.search["compile"].choices == ("off",) and quick.trials == 2
    assert quick.workload["preset"] == "tiny" and quick.measure.max_seconds == 1.0
    pinned = tmp_path / "pinned.yaml"
    pinned.write_text((ROOT / "sweeps" / "emberformer.yaml").read_text().replace("compile: [off, default]",
                                                                                 "compile: [default]"))
    assert cli.quick(specs.load(pinned)).fixed["compile"] == "default"


# Each command's --help names its values as the README's Commands section does (`--scenario NAME`,
# `--device auto|cpu|cuda|cuda:N`), not click's generic TEXT.
@pytest.mark.parametrize("command", ["sweep", "trial", "report", "apply"])
def test_help_names_scenario_and_device_values_as_the_readme_does(command):
    text = CliRunner().invoke(main, [command, "--help"], terminal_width=200).output
    assert "TEXT" not in text, text
    assert "--scenario NAME" in text
    if command in ("sweep", "trial"):
        assert "--device auto|cpu|cuda|cuda:N" in text


def test_a_sweep_that_ends_on_its_cap_says_to_raise_it_not_to_widen_the_search(tmp_path, monkeypatch, faulty_path):
    """`trials: 1` over four batch sizes measured your config alone, and the report said "keep your config: no
    config measured is chosen over it; to look further, widen the search space": the space was not searched.
    The search's model counts the configs `--trials auto` would still measure; the next step is to raise the
    cap, and a resume with a larger one measures them."""
    from harness import busy
    from tests.conftest import FAST_TRIAL, faulty_spec
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(busy, "now", lambda *args, **kwargs: None)  # not the subject: a busy run says "when quiet"
    monkeypatch.setattr(busy, "verdict", lambda *args, **kwargs: None)
    steady = {"factory": "faulty:build", "params": {"fault": "none", "steady_ms": 20}}  # a sleep: speed grows with batch
    path = faulty_spec(tmp_path, "capped", ["none"], sampler="tpe", trials=1, workload=steady,
                       search={"batch_size": [8, 16, 32, 64]}, trial=dict(FAST_TRIAL))
    swept = bench("sweep", path, "--device", "cpu")
    assert swept.exit_code == 0, swept.output
    said = bench("report", "capped").stdout
    assert "ended on its trial cap with" in said and "widen the search space" not in said, said
    assert "ended on its trial cap with" in swept.stdout.splitlines()[-1], swept.stdout  # the sweep's last line too
    more = bench("sweep", path, "--device", "cpu", "--trials", "2")
    assert more.exit_code == 0, more.output
    rows = json.loads(bench("report", "capped", "--format", "json").stdout)
    assert len({r["config"]["batch_size"] for r in rows if r["status"] == "ok"}) == 2, rows


@pytest.mark.parametrize("model, capped", [
    ({"worth_measuring": 3, "rows": 1, "capped": True}, True),
    ({"worth_measuring": 3, "rows": 1, "capped": False}, False),  # it ended on its time limit, or its rule
    ({"worth_measuring": 3, "rows": 4, "capped": True}, False),  # kept by an earlier sweep: not these rows'
    ({"worth_measuring": 0, "rows": 1, "capped": True}, False),  # the cap and the rule ended it together
])
def test_the_cap_is_named_only_by_a_model_of_these_rows_that_ended_on_it(model, capped):
    rows = [{"number": 0, "status": "ok", "config": {"batch_size": 8}, "baseline": True, "throughput": 800.0,
             "peak_memory": 2**20, "timing": {"step_s": {"cv": 0.01}}}]
    said = report.next_step(report.annotate(rows, {"name": "x", "model": {"predicted": [], "why": None, **model}}))
    assert ("ended on its trial cap with 3 configs" in said) == capped, said
    assert ("widen the search space" in said) != capped, said
