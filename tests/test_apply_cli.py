"""`bench apply` through the CLI on a study with known trials: best, tiers, --budget, refusals."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from harness import ledger, spec as specs, storage as stores
from harness import study as studies
from harness.cli import main
from tests.conftest import tree_state, write_spec

GiB = 1024**3

# (batch_size, precision, samples/s, peak GiB, status) against a 10 GiB budget with 10% headroom.
KNOWN = [
    (8, "fp32", 100.0, 2.0, "ok"),          # baseline
    (16, "bf16-mixed", 300.0, 5.0, "ok"),   # safe (<= 7.5)
    (32, "bf16-mixed", 400.0, 8.0, "ok"),   # balanced (<= 8.5) and best (<= 9.0)
    (64, "bf16-mixed", 450.0, 9.3, "ok"),   # aggressive only (<= 9.5)
    (64, "fp32", 0.0, 10.0, "oom"),
    (32, "fp32", 500.0, 3.0, "diverged"),   # fastest, but broken: never chosen
]


@pytest.fixture
def known_study(project):
    return make_known_study(project)


def hydra_study(project: Path) -> tuple[Path, Path, bytes]:
    """A study whose apply target is the main config plus a Hydra profile under conf/hardware: that group
    folder, the main config, and the main config's bytes before any apply."""
    group = project / "conf" / "hardware"
    group.mkdir(parents=True)
    make_known_study(project, apply=HYDRA)
    target = project / "examples" / "config.yaml"
    return group, target, target.read_bytes()


def make_known_study(project, cvs=None, **spec_overrides):
    spec_path = write_spec(project, "known", memory={"budget": "10GiB", "headroom": 0.1},
                           search={"batch_size": [8, 16, 32, 64], "precision": ["fp32", "bf16-mixed"]},
                           **spec_overrides)
    spec = specs.load(spec_path)
    study = ledger.create(spec, stores.open_storage(None, project / "results", "known"), "cpu")
    sweep = studies.Sweep(spec, study, "cpu", project / "results", len(KNOWN), None)
    for i, (batch, precision, tput, peak, status) in enumerate(KNOWN):
        trial = study.ask({})
        config = spec.config({"batch_size": batch, "precision": precision})
        trial.set_user_attr("config", config)
        if i == 0:
            trial.set_user_attr("baseline", True)
        rec = {"status": status, "config": config, "throughput": tput or None, "peak_memory": int(peak * GiB),
               "timing": {"step_s": {"cv": (cvs or {}).get(i, 0.001), "median": batch / tput if tput else None}},
               "env": {"device": "Test GPU"}, "error": None, "number": trial.number}
        sweep.tell(trial, rec)
    return project


def apply(*args):
    return CliRunner().invoke(main, ["apply", *args], catch_exceptions=False)


def batch_in(project):
    return yaml.safe_load((project / "examples" / "config.yaml").read_text())["data_loader"]["batch_size"]


@pytest.mark.parametrize("which, batch", [("best", 32), ("safe", 16), ("balanced", 32), ("aggressive", 64), ("1", 16)])
def test_each_choice_writes_its_trial(known_study, which, batch):
    result = apply(which)
    assert result.exit_code == 0, result.output
    assert batch_in(known_study) == batch


def test_to_writes_the_copy_even_where_the_target_already_holds_the_choice(known_study):
    """After `apply best`, `apply best --to copy.yaml` exited 0, printed an empty diff and wrote nothing."""
    assert apply("best").exit_code == 0
    result = apply("best", "--to", "copy.yaml")
    assert result.exit_code == 0, result.output
    copy = known_study / "copy.yaml"
    assert copy.is_file() and f"wrote {copy}" in result.output
    assert yaml.safe_load(copy.read_text())["data_loader"]["batch_size"] == 32


def test_to_replaces_only_a_copy_apply_wrote_never_another_yaml_nor_the_target(known_study):
    """`--to` replaced any YAML (another study's spec, a config of yours) with the chosen config, and took
    the apply target itself, where it skips the Hydra profile an apply without --to writes."""
    other = known_study / "other-spec.yaml"
    other.write_text("study: other\nworkload: {preset: tiny}\n")
    target = known_study / "examples" / "config.yaml"
    before = {path: path.read_bytes() for path in (other, target)}
    for path, said in ((other, "bench apply did not write it"), (target, "that is the spec's apply target")):
        result = apply("best", "--to", str(path))
        assert result.exit_code == 2 and said in result.output, result.output
    assert {path: path.read_bytes() for path in before} == before
    assert list(known_study.rglob("*bench-backup*")) == []
    assert apply("best", "--to", "copy.yaml").exit_code == 0
    again = apply("best", "--to", "copy.yaml")  # the same copy again: it wrote it over itself, with a backup
    assert again.exit_code == 0 and "already holds these values; nothing written" in " ".join(again.output.split())
    assert list(known_study.rglob("*bench-backup*")) == []
    assert apply("1", "--to", "copy.yaml").exit_code == 0  # a copy apply wrote is apply's to replace: another trial's
    assert yaml.safe_load((known_study / "copy.yaml").read_text())["data_loader"]["batch_size"] != 32
    assert len(list(known_study.rglob("copy.yaml.bench-backup*"))) == 1


def test_budget_picks_the_best_that_fits_a_smaller_card(known_study):
    result = apply("--budget", "6GiB")
    assert result.exit_code == 0, result.output
    assert batch_in(known_study) == 16  # 5 GiB fits 6 GiB with 10% headroom; 8 GiB does not


@pytest.mark.parametrize("which, batch", [("best", 16), ("safe", 8), ("aggressive", 16)])
def test_budget_makes_the_named_choice_for_the_smaller_card(known_study, which, batch):
    # --budget took best whatever WHICH said: `safe --budget 8GiB` wrote best under 8 GiB
    result = apply(which, "--budget", "6GiB")
    assert result.exit_code == 0, result.output
    assert batch_in(known_study) == batch  # safe keeps 25% of 6 GiB free: only the 2 GiB baseline


def test_hydra_profile_is_planned_before_anything_is_written_and_carries_the_rescaled_lr(project):
    hydra = {"file": "examples/config.yaml", "preset": "lightning", "lr": {"key": "optimizer.lr"},
             "keys": {"batch_size": "data_loader.batch_size"}, "hydra": {"group_dir": "conf/hardware"}}
    make_known_study(project, apply=hydra)
    target = project / "examples" / "config.yaml"
    swept = target.read_text()
    # the main config would get trainer.precision created (--create-keys); the profile cannot override a
    # key the main config lacks, so it refuses: before, the main config was written first and stayed so
    target.write_text(swept.replace("  precision: 32-true      # 32-true | bf16-mixed | 16-mixed\n", ""))
    before = target.read_bytes()
    for flags in (["--create-keys"], []):  # without it, the refusal said "pass --create-keys", which it then refused
        result = CliRunner().invoke(main, ["apply", "best", *flags])
        assert result.exit_code == 2 and "trainer.precision" in result.output, result.output
        assert "--create-keys does not add it where apply.hydra is set" in result.output, result.output
        assert target.read_bytes() == before and not list(target.parent.glob("*.bench-backup-*"))
    target.write_text(swept)
    assert apply("best").exit_code == 0
    profile = yaml.safe_load((project / "conf" / "hardware" / "test-gpu.yaml").read_text())
    assert profile["data_loader"]["batch_size"] == 32 and profile["optimizer"]["lr"] == pytest.approx(1.2e-3)


def test_a_trial_named_by_number_whose_figure_is_not_one_to_act_on_is_written_with_a_warning(project):
    make_known_study(project, cvs={1: 1.54})
    result = CliRunner().invoke(main, ["apply", "1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "warning: trial 1: its windows disagree (154% CV): noisy, not ranked, not a measurement to act on" in result.output
    assert "warning: trial 2" not in CliRunner().invoke(main, ["apply", "2", "--dry-run"]).output
    # the header's line on your config says why it gives no ratio, on screen and in the file (it was left out)
    said = "vs your config as swept (trial 0): no ratio: trial 1 ran too noisy to compare (154% CV)"
    assert f"# bench apply: {said}" in result.output and said.replace("):", ")") in result.output


def test_apply_over_a_noisy_config_of_yours_says_in_the_header_why_there_is_no_ratio(project):
    make_known_study(project, cvs={0: 0.9})
    result = CliRunner().invoke(main, ["apply", "best", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "# bench apply: vs your config as swept (trial 0): no ratio: your config ran too noisy to compare (90% CV)" \
        in result.output


def test_refusals_change_nothing(known_study):
    target = known_study / "examples" / "config.yaml"
    before = target.read_bytes()
    for args in (["4"], ["5"], ["99"], ["--budget", "1GiB"], ["fastest"], ["1", "--budget", "9GiB"], ["--to", "typo/x.yaml"],
                 ["fastest", "--budget", "9GiB"], ["safe", "--budget", "2GiB"],
                 ["--budget", ""]):  # `--budget ''` wrote best, as if no budget were given
        result = CliRunner().invoke(main, ["apply", *args])
        assert result.exit_code == 2, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1, result.output
        assert target.read_bytes() == before
    assert not list(target.parent.glob("*.bench-backup-*")) and not (known_study / "typo").exists()


def test_an_apply_file_in_a_symlink_loop_is_refused_in_one_line(project):
    (project / "l1.yaml").symlink_to(project / "l2.yaml")
    (project / "l2.yaml").symlink_to(project / "l1.yaml")
    spec = write_spec(project, "loop", apply={"file": "l1.yaml", "preset": "lightning"})
    result = CliRunner().invoke(main, ["sweep", str(spec)])
    assert result.exit_code == 2 and "apply.file: cannot resolve l1.yaml" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_provenance_names_study_trial_and_measurement(known_study):
    assert apply("best").exit_code == 0
    text = (known_study / "examples" / "config.yaml").read_text()
    head = text.splitlines()[0]
    assert head.startswith("# bench apply:")
    block = "\n".join(line for line in text.splitlines() if line.startswith("# bench apply:"))
    assert "from study known trial 2" in block
    assert "measured on Test GPU, 400.0 samples/s, peak memory 8.00 GiB" in block


def test_report_marks_the_known_choice(known_study):
    result = CliRunner().invoke(main, ["report", "--format", "json"])
    rows = {r["number"]: r for r in json.loads(result.output)}
    assert rows[2]["best"] and rows[2]["tier"] == "balanced"
    assert rows[1]["tier"] == "safe" and rows[3]["tier"] == "aggressive"
    assert not rows[5]["pareto"] and not rows[5]["best"]
    assert rows[0]["baseline"]


def test_hydra_group_gets_a_profile_named_after_the_measured_device(project):
    (project / "conf" / "hardware").mkdir(parents=True)
    make_known_study(project, apply={"file": "examples/config.yaml", "preset": "lightning",
                                     "keys": {"batch_size": "data_loader.batch_size"},
                                     "hydra": {"group_dir": "conf/hardware"}})
    result = apply("best")
    assert result.exit_code == 0, result.output
    profile = project / "conf" / "hardware" / "test-gpu.yaml"
    assert profile.exists(), result.output
    text = profile.read_text()
    assert text.startswith("# @package _global_")
    assert yaml.safe_load(text)["data_loader"]["batch_size"] == 32


HYDRA = {"file": "examples/config.yaml", "preset": "lightning", "keys": {"batch_size": "data_loader.batch_size"},
         "hydra": {"group_dir": "conf/hardware"}}


@pytest.mark.parametrize("defaults, warned", [
    ("  - hardware: default\n  - _self_\n", "its defaults list has hardware before _self_"),
    ("  - override /hardware@_global_: default\n", "its defaults list has hardware and no _self_"),
    ("  - _self_\n  - hardware: default\n", None),
])
def test_a_defaults_list_that_composes_the_profile_before_the_config_is_warned_of(project, defaults, warned):
    """Hydra 1.1 and later let the main config override what its defaults list composed before `_self_`:
    the profile bench wrote changed nothing, and apply said nothing of it."""
    (project / "conf" / "hardware").mkdir(parents=True)
    make_known_study(project, apply=HYDRA)
    config = project / "examples" / "config.yaml"
    config.write_text("defaults:\n" + defaults + config.read_text())
    result = apply("best", "--dry-run")
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "defaults list" in line]
    if warned is None:
        assert said == [], said
    else:
        assert len(said) == 1 and warned in said[0] and "put `- _self_` above `- hardware: ...`" in said[0], said


def test_a_read_only_hydra_group_is_refused_before_the_main_config_is_written(project):
    """The main config was written (with a backup), then the profile refused: exit 2 with a changed file."""
    group, target, before = hydra_study(project)
    group.chmod(0o555)
    try:
        result = apply("best")
    finally:
        group.chmod(0o755)
    assert result.exit_code == 2 and "conf/hardware: the folder is read-only" in result.output, result.output
    assert "wrote" not in result.output, result.output
    assert target.read_bytes() == before and not list(target.parent.glob("*.bench-backup-*"))
    assert not list(group.iterdir())


def test_a_read_only_config_is_refused_in_one_line_without_its_diff(known_study):
    """The whole diff was printed, then the refusal: the promised one line came last of forty."""
    target = known_study / "examples" / "config.yaml"
    target.chmod(0o444)
    try:
        result = apply("best")
        dry = apply("best", "--dry-run")  # a dry run changes nothing: its diff is what it is for
    finally:
        target.chmod(0o644)
    assert result.exit_code == 2 and "the file is read-only" in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert dry.exit_code == 0 and "@@" in dry.output


@pytest.mark.parametrize("fault", ["full disk", "ctrl-c"])
def test_a_profile_that_cannot_be_written_puts_the_main_config_back(project, monkeypatch, fault):
    """A full disk under the profile's write, after the main config was written: exit 2 said the profile
    was unchanged, and config.yaml held the new batch size with no profile to match it. Then only a failed
    write put it back: Ctrl-C between the two left them disagreeing."""
    import errno
    from harness.apply import _write
    group, target, before = hydra_study(project)
    real = _write._atomic_write

    def fails_in_the_group(path, *args, **kwargs):
        if Path(path).parent == group:
            raise OSError(errno.ENOSPC, "No space left on device") if fault == "full disk" else KeyboardInterrupt()
        return real(path, *args, **kwargs)

    monkeypatch.setattr(_write, "_atomic_write", fails_in_the_group)
    result = CliRunner().invoke(main, ["apply", "best"])
    said = " ".join(result.output.split())
    if fault == "full disk":
        assert result.exit_code == 2, result.output
        assert "test-gpu.yaml: could not write it (No space left on device)" in said, said
        assert f"{target} is put back as it was" in said and "wrote" not in said, said
    else:
        assert result.exit_code == 130 and said.endswith("interrupted: the command stopped"), said
    assert target.read_bytes() == before and not list(target.parent.glob("*.bench-backup-*"))
    assert not list(group.iterdir())


def test_a_deepspeed_auto_at_an_accumulation_derived_from_effective_batch_is_refused_before_the_sweep(project):
    """Only searched and fixed knobs were checked before the sweep: the accumulation an effective_batch derives,
    written by apply, met its "auto" hours later."""
    ds = project / "ds.json"
    ds.write_text(json.dumps({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": "auto",
                              "bf16": {"enabled": False}}, indent=2))
    spec = write_spec(project, "ds", search={"batch_size": [4, 8], "accumulation": {"effective_batch": 8}},
                      apply={"file": "ds.json", "preset": "deepspeed"})
    result = CliRunner().invoke(main, ["sweep", str(spec), "--device", "cpu"])
    assert result.exit_code == 2 and 'gradient_accumulation_steps is "auto", which the HF Trainer fills' in result.output
    assert not (project / "results" / "ds").exists()


def test_a_profile_out_of_step_is_written_where_the_main_config_already_holds_best(project):
    """After an apply, a profile edited back to batch 4 (or deleted) was left so: "nothing to change:
    config.yaml already holds these values", while `hardware=test-gpu` overrode it with batch 4."""
    group = project / "conf" / "hardware"
    group.mkdir(parents=True)
    make_known_study(project, apply=HYDRA)
    assert apply("best").exit_code == 0
    target, profile = project / "examples" / "config.yaml", group / "test-gpu.yaml"
    main_after = target.read_bytes()
    assert "nothing to change" in " ".join(apply("best").output.split())  # both hold best: nothing written
    profile.write_text(profile.read_text().replace("batch_size: 32", "batch_size: 4"))
    for undo in ("edited back", "deleted"):
        result = apply("best")
        said = " ".join(result.output.split())
        assert result.exit_code == 0, result.output
        assert "already holds these values; its hardware profile does not" in said, said
        assert f"wrote hardware profile {profile}" in said and f"wrote {target}" not in said, said
        assert yaml.safe_load(profile.read_text())["data_loader"]["batch_size"] == 32, undo
        assert target.read_bytes() == main_after
        profile.unlink()


def test_to_leaves_the_hydra_group_alone(project, tmp_path_factory):
    """`--to` wrote the copy elsewhere but still wrote (or replaced) the project's conf/hardware/<device>.yaml."""
    make_known_study(project, apply=HYDRA)
    copy = tmp_path_factory.mktemp("out") / "out.yaml"
    result = apply("best", "--to", str(copy))
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(copy.read_text())["data_loader"]["batch_size"] == 32
    assert not (project / "conf").exists() and [p.name for p in copy.parent.iterdir()] == ["out.yaml"]
    assert f"hardware profile {project / 'conf' / 'hardware' / 'test-gpu.yaml'} not written: --to leaves the project " \
           "alone" in result.output, result.output


def test_apply_from_another_checkout_finds_the_spec_relative_to_it(known_study, tmp_path_factory, monkeypatch):
    """Another machine has the project elsewhere: the sweeping machine's absolute spec path is not there."""
    elsewhere = tmp_path_factory.mktemp("other-machine") / "project"
    known_study.rename(elsewhere)
    monkeypatch.chdir(elsewhere)
    result = apply("best")
    assert result.exit_code == 0, result.output
    assert batch_in(elsewhere) == 32


def test_apply_from_a_copy_of_the_project_writes_the_copy_and_leaves_the_original_alone(known_study, tmp_path_factory,
                                                                                      monkeypatch):
    """The sweeping folder still existed, so its absolute spec path won and the original's config was written."""
    import shutil
    copy = tmp_path_factory.mktemp("copy") / "project"
    shutil.copytree(known_study, copy)
    before = batch_in(known_study)
    monkeypatch.chdir(copy)
    result = apply("best")
    assert result.exit_code == 0, result.output
    assert batch_in(copy) == 32 and batch_in(known_study) == before


def test_apply_from_another_project_with_the_same_spec_name_writes_the_swept_project(known_study, tmp_path_factory,
                                                                                      monkeypatch):
    """Read through --results from another project whose spec has the same relative path: the study's
    own project is written, not the one the command happens to run in."""
    import shutil
    other = tmp_path_factory.mktemp("other") / "project"
    (other / "examples").mkdir(parents=True)
    shutil.copy(known_study / "known.yaml", other / "known.yaml")
    shutil.copy(known_study / "examples" / "config.yaml", other / "examples" / "config.yaml")
    before = batch_in(other)
    monkeypatch.chdir(other)
    result = apply("best", "--results", str(known_study / "results"))
    assert result.exit_code == 0, result.output
    assert batch_in(known_study) == 32 and batch_in(other) == before


def test_report_of_a_study_bench_did_not_make_is_shown_without_a_spec(tmp_path, monkeypatch):
    import optuna
    monkeypatch.chdir(tmp_path)
    url = f"sqlite:///{tmp_path / 'plain.db'}"
    optuna.create_study(study_name="plain", storage=url).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=1)
    page = CliRunner().invoke(main, ["report", "plain", "--storage", url, "--format", "html", "--out",
                                     str(tmp_path / "r.html")])
    assert page.exit_code == 0, page.output
    refused = apply("best", "--study", "plain", "--storage", url)
    assert refused.exit_code == 2 and "names no spec" in refused.output


def test_apply_through_results_of_a_copy_writes_the_copy(known_study, tmp_path_factory, monkeypatch):
    """Standing elsewhere with --results at a copy of the project: the original's spec won while it existed."""
    import shutil
    copy = tmp_path_factory.mktemp("copy2") / "project"
    shutil.copytree(known_study, copy)
    before = batch_in(known_study)
    monkeypatch.chdir(tmp_path_factory.mktemp("elsewhere"))
    result = apply("best", "--results", str(copy / "results"))
    assert result.exit_code == 0, result.output
    assert batch_in(copy) == 32 and batch_in(known_study) == before
    out = CliRunner().invoke(main, ["report", "--results", str(copy / "results"), "--out", str(copy / "known.yaml")])
    assert out.exit_code == 2 and "the study's spec" in out.output


def test_report_out_refuses_the_hydra_config_group_apply_writes(project):
    """A report written into conf/hardware/ becomes a Hydra option (or replaces a device's profile)."""
    make_known_study(project, apply={"file": "examples/config.yaml", "preset": "lightning",
                                     "hydra": {"group_dir": "conf/hardware"}})
    group = project / "conf" / "hardware"
    group.mkdir(parents=True)
    (group / "cpu.yaml").write_text("# @package _global_\nbatch_size: 8\n")
    result = CliRunner().invoke(main, ["report", "--format", "json", "--out", str(group / "cpu.yaml")])
    assert result.exit_code == 2 and "Hydra config group" in result.output, result.output
    assert (group / "cpu.yaml").read_text() == "# @package _global_\nbatch_size: 8\n"
    assert list(group.iterdir()) == [group / "cpu.yaml"]


@pytest.mark.parametrize("command", [["report", "known", "--format", "csv", "--out"], ["apply", "best", "--to"]])
def test_an_empty_file_name_is_said_to_be_empty(known_study, command):
    """`--to ''` was said as "--to .: a folder, not a file": click reads an empty name as the current folder."""
    before = tree_state(known_study)
    out = CliRunner().invoke(main, [*command, ""])
    assert out.exit_code == 2 and f"'' is empty; name a file, or leave {command[-1]} out" in out.output, out.output
    assert tree_state(known_study) == before


def test_report_out_refuses_another_studys_files_a_backup_and_a_file_that_is_not_a_report(known_study):
    """Each was overwritten with exit 0: another study's journal (its measurements gone), the only
    backup of the user's config, another spec; and a typo'd folder was made from the root down."""
    other = known_study / "results" / "other"
    other.mkdir()
    (other / "journal.log").write_bytes(b"another study's measurements")
    backup = known_study / "examples" / "config.yaml.bench-backup-20261125-101010"
    backup.write_text("data_loader:\n  batch_size: 8\n")
    (known_study / "other.yaml").write_text("study: other\n")
    refused = {other / "journal.log": "inside study other's folder", other / "summary.csv": "inside study other's folder",
               backup: "a backup bench apply made", known_study / "other.yaml": "not a report",
               known_study / "no" / "such" / "r.csv": "folder"}
    for target, said in refused.items():
        before = target.read_bytes() if target.exists() else None
        out = CliRunner().invoke(main, ["report", "known", "--format", "csv", "--out", str(target)])
        assert out.exit_code == 2 and said in out.output and "Traceback" not in out.output, (target, out.output)
        assert (target.read_bytes() if target.exists() else None) == before
    assert not (known_study / "no").exists() and not (other / "summary.csv").exists()
    for _ in range(2):  # a report replaces a report
        out = CliRunner().invoke(main, ["report", "known", "--format", "csv", "--out", "known.csv"])
        assert out.exit_code == 0, out.output
    assert (known_study / "known.csv").read_text().startswith("number,")
    out = CliRunner().invoke(main, ["apply", "best", "--study", "known", "--to", str(backup)])
    assert out.exit_code == 2 and "a backup bench apply made" in out.output
    assert backup.read_text() == "data_loader:\n  batch_size: 8\n"


@pytest.mark.parametrize("both", [False, True], ids=["stdout", "stdout-and-stderr"])
@pytest.mark.parametrize("command", [["apply", "best"], ["report"]])
def test_a_reader_that_leaves_before_the_output_does_not_stop_the_command(known_study, command, both):
    """`bench apply best | head -1`: the apply still writes its file and exits 0, with no traceback. With
    `2>&1 | head -1` apply's warning (the stale comment) went first, failed, and it exited 1 unwritten."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before bench writes its first line: every write to stdout fails
    try:
        proc = subprocess.run([sys.executable, "-m", "harness", *command], stdout=write,
                              stderr=write if both else subprocess.PIPE, text=True, cwd=known_study, timeout=300)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert not both or proc.stderr is None
    assert both or ("Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr), proc.stderr
    assert batch_in(known_study) == (32 if command[0] == "apply" else 8)


@pytest.mark.parametrize("command", [["apply", "best"], ["report"]])
def test_an_output_that_cannot_be_written_is_said_in_one_line_and_the_command_runs_on(known_study, command):
    """`bench apply best > out.log` on a full disk: a traceback, exit 1, and the config not written."""
    with open("/dev/full", "w") as full:
        proc = subprocess.run([sys.executable, "-m", "harness", *command], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=known_study, timeout=300)
    assert proc.returncode == 2, proc.stderr
    said = [line for line in proc.stderr.splitlines() if not line.startswith("warning:")]  # apply's stale comment
    assert said == ["bench: cannot write its output (No space left on device); the rest of it is dropped "
                    "and the command runs on"], proc.stderr
    assert batch_in(known_study) == (32 if command[0] == "apply" else 8)


def test_a_held_knob_edited_since_the_sweep_is_written_back_as_measured_and_said(known_study):
    """Your checkpointing (not searched) ran in every trial as your file had it; edited afterwards, apply
    best wrote the measured value back and said nothing."""
    config = known_study / "examples" / "config.yaml"
    config.write_text(config.read_text().replace("activation_checkpointing: false", "activation_checkpointing: true"))
    out = CliRunner().invoke(main, ["apply", "best"])
    assert out.exit_code == 0, out.output
    assert ("config.yaml: checkpointing is full now, but the sweep did not search it and every trial ran none, "
            "which this writes back as measured") in out.output
    assert yaml.safe_load(config.read_text())["model"]["activation_checkpointing"] is False


def test_apply_from_a_copy_without_the_spec_says_it_writes_the_original_project(known_study, tmp_path_factory):
    """A copy of a project whose spec was renamed: apply fell back to the spec where it was swept and
    rewrote the original project's config, saying nothing."""
    import shutil
    copy = tmp_path_factory.mktemp("copy") / "project"
    shutil.copytree(known_study, copy)
    (copy / "known.yaml").rename(copy / "tune.yaml")
    os.chdir(copy)
    out = CliRunner().invoke(main, ["apply", "best", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert (f"the spec is not at {copy / 'known.yaml'}; using {known_study / 'known.yaml'}, where the study was "
            f"swept, so this writes {known_study / 'examples' / 'config.yaml'}, outside {copy}") in out.output
    os.chdir(known_study)
    assert "the spec is not at" not in CliRunner().invoke(main, ["apply", "best", "--dry-run"]).output


def test_a_spec_found_in_its_project_whose_target_lies_outside_it_gives_no_warning(known_study, tmp_path_factory):
    """`file: ../real/args.json` (or a symlink out of the project) warned "the spec is not at X; using X, where
    the study was swept": the spec was where it was swept, and the target outside is the spec's own choice."""
    import shutil
    outside = tmp_path_factory.mktemp("real") / "config.yaml"
    shutil.copyfile(known_study / "examples" / "config.yaml", outside)
    spec = known_study / "known.yaml"
    spec.write_text(spec.read_text().replace("examples/config.yaml", str(outside)))
    out = CliRunner().invoke(main, ["apply", "best", "--dry-run"])
    assert out.exit_code == 0 and str(outside) in out.output and "the spec is not at" not in out.output, out.output


def test_a_study_named_by_its_folder_is_the_study(known_study):
    """`bench report results/known` (what tab completion gives) was "not a plain name"."""
    for name in ("results/known", "./results/known/", str(known_study / "results" / "known")):
        shown = CliRunner().invoke(main, ["report", name, "--format", "json"])
        assert shown.exit_code == 0 and json.loads(shown.output), (name, shown.output)
    out = CliRunner().invoke(main, ["apply", "best", "--study", "results/known", "--dry-run"])
    assert out.exit_code == 0, out.output
