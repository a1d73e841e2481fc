"""bench apply: key maps, presets, in-place edits, provenance, backups and refusals, on real files."""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml
from ruamel.yaml import YAML

from harness import apply
from harness.errors import UserError
from harness.apply import (PROVENANCE_MARK, parse_apply_section, plan, read_current, write,
                           write_hydra_profile)
from harness.apply import _write
from harness.apply._plan import _provenance_lines

DATA = Path(__file__).parent / "data" / "apply"
PROVENANCE = {"study": "emberformer", "trial": 17, "device": "NVIDIA H200", "throughput": 1234.5,
              "peak_memory": 12 * 1024**3, "date": "2025-06-01", "bench_version": "0.1.0"}


# ---------------------------------------------------------------------------------------------
# helpers


def copy(name: str, folder: Path) -> Path:
    target = folder / name
    shutil.copyfile(DATA / name, target)
    return target


def target_for(file: Path, **section) -> apply.ApplyTarget:
    return parse_apply_section({"file": file.name, **section}, file.parent, "sweeps/test.yaml")


def load(text: str, fmt: str = "yaml"):
    return json.loads(text) if fmt == "json" else YAML(typ="safe", pure=True).load(text)


def without(data, dotted_keys):
    """Deep copy of data with the dotted keys removed."""
    data = json.loads(json.dumps(data))
    for dotted in dotted_keys:
        *parents, last = dotted.split(".")
        node = data
        for part in parents:
            node = node[part]
        node.pop(last, None)
    return data


def body(text: str) -> list[str]:
    """The lines of a file without bench's provenance block."""
    return [line for line in text.splitlines() if not line.startswith(PROVENANCE_MARK)]


def assert_only_keys_changed(old: str, new: str, keys: set[str], fmt: str = "yaml"):
    """Same parsed data apart from `keys`; every line that does not hold one of them is unchanged;
    every comment is still there."""
    assert without(load(old, fmt), keys) == without(load(new, fmt), keys)
    old_lines, new_lines = body(old), body(new)
    assert len(old_lines) == len(new_lines)
    leaves = {k.split(".")[-1] for k in keys}
    for before, after in zip(old_lines, new_lines):
        if before != after:
            assert before.strip().lstrip('"').split(":")[0].strip('"') in leaves, (before, after)
    for line in old.splitlines():
        if "#" in line:
            comment = line[line.index("#"):]
            assert any(comment in n for n in new.splitlines()), comment


def files_in(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


# ---------------------------------------------------------------------------------------------
# presets applied to real-looking configs


def test_lightning_preset_changes_only_the_mapped_keys_and_keeps_every_comment(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    old = file.read_text()
    p = plan(target_for(file, preset="lightning"),
             {"batch_size": 64, "accumulation": 2, "precision": "bf16-mixed", "compile": "default"}, PROVENANCE)
    write(p)
    new = file.read_text()
    keys = {"data.batch_size", "trainer.accumulate_grad_batches", "trainer.precision"}
    assert_only_keys_changed(old, new, keys)
    data = load(new)
    assert data["data"]["batch_size"] == 64
    assert data["trainer"]["accumulate_grad_batches"] == 2
    assert data["trainer"]["precision"] == "bf16-mixed"
    assert p.unmapped == ["compile"]  # Lightning's trainer has no compile key: reported, not guessed
    assert sorted(k for k, _, _ in p.changes) == sorted(keys)
    # the end-of-line comment stays in its column, the quotes and flow styles elsewhere stay as they were
    old_line = next(line for line in old.splitlines() if "precision:" in line)
    new_line = next(line for line in new.splitlines() if "precision:" in line)
    assert new_line.startswith("  precision: bf16-mixed ") and new_line.index("#") == old_line.index("#")
    assert "init_args: {save_dir: \"logs/\", name: 'emberformer'}" in new


def test_hf_preset_spreads_precision_over_booleans_and_compile_over_two_keys(tmp_path):
    file = copy("hf_args.yaml", tmp_path)
    old = file.read_text()
    target = target_for(file, preset="hf")
    p = plan(target, {"batch_size": 32, "accumulation": 1, "precision": "fp16-mixed",
                      "checkpointing": "full", "compile": "default", "num_workers": 8}, PROVENANCE)
    write(p)
    new = file.read_text()
    keys = {"per_device_train_batch_size", "gradient_accumulation_steps", "gradient_checkpointing",
            "torch_compile", "dataloader_num_workers"}
    assert_only_keys_changed(old, new, keys)
    data = load(new)
    assert (data["per_device_train_batch_size"], data["gradient_accumulation_steps"]) == (32, 1)
    assert data["gradient_checkpointing"] is True and data["torch_compile"] is True
    # no bf16/tf32/torch_compile_mode keys were needed: their absence already means false / "default"
    assert "bf16" not in data and "tf32" not in data and "torch_compile_mode" not in data
    assert data["dataloader_num_workers"] == 8


def test_hf_preset_bf16_switches_fp16_off_and_needs_the_bf16_key(tmp_path):
    file = copy("hf_args.yaml", tmp_path)
    target = target_for(file, preset="hf")
    with pytest.raises(UserError, match=r"key bf16 .*--create-keys"):
        plan(target, {"precision": "bf16-mixed"}, PROVENANCE)
    p = plan(target, {"precision": "bf16-mixed"}, PROVENANCE, create_keys=True)
    data = load(p.new_text)
    assert data["bf16"] is True and data["fp16"] is False
    assert "fp16: False " in p.new_text  # the file's True/False spelling is kept


def test_hf_preset_refuses_a_value_it_cannot_express(tmp_path):
    file = copy("hf_args.yaml", tmp_path)
    with pytest.raises(UserError, match=r"precision=bf16-true cannot be written.*apply.keys.precision.values"):
        plan(target_for(file, preset="hf"), {"precision": "bf16-true"}, PROVENANCE)


def test_deepspeed_json_keeps_layout_and_keeps_train_batch_size_consistent(tmp_path):
    file = copy("deepspeed.json", tmp_path)
    old = file.read_text()
    target = target_for(file, preset="deepspeed", world_size=2)
    p = plan(target, {"batch_size": 32, "accumulation": 2, "precision": "bf16-mixed"}, PROVENANCE)
    write(p)
    new = file.read_text()
    keys = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
            "fp16.enabled", "bf16.enabled"}
    assert_only_keys_changed(old, new, keys, fmt="json")
    data = json.loads(new)
    assert data["train_batch_size"] == 32 * 2 * 2
    assert data["fp16"]["enabled"] is False and data["bf16"]["enabled"] is True
    assert list(data) == list(json.loads(old))  # key order
    assert '\n    "fp16": {\n        "enabled": false,\n' in new  # the file's 4-space indentation
    assert PROVENANCE_MARK not in new  # JSON holds no comments: provenance is in the sidecar
    sidecar = json.loads((tmp_path / "deepspeed.json.bench.json").read_text())
    assert sidecar["provenance"] == PROVENANCE
    assert {c["key"] for c in sidecar["changes"]} == keys


def test_plain_preset_uses_knob_names_and_keeps_quoting_and_4_space_indent(tmp_path):
    file = copy("plain.yaml", tmp_path)
    old = file.read_text()
    write(plan(target_for(file), {"batch_size": 128, "precision": "bf16-mixed", "compile": "max-autotune",
                                  "checkpointing": "none"}, PROVENANCE))
    new = file.read_text()
    assert_only_keys_changed(old, new, {"batch_size", "precision", "compile"})
    assert "compile: 'max-autotune'\n" in new
    assert "    name: sentence-transformers/all-MiniLM-L6-v2\n" in new


def test_explicit_keys_override_the_preset_and_null_leaves_a_knob_out(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", keys={
        "compile": {"key": "model.drop_path", "values": {"off": 0.0, "default": 0.2}},
        "accumulation": None,
    })
    p = plan(target, {"batch_size": 32, "accumulation": 8, "compile": "default"}, PROVENANCE)
    data = load(p.new_text)
    assert data["model"]["drop_path"] == 0.2
    assert data["trainer"]["accumulate_grad_batches"] == 1
    assert p.unmapped == ["accumulation"]


# ---------------------------------------------------------------------------------------------
# read_current: file values back to bench values


@pytest.mark.parametrize("spelling, expected", [
    ("32", "fp32"), ("32-true", "fp32"), ("16", "fp16-mixed"), ("16-mixed", "fp16-mixed"),
    ("bf16", "bf16-mixed"), ("bf16-mixed", "bf16-mixed"), ("bf16-true", "bf16-true"),
])
def test_read_current_lightning_precision_spellings(tmp_path, spelling, expected):
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("precision: 32 ", f"precision: {spelling} "))
    current = read_current(target_for(file, preset="lightning"))
    assert current == {"batch_size": 16, "accumulation": 1, "precision": expected, "nproc": 1}  # trainer.devices: 1


@pytest.mark.parametrize("spelling", ["bf16", "'bf16'", "16", "32"])
def test_a_value_already_there_in_another_spelling_is_left_as_written(tmp_path, spelling):
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("precision: 32 ", f"precision: {spelling} "))
    precision = read_current(target_for(file, preset="lightning"))["precision"]
    p = plan(target_for(file, preset="lightning"), {"batch_size": 32, "precision": precision}, PROVENANCE)
    assert [change[0] for change in p.changes] == ["data.batch_size"]
    assert f"precision: {spelling} " in p.new_text


@pytest.mark.parametrize("lines, expected", [
    ("fp16: true", {"precision": "fp16-mixed"}),
    ("bf16: true\nfp16: false", {"precision": "bf16-mixed"}),
    ("bf16: false\ntf32: true", {"precision": "tf32"}),
    ("bf16: false", {"precision": "fp32"}),
    ("torch_compile: true", {"compile": "default"}),
    ("torch_compile: true\ntorch_compile_mode: reduce-overhead", {"compile": "reduce-overhead"}),
    ("gradient_checkpointing: true", {"checkpointing": "full"}),
    ("per_device_train_batch_size: 4\ngradient_accumulation_steps: 16",
     {"batch_size": 4, "accumulation": 16}),
    ("output_dir: out", {}),  # nothing mapped in the file: nothing reported, not HF's defaults
])
def test_read_current_hf(tmp_path, lines, expected):
    file = tmp_path / "args.yaml"
    file.write_text(lines + "\n")
    assert read_current(target_for(file, preset="hf")) == expected


@pytest.mark.parametrize("lines, expected", [
    ("bf16: yes\nfp16: no", {"precision": "bf16-mixed"}),
    ("bf16: off\ntf32: On", {"precision": "tf32"}),
    ("gradient_checkpointing: YES\ntorch_compile: no", {"checkpointing": "full", "compile": "off"}),
])
def test_read_current_hf_reads_yes_no_on_off_as_transformers_does(tmp_path, lines, expected):
    """HfArgumentParser reads a YAML file with PyYAML, where `bf16: no` is false (YAML 1.1); bench reads
    YAML 1.2, where it is the string "no", and refused the file: "cannot tell which precision"."""
    file = tmp_path / "args.yaml"
    file.write_text(lines + "\n")
    assert read_current(target_for(file, preset="hf")) == expected
    p = plan(target_for(file, preset="hf"), {"precision": "fp16-mixed"}, PROVENANCE, create_keys=True)
    data = yaml.safe_load(p.new_text)  # as transformers reads it
    assert data["fp16"] is True and data.get("bf16", False) is False


def test_read_current_deepspeed_and_auto_means_unknown(tmp_path):
    file = copy("deepspeed.json", tmp_path)
    target = target_for(file, preset="deepspeed")
    assert read_current(target) == {"batch_size": 8, "accumulation": 4, "precision": "fp16-mixed"}
    data = json.loads(file.read_text())
    data["fp16"]["enabled"], data["bf16"]["enabled"] = False, True
    data["train_micro_batch_size_per_gpu"] = "auto"
    file.write_text(json.dumps(data))
    assert read_current(target) == {"accumulation": 4, "precision": "bf16-mixed"}


def test_a_deepspeed_auto_is_refused_before_the_sweep_and_at_apply_never_overwritten(tmp_path):
    """"train_micro_batch_size_per_gpu": "auto" (the HF Trainer fills it from TrainingArguments) became 8, which
    the Trainer then refuses to start with where its own per_device_train_batch_size says otherwise."""
    file = copy("deepspeed.json", tmp_path)
    data = json.loads(file.read_text())
    data["train_micro_batch_size_per_gpu"] = data["gradient_accumulation_steps"] = "auto"
    file.write_text(json.dumps(data, indent=4))
    before, target = file.read_text(), target_for(file, preset="deepspeed")
    said = ('train_micro_batch_size_per_gpu, gradient_accumulation_steps are "auto", which the HF Trainer fills from '
            'its TrainingArguments; point apply at that file (preset: hf), or write numbers in place of "auto"')
    with pytest.raises(UserError, match=re.escape(f"s.yaml: {file}: {said}")):
        apply.refuse_unwritable(target, {"batch_size": [8, 16], "accumulation": [1, 2]}, "s.yaml")
    with pytest.raises(UserError, match=re.escape(said)):
        plan(target, {"batch_size": 16, "accumulation": 1}, PROVENANCE)
    assert apply.refuse_unwritable(target, {"precision": ["fp32", "bf16-mixed"]}, "s.yaml") == []  # not its keys
    assert file.read_text() == before


def test_read_current_plain_and_an_unknown_spelling(tmp_path):
    file = copy("plain.yaml", tmp_path)
    assert read_current(target_for(file)) == {"batch_size": 32, "accumulation": 1, "precision": "fp32",
                                             "checkpointing": "none", "compile": "off"}
    file.write_text(file.read_text().replace("precision: fp32", "precision: half"))
    with pytest.raises(UserError, match=r"cannot tell which precision .*apply.keys.precision.values"):
        read_current(target_for(file))


# 99999999999: the sweep ran it as your config, recorded it, and then refused its own journal
@pytest.mark.parametrize("value", ['"16"', "16.0", "0", "-8", "true", "99999999999"])
def test_a_batch_size_bench_cannot_read_says_what_to_write(tmp_path, value):
    file = copy("plain.yaml", tmp_path)
    file.write_text(file.read_text().replace("batch_size: 32", f"batch_size: {value}"))
    with pytest.raises(UserError, match=r"is not a batch_size bench can read: write a whole number from 1 to 16,777,216"):
        read_current(target_for(file))


@pytest.mark.parametrize("content, message", [
    (None, "file not found"),
    ("trainer: [1, 2\n", "not valid YAML"),
    ("- a\n- b\n", "top level is a list, not a mapping"),
    ("just some words\n", "top level is a single string, not a mapping"),
    ("", "the file holds no keys .*write your config's keys"),
    ("# only a comment\n", "the file holds no keys"),
])
def test_read_current_refuses_what_is_not_a_yaml_mapping(tmp_path, content, message):
    file = tmp_path / "config.yaml"
    if content is not None:
        file.write_text(content)
    with pytest.raises(UserError, match=message):
        read_current(target_for(file, preset="lightning"))


# ---------------------------------------------------------------------------------------------
# learning-rate rule


def test_lr_rule_without_a_batch_in_the_file_names_the_key_it_looked_for(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("  batch_size: 16     # per GPU\n", ""))
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "linear"})
    with pytest.raises(UserError, match=r"batch size is unknown \(no data.batch_size in the file\)"):
        plan(target, {"batch_size": 32}, PROVENANCE, create_keys=True)


def test_lr_rule_with_batch_size_not_mapped_rescales_by_what_it_writes(tmp_path):
    """`apply.keys.batch_size: null` with apply.lr refused every trial ("the current batch size is unknown"),
    after a sweep that had not: the file's micro-batch is not written, so it cancels out of the ratio."""
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", keys={"batch_size": None}, lr={"key": "optimizer.lr", "scale": "sqrt"})
    same = plan(target, {"batch_size": 64, "accumulation": 1}, PROVENANCE)
    assert [c.key for c in same.changes] == []  # accumulation 1 -> 1: the effective batch the file trains at stays
    doubled = plan(target, {"batch_size": 64, "accumulation": 2}, PROVENANCE)
    assert load(doubled.new_text)["optimizer"]["lr"] == pytest.approx(3.0e-4 * 2 ** 0.5, rel=1e-5)
    assert load(doubled.new_text)["data"]["batch_size"] == 16


def test_a_comment_quoting_the_old_effective_batch_is_stale_when_accumulation_changes_it(tmp_path):
    """`lr: 3.0e-4  # tuned for an effective batch of 16` was not flagged when accumulation 1 -> 2 made it 32:
    only old values of changed keys were looked for, and the batch size itself did not change."""
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("lr: 3.0e-4", "lr: 3.0e-4   # tuned for an effective batch of 16"))
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "sqrt"})
    p = plan(target, {"accumulation": 2}, PROVENANCE, current_values=read_current(target))
    assert any("optimizer.lr: the comment '# tuned for an effective batch of 16' quotes 16, the old effective batch; "
               "update the comment" in w for w in p.warnings), p.warnings
    same = plan(target, {"accumulation": 1}, PROVENANCE, current_values=read_current(target))
    assert same.warnings == ()  # the effective batch stays 16: the comment still holds
    file.write_text(file.read_text().replace("precision: 32               # TODO: try AMP", "precision: 16-mixed  # 16-bit here"))
    p = plan(target, {"accumulation": 2, "precision": "bf16-mixed"}, PROVENANCE, current_values=read_current(target))
    assert [w for w in p.warnings if "16-bit" in w] == [
        "lightning.yaml:12: trainer.precision: the comment '# 16-bit here' speaks of 16, not of the new value bf16-mixed; "
        "check the comment still holds"], p.warnings  # not "quotes 16, the old effective batch": no batch in it
    # (line 12: the provenance block above it ends with lr_from)
    from harness.apply._plan import _old_effective_batch  # processes the launcher decides (`devices: auto`): unknown
    assert _old_effective_batch({"nproc": 2}, {"batch_size": 8}) is None
    assert _old_effective_batch({"nproc": 2}, {"batch_size": 8, "nproc": 1}) == 8


def test_an_anchor_and_a_tag_in_front_of_a_value_stay(tmp_path):
    """`accumulate_grad_batches: &acc 1` became `accumulate_grad_batches: 2`, and `lr: &lr !!float 3e-4`
    lost both its anchor and its tag: only a tag alone in front was kept."""
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("accumulate_grad_batches: 1", "accumulate_grad_batches: &acc 1")
                    .replace("lr: 3.0e-4", "lr: &lr !!float 3.0e-4"))
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "sqrt"})
    new = plan(target, {"accumulation": 2}, PROVENANCE).new_text
    assert "  accumulate_grad_batches: &acc 2\n" in new and "  lr: &lr !!float 4.24264e-4\n" in new


@pytest.mark.parametrize("before, after", [
    ("  accumulate_grad_batches: &acc\n  precision: 32\n", "  accumulate_grad_batches: &acc 2\n  precision: 32\n"),
    ("  precision: 32\n  accumulate_grad_batches: &acc", "  precision: 32\n  accumulate_grad_batches: &acc 2"),
    ("  precision: 32\n  accumulate_grad_batches: !!int\n    1\n", "  precision: 32\n  accumulate_grad_batches: !!int\n    2\n"),
])
def test_an_anchored_null_or_a_tag_on_its_own_line_takes_the_value_in_place(tmp_path, before, after):
    """Skipping an anchor ran past a null's end: a bench bug raised, an AttributeError at the file's end."""
    file = tmp_path / "c.yaml"
    file.write_text("trainer:\n" + before)
    target = target_for(file, preset="lightning", keys={"batch_size": None})
    assert plan(target, {"accumulation": 2}, PROVENANCE).new_text.endswith("trainer:\n" + after)


@pytest.mark.parametrize("old, new", [("yes", "no"), ("Yes", "No"), ("on", "off")])
def test_a_yaml_1_1_boolean_word_is_written_plain_as_the_file_spelt_it(tmp_path, old, new):
    """`use_amp: yes` mapped with values {fp32: no, bf16-mixed: yes} became `use_amp: "no"`: a string, which
    PyYAML (YAML 1.1) reads as truthy where it had read `yes` as True, so mixed precision stayed on."""
    file = tmp_path / "train.yaml"
    file.write_text(f"trainer:\n  use_amp: {old}   # mixed precision on\n  batch_size: 8\n")
    target = target_for(file, keys={"precision": {"key": "trainer.use_amp", "values": {"fp32": new, "bf16-mixed": old}},
                                    "batch_size": "trainer.batch_size"})
    written = plan(target, {"precision": "fp32"}, PROVENANCE).new_text
    assert re.search(rf"\n  use_amp: {new} +# mixed precision on\n", written)  # the comment keeps its column
    assert yaml.safe_load(written)["trainer"]["use_amp"] is False  # as PyYAML read the old word: True


@pytest.mark.parametrize("held", ["auto", "null"])
def test_lr_rule_with_a_batch_key_that_holds_no_number_says_what_it_holds(tmp_path, held):
    """A batch_size: auto (Lightning's tuner, DeepSpeed) was told "no data.batch_size in the file"."""
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("  batch_size: 16     # per GPU\n", f"  batch_size: {held}\n"))
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "linear"})
    found = "'auto'" if held == "auto" else "None"
    with pytest.raises(UserError, match=rf"batch size is unknown \(data.batch_size holds {found}, not a number\)"):
        plan(target, {"batch_size": 32}, PROVENANCE)


@pytest.mark.parametrize("devices", ["auto", "[0, 1, 2, 3]", "-1"])
def test_lr_rule_refuses_a_process_count_the_file_leaves_to_the_launcher(tmp_path, devices):
    # was read as 1 process: devices: auto -> nproc 8 rescaled the lr x8 while the per-device batch stayed
    file = tmp_path / "c.yaml"
    file.write_text(f"data:\n  batch_size: 8\noptimizer:\n  lr: 0.001\ntrainer:\n  devices: {devices}\n")
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr"})
    with pytest.raises(UserError, match=r"apply.lr: trainer.devices holds .*, not a count of processes"):
        plan(target, {"batch_size": 8, "nproc": 8}, PROVENANCE)
    assert load(plan(target, {"batch_size": 16}, PROVENANCE).new_text)["optimizer"]["lr"] == pytest.approx(0.002)
    file.write_text(file.read_text().replace(f"devices: {devices}", "devices: 2"))
    assert load(plan(target, {"batch_size": 8, "nproc": 8}, PROVENANCE).new_text)["optimizer"]["lr"] == pytest.approx(0.004)


def test_lr_rescales_for_the_knobs_written_not_for_one_without_a_key(tmp_path):
    # accumulation: null leaves the file's accumulation running; the lr was rescaled x8 for its x4 all the same
    file = tmp_path / "c.yaml"
    file.write_text("data:\n  batch_size: 8\noptimizer:\n  lr: 0.001\n")
    target = target_for(file, keys={"batch_size": "data.batch_size", "accumulation": None}, lr={"key": "optimizer.lr"})
    p = plan(target, {"batch_size": 16, "accumulation": 4}, PROVENANCE)
    assert load(p.new_text)["optimizer"]["lr"] == pytest.approx(0.002) and p.unmapped == ["accumulation"]


def test_lr_linear_scaling_is_in_the_diff(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "linear"})
    p = plan(target, {"batch_size": 32, "accumulation": 2}, PROVENANCE)  # 16x1 -> 32x2: x4
    assert "-  lr: 3.0e-4\n" in p.diff and "+  lr: 1.2e-3\n" in p.diff
    assert ("optimizer.lr", 3e-4, 1.2e-3) in p.changes


def test_a_last_line_without_a_newline_is_marked_in_the_diff_not_run_into_the_next(tmp_path):
    # a tester's file: "-  precision: 16-mixed+  precision: 32-true" on one line
    file = tmp_path / "c.yaml"
    file.write_text("data:\n  batch_size: 8\ntrainer:\n  precision: 16-mixed")
    p = plan(target_for(file, preset="lightning"), {"batch_size": 8, "precision": "fp32"}, PROVENANCE)
    assert p.diff.endswith("-  precision: 16-mixed\n\\ No newline at end of file\n"
                           "+  precision: 32-true\n\\ No newline at end of file\n"), p.diff
    assert not p.new_text.endswith("\n")  # the file keeps its own ending
    file.write_text("data:  # loader settings\u2028\n  batch_size: 8\ntrainer:\n  precision: 16-mixed\n")
    p = plan(target_for(file, preset="lightning"), {"batch_size": 8, "precision": "fp32"}, PROVENANCE)
    assert "No newline" not in p.diff and "@@ -1,4 +1,6 @@" in p.diff  # U+2028 is no line break to diff or patch


@pytest.mark.parametrize("accumulation, steps", [(1, 1000), (4, 250)])
def test_a_run_of_epochs_of_limited_batches_counts_optimizer_steps(tmp_path, accumulation, steps):
    # Lightning's limit_train_batches counts micro-batches: with accumulation 4 an epoch of 100 is 25 steps
    file = tmp_path / "c.yaml"
    file.write_text(f"trainer:\n  max_epochs: 10\n  limit_train_batches: 100\n  accumulate_grad_batches: {accumulation}\n")
    found, said = apply.run_length(target_for(file, preset="lightning"))
    assert found == steps and said.startswith(f"the {steps:,}-step run c.yaml describes (trainer.max_epochs x "
                                              "trainer.limit_train_batches")
    assert ("/ 4 micro-batches a step" in said) == (accumulation == 4)


@pytest.mark.parametrize("lr", [".nan", "1e308", "-3.0e-4"])
def test_an_lr_that_cannot_be_rescaled_is_one_line_not_a_traceback(tmp_path, lr):
    """A NaN lr ended in "produced unexpected values ... a bench bug", 1e308 x4 in a ValueError."""
    file = copy("lightning.yaml", tmp_path)
    file.write_text(file.read_text().replace("lr: 3.0e-4", f"lr: {lr}"))
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr", "scale": "linear"})
    with pytest.raises(UserError, match=r"a learning rate to rescale is a positive finite number"):
        plan(target, {"batch_size": 32, "accumulation": 2}, PROVENANCE)


def test_lr_sqrt_scaling_is_in_the_diff(tmp_path):
    file = copy("deepspeed.json", tmp_path)
    target = target_for(file, preset="deepspeed", lr={"key": "optimizer.params.lr", "scale": "sqrt"})
    p = plan(target, {"batch_size": 32, "accumulation": 4}, PROVENANCE)  # 8x4 -> 32x4: x4, sqrt x2
    assert '"lr": 1.2e-3' in p.diff
    assert json.loads(p.new_text)["optimizer"]["params"]["lr"] == pytest.approx(1.2e-3)


def test_lr_untouched_when_the_effective_batch_is_the_same(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr"})
    p = plan(target, {"batch_size": 8, "accumulation": 2}, PROVENANCE)
    assert "optimizer.lr" not in [k for k, _, _ in p.changes]


def test_lr_scales_against_given_current_values(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", lr={"key": "optimizer.lr"})
    p = plan(target, {"batch_size": 16}, PROVENANCE, current_values={"batch_size": 32, "accumulation": 1})
    assert load(p.new_text)["optimizer"]["lr"] == pytest.approx(1.5e-4)


@pytest.mark.parametrize("name, lr_key, fmt", [("lightning.yaml", "optimizer.lr", "yaml"),
                                                 ("deepspeed.json", "optimizer.params.lr", "json")])
def test_lr_comes_back_exactly_when_the_batch_does(tmp_path, name, lr_key, fmt):
    """An audit: lr 1e-4 at batch 8, applied at batch 16 (sqrt: 1.41421e-4, six figures), 48 and back at 8,
    read 9.99996e-05: each apply rescaled the last one's rounded value. Now each rescales from the value
    the first apply found (kept in the provenance), so trying configs and going back returns yours."""
    file = copy(name, tmp_path)
    file.write_text(re.sub(r'("lr": |\n\s*lr: )[^,}\s#]+', r"\g<1>1.0e-4", file.read_text()))
    target = target_for(file, preset="lightning" if fmt == "yaml" else "deepspeed", lr={"key": lr_key, "scale": "sqrt"})
    knobs = read_current(target)
    mine = {"batch_size": knobs["batch_size"], "accumulation": knobs.get("accumulation", 1)}
    original = load(file.read_text(), fmt)
    for key in lr_key.split("."):
        original = original[key]
    seen = []
    for batch in (mine["batch_size"] * 2, mine["batch_size"] * 6, mine["batch_size"]):
        write(plan(target, {**mine, "batch_size": batch}, PROVENANCE))
        lr = load(file.read_text(), fmt)
        for key in lr_key.split("."):
            lr = lr[key]
        seen.append(lr)
    assert original == 1e-4 and seen[0] == 1.41421e-4 and seen[1] == 2.44949e-4
    assert seen[2] == original  # yours, to the last digit (9.99996e-05 when each rescaled the last)
    # an lr you edit after an apply is yours: rescaled from it, not from what bench found before
    edited = re.sub(r'("lr": |\n\s*lr: )[^,}\s#]+', r"\g<1>5e-4", file.read_text())
    assert edited != file.read_text()
    file.write_text(edited)
    p = plan(target, {**mine, "batch_size": mine["batch_size"] * 2}, PROVENANCE)
    assert (lr_key, 5e-4, float(f"{5e-4 * 2 ** 0.5:.6g}")) in p.changes


def test_new_small_floats_stay_floats_for_pyyaml(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("batch_size: 64\nlr: 0.00004\n")
    p = plan(target_for(file, lr={"key": "lr"}), {"batch_size": 16}, {})
    assert "lr: 1.0e-5\n" in p.new_text  # not 1e-05, which YAML 1.1 (PyYAML) reads as a string


# ---------------------------------------------------------------------------------------------
# refusals leave the target byte-identical and write no backup


def assert_untouched(file: Path, original: bytes, before: set[str]):
    assert file.read_bytes() == original
    assert files_in(file.parent) == before


def test_every_absent_key_is_named_in_one_refusal(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", keys={"checkpointing": "model.activation.checkpoint",
                                                         "compile": "model.compile_mode"})
    with pytest.raises(UserError, match=r"keys model\.activation\.checkpoint .*; model\.compile_mode .*not in the file"):
        plan(target, {"checkpointing": "full", "compile": "default"}, PROVENANCE)


def test_absent_key_is_refused_then_created_with_create_keys(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    original, before = file.read_bytes(), files_in(tmp_path)
    target = target_for(file, preset="lightning", keys={"checkpointing": "model.activation.checkpoint"})
    with pytest.raises(UserError, match=r"model\.activation\.checkpoint .*--create-keys"):
        write(plan(target, {"checkpointing": "full"}, PROVENANCE))
    assert_untouched(file, original, before)
    p = plan(target, {"checkpointing": "full"}, PROVENANCE, create_keys=True)
    write(p)
    data = load(file.read_text())
    assert data["model"]["activation"]["checkpoint"] == "full"
    assert data["model"]["drop_path"] == 0.1
    assert "  drop_path: 0.1\n  activation:\n    checkpoint: full\n\n# data module" in file.read_text()
    assert ("model.activation.checkpoint", None, "full") in p.changes


@pytest.mark.parametrize("text, expected", [
    ("a: 1\ntrainer:\nb: 2\n", "a: 1\ntrainer:\n  precision: bf16-mixed\n  batch_size: 32\nb: 2\n"),
    ("a: 1\ntrainer: ~   # filled later\nb: 2\n",
     "a: 1\ntrainer:   # filled later\n  precision: bf16-mixed\n  batch_size: 32\nb: 2\n"),
    ("a: 1\ntrainer: null", "a: 1\ntrainer:\n  precision: bf16-mixed\n  batch_size: 32\n"),
    ("a: {trainer: null, b: 2}\n", None),
])
def test_create_keys_fills_an_empty_section(tmp_path, text, expected):
    """`trainer:` left empty (null) was refused with "trainer is not a mapping": the keys fill it."""
    file = tmp_path / "c.yaml"
    file.write_text(text)
    section = "a.trainer" if text.startswith("a: {") else "trainer"
    target = target_for(file, keys={"precision": f"{section}.precision", "batch_size": f"{section}.batch_size"})
    p = plan(target, {"precision": "bf16-mixed", "batch_size": 32}, {}, create_keys=True)
    if expected is not None:
        assert p.new_text.endswith(expected)
    data = load(p.new_text)
    trainer = data["a"]["trainer"] if section == "a.trainer" else data["trainer"]
    assert trainer == {"precision": "bf16-mixed", "batch_size": 32}


def test_create_keys_in_json_follows_the_layout(tmp_path):
    file = tmp_path / "ds.json"
    file.write_text('{\n  "train_micro_batch_size_per_gpu": 8,\n  "fp16": {"enabled": true}\n}\n')
    p = plan(target_for(file, preset="deepspeed"), {"precision": "bf16-mixed"}, {}, create_keys=True)
    assert p.new_text == ('{\n  "train_micro_batch_size_per_gpu": 8,\n  "fp16": {"enabled": false},\n'
                          '  "bf16": {"enabled": true}\n}\n')


@pytest.mark.parametrize("name, content, message", [
    # cut inside a bracket or quote: the parser fails past the last line ("at line 2" of a 1-line file)
    ("config.yaml", "trainer: {precision: 32\n", re.escape("not valid YAML: cut short at its end (line 1: the { of line 1 "
                                                          "is never closed)")),
    ("config.yaml", "a: 1\nname: 'run\n", re.escape("not valid YAML: cut short at its end (line 2: the quote of line 2 "
                                                      "is never closed)")),
    ("config.yaml", "trainer: {precision: 32\nmax_epochs: 3\n", "not valid YAML: expected ',' or '}', but got ':' at line 2"),
    ("config.yaml", "- 1\n- 2\n", "not a mapping"),
    ("config.yaml", "a: 1\n---\nb: 2\n", "not valid YAML: expected a single document .*, but found another document at line 2"),
    ("config.yaml", "a: 1\nb: 2\na: 3\n", 'not valid YAML: found duplicate key "a" .* at line 3'),
    ("config.json", '{"trainer": {"precision": 32},}\n', "not valid JSON: .* line 1 column 31"),
    ("config.json", "[1, 2]\n", "not a mapping"),
    ("config.yaml", b"\xff\xfe\x00binary", "not a UTF-8 text file"),
])
def test_unparsable_targets_are_refused_untouched(tmp_path, name, content, message):
    file = tmp_path / name
    file.write_bytes(content if isinstance(content, bytes) else content.encode())
    original, before = file.read_bytes(), files_in(tmp_path)
    with pytest.raises(UserError, match=message):
        plan(target_for(file, preset="lightning"), {"precision": "bf16-mixed"}, PROVENANCE)
    assert_untouched(file, original, before)


def test_a_txt_target_is_refused(tmp_path):
    (tmp_path / "config.txt").write_text("batch_size: 8\n")
    with pytest.raises(UserError, match=r"sweeps/test.yaml: apply.file: config.txt is neither YAML .* nor JSON"):
        target_for(tmp_path / "config.txt")


def test_to_must_keep_the_format_and_is_named_as_given(tmp_path):
    """The error named the resolved file's basename: `--to /dev/stdout` was refused by the name of what its link points to."""
    file = copy("plain.yaml", tmp_path)
    for to in (tmp_path / "out.json", Path("/dev/stdout")):
        with pytest.raises(UserError, match=re.escape(f"--to {to}: must be a YAML file")):
            plan(target_for(file), {"batch_size": 8}, {}, to=to)


def test_a_fifo_as_to_is_refused_instead_of_blocking(tmp_path):
    """`bench apply best --to out.yaml --dry-run` waited forever, silent, reading a FIFO named out.yaml."""
    file, fifo = copy("plain.yaml", tmp_path), tmp_path / "out.yaml"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match=re.escape(f"--to {fifo}: not a regular file (a FIFO or device)")):
        plan(target_for(file), {"batch_size": 8}, {}, to=fifo)


def test_read_only_file_is_refused_untouched(tmp_path):
    file = copy("plain.yaml", tmp_path)
    p = plan(target_for(file), {"batch_size": 64}, PROVENANCE)
    file.chmod(0o444)
    original, before = file.read_bytes(), files_in(tmp_path)
    with pytest.raises(UserError, match="read-only"):
        write(p)
    assert_untouched(file, original, before)
    assert stat.S_IMODE(file.stat().st_mode) == 0o444


def test_read_only_folder_is_refused_untouched(tmp_path):
    folder = tmp_path / "conf"
    folder.mkdir()
    file = copy("plain.yaml", folder)
    p = plan(target_for(file), {"batch_size": 64}, PROVENANCE)
    original, before = file.read_bytes(), files_in(folder)
    folder.chmod(0o555)
    try:
        with pytest.raises(UserError, match="folder is read-only"):
            write(p)
    finally:
        folder.chmod(0o755)
    assert_untouched(file, original, before)


def test_vanished_target_is_refused(tmp_path):
    file = copy("plain.yaml", tmp_path)
    p = plan(target_for(file), {"batch_size": 64}, PROVENANCE)
    file.unlink()
    with pytest.raises(UserError, match="vanished"):
        write(p)
    assert files_in(tmp_path) == set()


def test_target_edited_after_the_plan_is_refused(tmp_path):
    file = copy("plain.yaml", tmp_path)
    p = plan(target_for(file), {"batch_size": 64}, PROVENANCE)
    file.write_text(file.read_text() + "extra: 1\n")
    original, before = file.read_bytes(), files_in(tmp_path)
    with pytest.raises(UserError, match="changed after the plan"):
        write(p)
    assert_untouched(file, original, before)


def test_a_failed_in_place_write_puts_the_backup_back(tmp_path, monkeypatch):
    """A hard-linked target is written in place, not atomically: a write that fails half-way once left part
    of the new text, deleted the backup and said the file was unchanged."""
    file = copy("lightning.yaml", tmp_path)
    os.link(file, tmp_path / "also.yaml")
    p = plan(target_for(file, preset="lightning"), {"batch_size": 64}, PROVENANCE)
    original = file.read_bytes()
    real_fsync, calls = os.fsync, []

    def disk_full_on_the_target(fd):  # the backup's fsync, its folder's, then the target's
        calls.append(fd)
        if os.fstat(fd).st_ino == file.stat().st_ino and len(calls) < 4:
            raise OSError(28, "No space left on device")
        return real_fsync(fd)
    monkeypatch.setattr(_write.os, "fsync", disk_full_on_the_target)
    with pytest.raises(UserError, match="No space left on device.*unchanged"):
        write(p)
    assert file.read_bytes() == original and (tmp_path / "also.yaml").read_bytes() == original
    assert not list(tmp_path.glob("*bench-backup*"))


def test_a_failed_replace_leaves_the_original_and_no_backup_or_temp_file(tmp_path, monkeypatch):
    file = copy("lightning.yaml", tmp_path)
    p = plan(target_for(file, preset="lightning"), {"batch_size": 64}, PROVENANCE)
    original, before = file.read_bytes(), files_in(tmp_path)

    def disk_full(src, dst):
        if Path(dst) == file:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    real_replace = os.replace
    monkeypatch.setattr(_write.os, "replace", disk_full)
    with pytest.raises(UserError, match="No space left on device.*unchanged"):
        write(p)
    assert_untouched(file, original, before)


def test_a_mapped_key_holding_a_mapping_is_refused(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning", keys={"batch_size": "data"})
    with pytest.raises(UserError, match="data .* holds a dict, not a single value"):
        plan(target, {"batch_size": 64}, PROVENANCE)


# ---------------------------------------------------------------------------------------------
# writing: backups, modes, --to, provenance


def test_backup_holds_the_original_and_each_apply_gets_its_own(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    original = file.read_bytes()
    target = target_for(file, preset="lightning")
    first = write(plan(target, {"batch_size": 32}, PROVENANCE))
    assert first.parent == tmp_path and first.name.startswith("lightning.yaml.bench-backup-")
    assert first.read_bytes() == original
    once = file.read_bytes()
    second = write(plan(target, {"batch_size": 64}, PROVENANCE))
    assert second != first and second.read_bytes() == once
    assert first.read_bytes() == original


def test_file_mode_is_preserved(tmp_path):
    file = copy("plain.yaml", tmp_path)
    file.chmod(0o640)
    backup = write(plan(target_for(file), {"batch_size": 64}, PROVENANCE))
    assert stat.S_IMODE(file.stat().st_mode) == 0o640
    assert stat.S_IMODE(backup.stat().st_mode) == 0o640


def test_to_writes_elsewhere_and_leaves_the_target_alone(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    original = file.read_bytes()
    out = tmp_path / "tuned" / "h200.yaml"
    p = plan(target_for(file, preset="lightning"), {"batch_size": 64}, PROVENANCE, to=out)
    assert p.path == out and p.old_text == original.decode()
    assert "-  batch_size: 16     # per GPU" in p.diff and "+  batch_size: 64     # per GPU" in p.diff
    assert write(p) is None
    assert file.read_bytes() == original
    assert load(out.read_text())["data"]["batch_size"] == 64
    assert not list(tmp_path.glob("*bench-backup*"))


def test_reapplying_replaces_the_provenance_comment_instead_of_stacking(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    target = target_for(file, preset="lightning")
    write(plan(target, {"batch_size": 32}, PROVENANCE))
    write(plan(target, {"batch_size": 64}, {**PROVENANCE, "trial": 42}))
    text = file.read_text()
    block = [line for line in text.splitlines() if line.startswith(PROVENANCE_MARK)]
    assert block == text.splitlines()[:len(block)]
    assert "trial 42" in block[0] and not any("trial 17" in line for line in block)
    assert len(block) == 2
    assert "measured on NVIDIA H200, 1234.5 samples/s, peak memory 12.00 GiB" in block[1]
    assert body(text)[0] == "# Emberformer: wildfire spread forecasting (LightningCLI config)"


def test_a_peak_under_a_gib_is_written_in_mib(tmp_path):
    """0.08 and 0.09 GiB read alike; the table says 85.1 and 95.7 MiB, so does the header now."""
    file = copy("lightning.yaml", tmp_path)
    p = plan(target_for(file, preset="lightning"), {"batch_size": 32}, {**PROVENANCE, "peak_memory": 85.1 * 2**20})
    assert "peak memory 85.1 MiB" in p.new_text.splitlines()[1]


def test_json_sidecar_is_replaced_on_reapply(tmp_path):
    file = copy("deepspeed.json", tmp_path)
    target = target_for(file, preset="deepspeed")
    write(plan(target, {"batch_size": 16}, PROVENANCE))
    write(plan(target, {"batch_size": 32}, {**PROVENANCE, "trial": 42}))
    sidecar = json.loads((tmp_path / "deepspeed.json.bench.json").read_text())
    assert sidecar["provenance"]["trial"] == 42
    assert sidecar["changes"][0] == {"key": "train_micro_batch_size_per_gpu", "old": 16, "new": 32}


def test_a_symlinked_target_stays_a_symlink(tmp_path):
    real = copy("plain.yaml", tmp_path)
    link = tmp_path / "link.yaml"
    link.symlink_to(real)
    write(plan(target_for(link), {"batch_size": 64}, PROVENANCE))
    assert link.is_symlink()
    assert load(real.read_text())["batch_size"] == 64


def test_a_hard_linked_target_is_written_through_every_name(tmp_path):
    """A rename gave the target a new inode: the other name kept the old values, without a word."""
    file = copy("plain.yaml", tmp_path)
    other = tmp_path / "also.yaml"
    os.link(file, other)
    original = file.read_bytes()
    backup = write(plan(target_for(file), {"batch_size": 64}, PROVENANCE))
    assert load(other.read_text())["batch_size"] == 64 and other.read_bytes() == file.read_bytes()
    assert backup.read_bytes() == original


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_the_owner_of_the_target_and_its_backup_is_kept_when_root_applies(tmp_path):
    file = copy("plain.yaml", tmp_path)
    os.chown(file, 1000, 1000)
    backup = write(plan(target_for(file), {"batch_size": 64}, PROVENANCE))
    assert (file.stat().st_uid, file.stat().st_gid) == (1000, 1000)
    assert (backup.stat().st_uid, backup.stat().st_gid) == (1000, 1000)


def test_crlf_line_ends_are_kept(tmp_path):
    file = tmp_path / "win.yaml"
    file.write_bytes(b"# trained on Windows\r\nbatch_size: 8\r\nprecision: fp32\r\n")
    write(plan(target_for(file), {"batch_size": 16, "precision": "bf16-mixed"}, {"study": "s"}))
    raw = file.read_bytes()
    assert raw.count(b"\r\n") == raw.count(b"\n") == 4
    assert raw.endswith(b"# trained on Windows\r\nbatch_size: 16\r\nprecision: bf16-mixed\r\n")


def test_yaml_1_1_words_are_quoted_and_tags_kept(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("batch_size: !!int 8\ncompile: default\n")
    p = plan(target_for(file), {"batch_size": 32, "compile": "off"}, {})
    assert 'compile: "off"\n' in p.new_text  # bare off is false to PyYAML
    assert "batch_size: !!int 32\n" in p.new_text


@pytest.mark.parametrize("key", ["defaults", "batch_size"])
def test_a_value_shared_through_an_anchor_is_refused(tmp_path, key):
    file = tmp_path / "c.yaml"
    file.write_text("defaults: &bs 8\nbatch_size: *bs\neval_batch: *bs\n")
    with pytest.raises(UserError, match="anchor &bs"):
        plan(target_for(file, keys={"batch_size": key}), {"batch_size": 32}, {})


def test_a_key_under_a_shared_mapping_is_refused(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("train: &common\n  batch_size: 8\neval: *common\n")
    with pytest.raises(UserError, match="anchor &common"):
        plan(target_for(file, keys={"batch_size": "train.batch_size"}), {"batch_size": 32}, {})
    with pytest.raises(UserError, match="anchor &common"):
        plan(target_for(file, keys={"batch_size": "train.micro"}), {"batch_size": 32}, {}, create_keys=True)


def test_an_anchor_no_alias_refers_to_is_edited_as_any_value(tmp_path):
    """`model: &m` left for a later `<<: *m` that was never written was refused as if shared."""
    file = tmp_path / "c.yaml"
    file.write_text("model: &m\n  batch_size: 8\n  depth: 4\nother: &n 3\n")
    p = plan(target_for(file, keys={"batch_size": "model.batch_size"}), {"batch_size": 32}, {})
    assert "model: &m\n  batch_size: 32\n  depth: 4\n" in p.new_text
    file.write_text("base: &m\n  batch_size: 8\nmodel:\n  <<: *m\n  depth: 4\n")  # a merge refers to it
    with pytest.raises(UserError, match="anchor &m"):
        plan(target_for(file, keys={"batch_size": "base.batch_size"}), {"batch_size": 32}, {})


def test_a_block_scalar_value_is_replaced_without_eating_the_next_line(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("precision: |\n  fp32\n  # still the old text\nbatch_size: 8\n")
    p = plan(target_for(file), {"precision": "bf16-mixed"}, {})
    assert body(p.new_text) == ["precision: bf16-mixed", "batch_size: 8"]


def test_provenance_without_optional_fields(tmp_path):
    file = copy("plain.yaml", tmp_path)
    p = plan(target_for(file), {"batch_size": 64}, {"trial": 3, "peak_memory": None, "sampler": "tpe"})
    assert p.new_text.splitlines()[:2] == [f"{PROVENANCE_MARK} written by bench trial 3",
                                           f"{PROVENANCE_MARK} sampler=tpe"]


def test_empty_value_is_filled_on_its_line(tmp_path):
    file = tmp_path / "c.yaml"
    file.write_text("batch_size:\nprecision: fp32\n")
    p = plan(target_for(file), {"batch_size": 4}, {})
    assert body(p.new_text) == ["batch_size: 4", "precision: fp32"]


# ---------------------------------------------------------------------------------------------
# Hydra profiles


def test_hydra_profile_for_the_device(tmp_path):
    conf = tmp_path / "conf"
    conf.mkdir()
    file = copy("lightning.yaml", conf)
    target = parse_apply_section({"file": "conf/lightning.yaml", "preset": "lightning",
                                  "hydra": {"group_dir": "conf/hardware"},
                                  "lr": {"key": "optimizer.lr"}}, tmp_path, "sweeps/x.yaml")
    original = file.read_bytes()
    p = write_hydra_profile(target, {"batch_size": 64, "accumulation": 1, "precision": "bf16-mixed"},
                            "NVIDIA H200", PROVENANCE)
    assert p.path == tmp_path / "conf" / "hardware" / "h200.yaml"
    assert write(p) is None
    text = p.path.read_text()
    assert text.splitlines()[0] == "# @package _global_"
    data = load(text)
    assert data == {"data": {"batch_size": 64}, "trainer": {"precision": "bf16-mixed", "accumulate_grad_batches": 1},
                    "optimizer": {"lr": pytest.approx(1.2e-3)}}
    assert file.read_bytes() == original
    again = write_hydra_profile(target, {"batch_size": 32}, "NVIDIA H200", PROVENANCE)
    assert write(again).read_text() == text  # the previous profile is backed up
    p.path.write_bytes(text.replace("\n", "\r\n").encode())  # an editor on Windows saved it
    crlf = write_hydra_profile(target, {"batch_size": 16}, "NVIDIA H200", PROVENANCE)
    write(crlf)  # was "the file changed after the plan was made" on every try: the plan read it newline-translated
    assert load(p.path.read_text())["data"]["batch_size"] == 16


def plain_hydra_target(tmp_path, config="batch_size: 8   # per device\nprecision: fp32\n", **section):
    (tmp_path / "conf" / "hardware").mkdir(parents=True)
    (tmp_path / "conf" / "config.yaml").write_text(config)
    return parse_apply_section({"file": "conf/config.yaml", "preset": "plain", "hydra": {"group_dir": "conf/hardware"},
                                **section}, tmp_path, "sweeps/x.yaml")


def test_a_profile_you_wrote_keeps_every_byte_but_the_mapped_keys(tmp_path):
    """It was replaced wholesale: your other keys and comments survived only in the backup."""
    target = plain_hydra_target(tmp_path)
    mine = "# @package _global_\n# my hand-tuned profile\nnum_workers: 6   # this box has 8 cores\nbatch_size: 8\n"
    path = tmp_path / "conf" / "hardware" / "h200.yaml"
    path.write_text(mine)
    p = write_hydra_profile(target, {"batch_size": 32, "precision": "bf16-mixed"}, "NVIDIA H200", PROVENANCE)
    assert write(p).read_text() == mine
    block = "".join(line + "\n" for line in _provenance_lines(PROVENANCE))
    assert path.read_text() == ("# @package _global_\n" + block + "# my hand-tuned profile\n"
                                "num_workers: 6   # this box has 8 cores\nbatch_size: 32\nprecision: bf16-mixed\n")
    assert p.changes == [("batch_size", 8, 32), ("precision", None, "bf16-mixed")]
    again = write_hydra_profile(target, {"batch_size": 8, "precision": "bf16-mixed"}, "NVIDIA H200",
                                {**PROVENANCE, "trial": 3})
    write(again)  # bench's block is replaced, not stacked; your comment stays below it
    assert path.read_text().count("# bench apply: written by") == 1 and "trial 3" in path.read_text()
    assert body(path.read_text()) == ["# @package _global_", "# my hand-tuned profile",
                                      "num_workers: 6   # this box has 8 cores", "batch_size: 8",
                                      "precision: bf16-mixed"]


def test_a_profile_of_comments_only_gets_the_keys_below_them(tmp_path):
    target = plain_hydra_target(tmp_path)
    path = tmp_path / "conf" / "hardware" / "h200.yaml"
    path.write_text("# @package _global_\n# the H200 in room 4\n")
    write(write_hydra_profile(target, {"batch_size": 32}, "NVIDIA H200", PROVENANCE))
    assert body(path.read_text()) == ["# @package _global_", "# the H200 in room 4", "batch_size: 32"]


@pytest.mark.parametrize("mine", ["num_workers: 6\n", "# @package hardware\nnum_workers: 6\n",
                                  "# the H200\n# @package _global_\nnum_workers: 6\n"])
def test_a_profile_hydra_would_not_put_at_the_top_level_is_refused(tmp_path, mine):
    """Bench's keys spliced into it would land under hardware. and override nothing."""
    target = plain_hydra_target(tmp_path)
    path = tmp_path / "conf" / "hardware" / "h200.yaml"
    path.write_text(mine)
    with pytest.raises(UserError, match=r"h200.yaml: has no '# @package _global_' line at its top"):
        write_hydra_profile(target, {"batch_size": 32}, "NVIDIA H200", PROVENANCE)
    assert path.read_text() == mine


def test_a_profile_lr_rescaled_for_another_batch_goes_back_to_the_main_configs(tmp_path):
    """Merged, not replaced: a batch back at the main config's must not keep the lr an earlier apply rescaled."""
    target = plain_hydra_target(tmp_path, "batch_size: 8\nlr: 0.001\n", lr={"key": "lr"})
    path = tmp_path / "conf" / "hardware" / "h200.yaml"
    write(write_hydra_profile(target, {"batch_size": 32}, "NVIDIA H200", PROVENANCE))
    assert load(path.read_text()) == {"batch_size": 32, "lr": 0.004}
    write(write_hydra_profile(target, {"batch_size": 8}, "NVIDIA H200", PROVENANCE))
    assert load(path.read_text()) == {"batch_size": 8, "lr": 0.001}


def test_hydra_profile_needs_the_hydra_section(tmp_path):
    file = copy("lightning.yaml", tmp_path)
    with pytest.raises(UserError, match="apply.hydra is not set"):
        write_hydra_profile(target_for(file, preset="lightning"), {"batch_size": 8}, "cpu", PROVENANCE)


@pytest.mark.parametrize("name, slug", [("NVIDIA H200", "h200"), ("NVIDIA GeForce RTX 4090", "rtx-4090"),
                                        ("cpu", "cpu"), ("NVIDIA H100 80GB HBM3", "h100-80gb-hbm3")])
def test_device_slug(name, slug):
    assert apply.device_slug(name) == slug


# ---------------------------------------------------------------------------------------------
# parse_apply_section


def test_parse_resolves_the_file_against_the_spec_folder_without_needing_it(tmp_path):
    target = parse_apply_section({"file": "../examples/cfg.yml", "preset": "hf",
                                  "keys": {"compile": {"key": "model.compile",
                                                       "values": {False: False, "default": True}}}},
                                 tmp_path / "sweeps", "sweeps/x.yaml")
    assert target.file == (tmp_path / "examples" / "cfg.yml").resolve()
    assert target.format == "yaml" and target.preset == "hf" and target.lr is None
    assert target.keys["compile"] == (apply.KeyMap("model.compile", values={"off": False, "default": True}),)
    assert target.keys["batch_size"] == (apply.KeyMap("per_device_train_batch_size", default=8),)


@pytest.mark.parametrize("section, message", [
    ({"file": "c.yaml", "prest": "hf"}, r"sweeps/x.yaml: apply: unknown key 'prest' \(did you mean 'preset'\?\)"),
    ({"file": "c.yaml", "preset": "lightnin"},
     r"apply.preset: unknown preset 'lightnin' \(did you mean 'lightning'\?\)"),
    ({"file": "c.yaml", "keys": {"batchsize": "b"}},
     r"apply.keys.batchsize: unknown knob 'batchsize' \(did you mean 'batch_size'\?\)"),
    ({"file": "c.yaml", "keys": {"Num-Workers": "b"}}, r"unknown knob 'Num-Workers' \(did you mean 'num_workers'\?\)"),
    ({"file": "c.yaml", "keys": {"precision": {"key": "p", "values": {"bf16": "bf16"}}}},
     r"apply.keys.precision.values: 'bf16' is not a precision value \(did you mean 'bf16-true'\?\)"),
    ({"file": "c.yaml", "keys": {"precision": {"key": "p", "values": {"fp32": 32, "bf16-mixed": float("nan")}}}},
     r"apply.keys.precision.values.bf16-mixed: nan is not a finite number"),  # apply wrote it, then crashed
    ({"file": "c.yaml", "keys": {"batch_size": "b", "compile": {"key": "c", "values": {"off": 0, "default": float("inf")}}}},
     r"apply.keys.compile.values.default: inf is not a finite number"),
    ({"file": "c.yaml", "keys": {"precision": {"key": "p", "valuse": {}}}},
     r"apply.keys.precision: unknown key 'valuse' \(did you mean 'values'\?\)"),
    ({"file": "c.yaml", "keys": {"batch_size": "data..batch"}},
     r"apply.keys.batch_size: 'data..batch' is not a dotted key"),
    ({"file": "c.yaml", "lr": {"key": "lr", "scale": "sqr"}},
     r"apply.lr.scale: unknown scale 'sqr' \(did you mean 'sqrt'\?\)"),
    ({"file": "c.yaml", "hydra": {"group": "conf/hw"}},
     r"apply.hydra: unknown key 'group' \(did you mean 'group_dir'\?\)"),
    ({"file": "c.yaml", "world_size": 0}, r"apply.world_size: expected a positive whole number"),
    ({"preset": "hf"}, r"apply: `file` is missing"),
    ("c.yaml", r"sweeps/x.yaml: apply: expected a mapping"),
    # a one-letter slip: apply wrote a trial of `full` as false, "already holds these values", and trained none
    ({"file": "c.yaml", "keys": {"checkpointing": {"key": "model.ckpt", "values": {"none": False, "full": False}}}},
     r"apply.keys.checkpointing: none and full are both written as model.ckpt: false, so the file could not tell "
     r"a trial of full from one of none; give each its own value"),
    ({"file": "c.yaml", "keys": {"precision": [{"key": "bf16", "values": {"fp32": False, "tf32": False}},
                                               {"key": "tf32", "values": {"fp32": True, "tf32": True}}]}},
     r"apply.keys.precision: fp32 and tf32 are both written as bf16: false, tf32: true"),
])
def test_parse_errors_are_one_line_user_errors(section, message, tmp_path):
    with pytest.raises(UserError, match=message) as error:
        parse_apply_section(section, tmp_path, "sweeps/x.yaml")
    assert "\n" not in str(error.value)


def test_values_written_alike_in_one_key_are_told_apart_by_another(tmp_path):
    """HF's way: bf16 writes fp32 and tf32 alike, the tf32 key tells them apart: no refusal."""
    section = {"file": "c.yaml", "keys": {"precision": [{"key": "bf16", "values": {"fp32": False, "tf32": False}},
                                                        {"key": "tf32", "values": {"fp32": False, "tf32": True}}]}}
    assert len(parse_apply_section(section, tmp_path, "x.yaml").keys["precision"]) == 2


def test_workload_knobs_are_accepted_and_checked_when_the_workload_is_known(tmp_path):
    section = {"file": "c.yaml", "keys": {"patch_size": "data.patch"}}  # close to batch_size, yet legitimate
    target = parse_apply_section(section, tmp_path, "x.yaml")
    assert target.keys["patch_size"] == (apply.KeyMap("data.patch"),)
    assert parse_apply_section(section, tmp_path, "x.yaml", known_knobs={"batch_size", "patch_size"}).keys["patch_size"]
    section = {"file": "c.yaml", "keys": {"seqlen": "data.seq"}}
    with pytest.raises(UserError, match=r"the workload has no knob 'seqlen' \(did you mean 'seq_len'\?\)"):
        parse_apply_section(section, tmp_path, "x.yaml", known_knobs={"batch_size", "seq_len"})


def test_provenance_goes_below_a_hydra_package_header(tmp_path):
    target = tmp_path / "gpu.yaml"
    target.write_text("# @package _global_\n# our 24 GB card\ndata:\n  batch_size: 8\n")
    spec = apply.parse_apply_section({"file": "gpu.yaml", "keys": {"batch_size": "data.batch_size"}}, tmp_path, "s.yaml")
    provenance = {"study": "s", "trial": 1, "device": "cpu", "throughput": 1.0, "peak_memory": 1, "date": "d"}
    for _ in range(2):  # re-applying replaces the block, still below the header
        apply.write(apply.plan(spec, {"batch_size": 16}, provenance))
    lines = target.read_text().splitlines()
    assert lines[0] == "# @package _global_"
    assert lines[1].startswith(apply.PROVENANCE_MARK)
    block = [line for line in lines if line.startswith(apply.PROVENANCE_MARK)]
    assert block == lines[1:1 + len(block)]  # one contiguous block, not stacked
    assert len(block) == len(_provenance_lines(provenance))
    assert "# our 24 GB card" in lines and "  batch_size: 16" in lines


def test_provenance_goes_below_a_shebang_and_leaves_a_comment_of_yours_alone(tmp_path):
    """The block went above a `#!` line (which then no longer worked), and replaced a comment of the
    user's that began "# bench apply:"."""
    target = tmp_path / "run.yaml"
    mine = "# bench apply: only on the 24 GB card, says Ana"
    target.write_text(f"#!/usr/bin/env -S python train.py --config\n{mine}\ndata:\n  batch_size: 8\n")
    spec = apply.parse_apply_section({"file": "run.yaml", "keys": {"batch_size": "data.batch_size"}}, tmp_path, "s.yaml")
    provenance = {"study": "s", "trial": 1, "device": "cpu", "throughput": 1.0, "peak_memory": 1, "date": "d"}
    for _ in range(2):  # the second apply replaces bench's block, and only that
        apply.write(apply.plan(spec, {"batch_size": 16}, provenance))
    lines = target.read_text().splitlines()
    block = _provenance_lines(provenance)
    assert lines[0] == "#!/usr/bin/env -S python train.py --config"
    assert lines[1:1 + len(block)] == block
    assert lines[1 + len(block):] == [mine, "data:", "  batch_size: 16"]


def test_a_yaml_target_with_a_byte_order_mark_keeps_it_byte_exactly(tmp_path):
    file = tmp_path / "bom.yaml"
    original = b"\xef\xbb\xbf" + (DATA / "plain.yaml").read_bytes()
    file.write_bytes(original)
    target = target_for(file)
    assert read_current(target)["batch_size"] == load((DATA / "plain.yaml").read_text())["batch_size"]
    write(plan(target, {"batch_size": 64}, PROVENANCE))
    new = file.read_bytes()
    assert new.startswith(b"\xef\xbb\xbf") and not new[3:].startswith(b"\xef\xbb\xbf")
    assert load(new.decode("utf-8-sig"))["batch_size"] == 64
    assert body(new.decode("utf-8-sig")) == [line.replace("batch_size: " + str(load(original.decode("utf-8-sig"))
                                                                              ["batch_size"]), "batch_size: 64")
                                             for line in body(original.decode("utf-8-sig"))]


def test_a_json_target_with_a_duplicate_key_is_refused_in_one_line(tmp_path):
    file = tmp_path / "dup.json"
    file.write_text('{"train_micro_batch_size_per_gpu": 8, "train_micro_batch_size_per_gpu": 16}\n')
    before = file.read_bytes()
    with pytest.raises(UserError, match=r"dup.json: .*'train_micro_batch_size_per_gpu' appears twice") as e:
        plan(target_for(file, preset="deepspeed"), {"batch_size": 32}, PROVENANCE)
    assert "\n" not in str(e.value)
    assert file.read_bytes() == before and sorted(os.listdir(tmp_path)) == ["dup.json"]


def test_old_backups_are_pruned_and_stale_temp_files_cleaned(tmp_path):
    file = copy("plain.yaml", tmp_path)
    stale, fresh = tmp_path / ".plain.yaml.crashed.tmp", tmp_path / ".plain.yaml.writing.tmp"
    stale.write_text("half a write")
    fresh.write_text("another apply, writing now")
    os.utime(stale, (0, 0))
    target = target_for(file)
    original = file.read_bytes()
    backups = [write(plan(target, {"batch_size": size}, PROVENANCE)) for size in (2, 4, 8, 16, 32, 64, 128)]
    kept = sorted(tmp_path.glob("plain.yaml.bench-backup-*"))
    # the newest, and the oldest: your file before bench first wrote it (an audit's six applies had pruned it)
    assert kept == sorted([backups[0], *backups[-_write.KEEP_BACKUPS:]])
    assert backups[0].read_bytes() == original
    assert not stale.exists() and fresh.exists()


def test_pruning_a_bracketed_files_backups_leaves_other_files_alone(tmp_path):
    # cfg[12].yaml taken as a glob pattern matched cfg1.yaml's and cfg2.yaml's backups: six of them, so
    # the oldest was deleted as if it were its own, and its own were never pruned
    others = []
    for name in ("cfg1.yaml", "cfg2.yaml"):
        other = copy("plain.yaml", tmp_path).rename(tmp_path / name)
        others += [write(plan(target_for(other), {"batch_size": size}, PROVENANCE)) for size in (2, 4, 8)]
    file = copy("plain.yaml", tmp_path).rename(tmp_path / "cfg[12].yaml")
    mine = [write(plan(target_for(file), {"batch_size": size}, PROVENANCE)) for size in (2, 4, 8, 16, 32, 64, 128)]
    assert all(p.exists() for p in others)
    kept = sorted(p for p in tmp_path.iterdir() if p.name.startswith("cfg[12].yaml.bench-backup-"))
    assert kept == sorted([mine[0], *mine[-_write.KEEP_BACKUPS:]])


def test_a_stale_comment_on_a_flow_mappings_line_is_found_too(tmp_path):
    """Block style warned about `# flow, batch_size 8`; the same comment after a flow mapping was missed."""
    file = tmp_path / "train.yaml"
    file.write_text("data: {batch_size: 8, workers: 2}   # batch_size 8\ntrainer: {precision: 32-true}\n")
    p = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}), {"batch_size": 32}, PROVENANCE)
    assert len(p.warnings) == 1 and "the comment '# batch_size 8' quotes 8, its old value" in p.warnings[0], p.warnings
    quiet = tmp_path / "quiet.yaml"
    quiet.write_text("data: {batch_size: 8, name: 'a # 8'}\ntrainer: {precision: 32-true}\n")
    assert plan(target_for(quiet, preset="lightning", keys={"batch_size": "data.batch_size"}),
                {"batch_size": 32}, PROVENANCE).warnings == ()  # a # inside a quoted value is no comment


def test_a_comment_listing_the_choices_is_not_stale_but_one_quoting_the_old_value_is(tmp_path):
    file = tmp_path / "train.yaml"
    file.write_text("data:\n  batch_size: 8   # effective batch 8\n"
                    "trainer:\n  precision: 32-true   # 32-true | bf16-mixed | 16-mixed\n  accumulate_grad_batches: 1\n")
    p = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}),
             {"batch_size": 32, "precision": "bf16-mixed"}, PROVENANCE)
    assert len(p.warnings) == 1 and "data.batch_size" in p.warnings[0] and "quotes 8" in p.warnings[0]
    assert p.warnings[0].startswith("train.yaml:")
    to = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}),
              {"batch_size": 32, "precision": "bf16-mixed"}, PROVENANCE, to=tmp_path / "best.yaml")
    line = int(to.warnings[0].split(":")[1])  # the line in the file written, so it names that file
    assert to.warnings[0].startswith("best.yaml:") and "# effective batch 8" in to.new_text.splitlines()[line - 1]
    for folder in ("", tmp_path):
        with pytest.raises(UserError, match="is a folder, not a file; give a file like train.best.yaml"):
            plan(target_for(file), {"batch_size": 32}, PROVENANCE, to=Path(folder))


def test_a_comment_on_the_effective_batch_that_still_holds_is_not_called_stale(tmp_path):
    """batch 32 x accumulation 1 -> 16 x 2: `# effective batch 32` quotes the old batch size, and is still
    true. apply says so, and asks the user to check it rather than to update it."""
    file = tmp_path / "train.yaml"
    file.write_text("data:\n  batch_size: 32   # effective batch 32\n"
                    "trainer:\n  precision: 32-true\n  accumulate_grad_batches: 1   # 1: no accumulation\n")
    target = target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"})
    p = plan(target, {"batch_size": 16, "accumulation": 2}, PROVENANCE, current_values=read_current(target))
    # it says "effective batch 32", and 16 x 2 is 32: it holds, so nothing is said (an audit's false warning)
    assert not any("data.batch_size" in w for w in p.warnings), p.warnings
    accumulation = next(w for w in p.warnings if "accumulate_grad_batches" in w)
    assert "quotes 1, its old value; update the comment" in accumulation  # not an effective batch
    file.write_text(file.read_text().replace("# effective batch 32", "# 32 per step"))  # which batch? ask
    p = plan(target, {"batch_size": 16, "accumulation": 2}, PROVENANCE, current_values=read_current(target))
    batch = next(w for w in p.warnings if "data.batch_size" in w)
    assert "quotes 32, its old value, and the new effective batch; check the comment still holds" in batch
    file.write_text(file.read_text().replace("# 32 per step", "# effective batch 32"))
    p = plan(target, {"batch_size": 16, "accumulation": 1}, PROVENANCE, current_values=read_current(target))
    assert "quotes 32, its old value; update the comment" in p.warnings[0]  # now it is stale


def test_a_size_in_a_comment_that_happens_to_equal_the_old_value_is_a_figure_not_a_quote(tmp_path):
    """An audit's `batch_size: 16  # per device; fits a 16 GB card`, applied at batch 32, was said to quote
    16, "its old value": that 16 is the card's size. It is a figure measured at the old value, said so."""
    file = tmp_path / "train.yaml"
    file.write_text("data:\n  batch_size: 16   # per device; fits a 16 GB card\n"
                    "trainer:\n  precision: 32-true\n  accumulate_grad_batches: 1\n")
    p = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}), {"batch_size": 32}, PROVENANCE)
    assert len(p.warnings) == 1 and "quotes 16" not in p.warnings[0], p.warnings
    assert "gives a figure (16 GB) measured before the change from 16; check the comment still holds" in p.warnings[0]
    # the old value as a value still counts, beside a figure
    file.write_text(file.read_text().replace("# per device; fits a 16 GB card", "# 16 per device; fits a 16 GB card"))
    p = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}), {"batch_size": 32}, PROVENANCE)
    assert "quotes 16, its old value; update the comment" in p.warnings[0], p.warnings
    # nor does a size equal to the new value name it: "fits a 32 GB card" at batch 8 -> 32 is still a figure
    file.write_text(file.read_text().replace("# 16 per device; fits a 16 GB card", "# fits a 32 GB card"))
    p = plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}), {"batch_size": 32}, PROVENANCE)
    assert len(p.warnings) == 1 and "gives a figure (32 GB)" in p.warnings[0], p.warnings


def test_a_comment_giving_a_figure_measured_at_the_old_value_is_flagged(tmp_path):
    """The quickstart's `batch_size: 8  # per GPU; 14% of a 24 GB card at this size` quotes no old value
    and was left unflagged after apply wrote batch 128: its 14% was measured at batch 8."""
    file = tmp_path / "train.yaml"
    file.write_text("data:\n  batch_size: 8   # per GPU; 14% of a 24 GB card at this size (nvidia-smi)\n"
                    "  num_workers: 4   # 2.5 GB of RAM each\n"
                    "trainer:\n  precision: 32-true   # full precision\n  accumulate_grad_batches: 1\n"
                    "model:\n  compile: false   # 310 samples/s eager\n")
    keys = {"batch_size": "data.batch_size", "compile": {"key": "model.compile", "values": {"off": False, "default": True}}}
    p = plan(target_for(file, preset="lightning", keys=keys), {"batch_size": 128, "compile": "default"}, PROVENANCE)
    assert len(p.warnings) == 2, p.warnings
    assert "data.batch_size: the comment" in p.warnings[0] and \
        "gives a figure (14%) measured before the change from 8; check the comment still holds" in p.warnings[0]
    line = int(p.warnings[0].split(":")[1])  # in the text written (the provenance block above shifts it)
    assert "batch_size: 128" in p.new_text.splitlines()[line - 1]
    assert "model.compile" in p.warnings[1] and "(310 samples/s)" in p.warnings[1] and "from false;" in p.warnings[1]
    # a comment without a figure, a figure on a line not changed, a number that is no figure: nothing
    file.write_text("data:\n  batch_size: 8   # per GPU, on 4 GPUs\n  num_workers: 4   # 2.5 GB of RAM each\n"
                    "trainer:\n  precision: 32-true   # full precision, layer 12\n  accumulate_grad_batches: 1\n")
    assert plan(target_for(file, preset="lightning", keys={"batch_size": "data.batch_size"}),
                {"batch_size": 16, "precision": "bf16-mixed"}, PROVENANCE).warnings == ()


def test_a_parse_error_without_a_message_still_names_something():
    from ruamel.yaml import YAMLError
    from harness.apply._document import _problem
    assert _problem(YAMLError(), "a: 1\n") == "YAMLError"


def test_a_learning_rate_or_a_dataset_length_is_not_another_model_size(tmp_path):
    """`lr: 3.0e-4` in the target against the tiny preset's lr 0.01 warned "these numbers are for another
    model size"; so would any training setting named like a preset param."""
    file = tmp_path / "train.yaml"
    file.write_text("model:\n  d_model: 32\n  layers: 2\nlr: 3.0e-4\nsamples: 100000\nmicro_batch_size: 8\n")
    target = target_for(file, preset="plain", keys={"batch_size": "micro_batch_size"})
    tiny = {"name": "gpt", "preset": "tiny", "params": {"vocab": 256, "seq_len": 32, "d_model": 32, "layers": 2,
                                                         "heads": 2, "samples": 256, "lr": 0.01}}
    assert apply.other_model_size(target, tiny, {"batch_size"}) is None
    wider = {**tiny, "params": {**tiny["params"], "d_model": 64}}
    assert "describes model.d_model 32, but preset tiny measured d_model 64" in apply.other_model_size(
        target, wider, {"batch_size"})


@pytest.mark.parametrize("name, text", [
    ("train.json", '{"model": {"d_model": 32, "layers": 2}, "micro_batch_size": 8}\n'),
    ("train.yaml", "data: !ENV ${DATA_DIR}\nmodel:\n  d_model: 32\n  layers: 2\nmicro_batch_size: 8\n"),
])
def test_a_json_config_or_one_with_application_tags_is_checked_for_another_model_size(tmp_path, name, text):
    """The warning read the target with PyYAML's safe_load, and only a YAML one: a JSON config (and a YAML
    one whose `!ENV` tag safe_load refuses) took the CPU stand-in's numbers without a word."""
    file = tmp_path / name
    file.write_text(text)
    target = target_for(file, preset="plain", keys={"batch_size": "micro_batch_size"})
    measured = {"name": "gpt", "preset": "tiny", "params": {"d_model": 64, "layers": 2}}
    assert "describes model.d_model 32, but preset tiny measured d_model 64" in apply.other_model_size(
        target, measured, {"batch_size"})


@pytest.mark.parametrize("text, keys, where", [
    # the last section lacks a key and a new section is made: both insertions fall at the end of the file
    ("# training\ntrain:\n  batch_size: 16   # per device\n  grad_accum: 1\n",
     {"batch_size": "train.batch_size", "precision": "train.amp", "checkpointing": "model.checkpoint"},
     {"train": {"batch_size": 64, "grad_accum": 1, "amp": "bf16-mixed"}, "model": {"checkpoint": "full"}}),
    # a mapping whose last entry is a mapping, keys missing at both levels
    ("a:\n  x: 1\n  b:\n    y: 2\n",
     {"batch_size": "a.b.batch", "precision": "a.amp", "checkpointing": "a.b.ckpt"},
     {"a": {"x": 1, "b": {"y": 2, "batch": 64, "ckpt": "full"}, "amp": "bf16-mixed"}}),
    ("a:\n  x: 1\n  b:\n    y: 2\n",
     {"batch_size": "a.b.batch", "precision": "a.amp", "checkpointing": "c"},
     {"a": {"x": 1, "b": {"y": 2, "batch": 64}, "amp": "bf16-mixed"}, "c": "full"}),
])
def test_keys_created_at_one_place_land_each_under_its_own_mapping(tmp_path, text, keys, where):
    """Insertions at one offset were spliced in the wrong order: the key for the last section landed under
    the new section, and apply stopped with "This is a bench bug" (214 of 1,600 fuzzed configs)."""
    file = tmp_path / "train.yaml"
    file.write_text(text)
    write(plan(target_for(file, keys=keys), {"batch_size": 64, "precision": "bf16-mixed", "checkpointing": "full"},
               {}, create_keys=True))
    assert load(file.read_text()) == where


def test_a_config_with_cr_only_line_ends_is_refused_in_one_line(tmp_path):
    """Classic Mac line ends: --create-keys failed its own check, and a stale-comment warning quoted the
    rest of the file as one comment."""
    file = tmp_path / "train.yaml"
    file.write_bytes(b"train:\r  batch_size: 16   # per device\r  grad_accum: 1\r")
    with pytest.raises(UserError, match=r"train\.yaml: its lines end in CR alone .*convert it to LF"):
        read_current(target_for(file, keys={"batch_size": "train.batch_size"}))
    assert file.read_bytes() == b"train:\r  batch_size: 16   # per device\r  grad_accum: 1\r"


def test_a_stale_comment_on_a_quoted_key_names_its_line_in_the_written_file(tmp_path):
    """`"depth": 4  # 4 blocks` was said at the old file's line 3: the provenance header moved it to 6."""
    file = tmp_path / "train.yaml"
    file.write_text('model:\n  width: 32\n  "depth": 4        # 4 blocks\n')
    p = plan(target_for(file, keys={"depth": "model.depth"}), {"depth": 8}, PROVENANCE)
    line = next(i for i, text in enumerate(p.new_text.splitlines(), 1) if "# 4 blocks" in text)
    assert line > 3 and len(p.warnings) == 1 and p.warnings[0].startswith(f"train.yaml:{line}: model.depth"), p.warnings


def test_an_application_s_yaml_tags_are_kept_and_the_keys_around_them_edited(tmp_path):
    """`data_dir: !ENV ${DATA_DIR}` (pyaml-env) was "not valid YAML", in the sweep and in apply."""
    file = tmp_path / "train.yaml"
    file.write_text("train:\n  batch_size: 16\n  data_dir: !ENV ${DATA_DIR}\n  parts: !include [a.yaml]\n")
    target = target_for(file, keys={"batch_size": "train.batch_size"})
    assert read_current(target)["batch_size"] == 16
    write(plan(target, {"batch_size": 64}, {}))
    assert file.read_text().endswith("train:\n  batch_size: 64\n  data_dir: !ENV ${DATA_DIR}\n  parts: !include [a.yaml]\n")


def test_a_value_only_a_preset_cannot_spell_is_measured_with_a_note_yours_is_refused(tmp_path):
    """hf's gradient_checkpointing has no `selective` (bench applies it itself): worth measuring, so not
    refused before the sweep as a value your own key map forgot is."""
    file = tmp_path / "args.yaml"
    file.write_text("per_device_train_batch_size: 8\ngradient_checkpointing: false\n")
    notes = apply.refuse_unwritable(target_for(file, preset="hf"), {"checkpointing": ["none", "full", "selective"]}, "s.yaml")
    assert notes == ["checkpointing=selective is measured, but the preset hf cannot write it into args.yaml: "
                     "`bench apply` of a config with it refuses (map it under apply.keys.checkpointing.values to write it)"]
    own = target_for(file, keys={"checkpointing": {"key": "gradient_checkpointing", "values": {"none": False, "full": True}}})
    with pytest.raises(UserError, match="s.yaml: .*checkpointing=selective cannot be written: apply.keys.checkpointing"):
        apply.refuse_unwritable(own, {"checkpointing": ["none", "full", "selective"]}, "s.yaml")


@pytest.mark.parametrize("text, expected", [
    # the section's last value is an alias: its node's marks are the anchor's, further up the file
    ("opt: &opt\n  name: adamw\n  wd: 0.01\ntrainer:\n  devices: 1\n  optimizer: *opt\n",
     "trainer:\n  devices: 1\n  optimizer: *opt\n  batch_size: 32\n"),
    ("bs: &bs 8\ntrainer:\n  devices: 1\n  eval_batch: *bs   # same as train\nmodel: x\n",
     "trainer:\n  devices: 1\n  eval_batch: *bs   # same as train\n  batch_size: 32\nmodel: x\n"),
    ("bs: &bs 8\ntrainer:\n  devices: 1\n  sizes:\n  - 4\n  - *bs\nmodel: x\n",
     "trainer:\n  devices: 1\n  sizes:\n  - 4\n  - *bs\n  batch_size: 32\nmodel: x\n"),
    ("base: &base\n  a: 1\ntrainer:\n  devices: 1\n  <<: *base\n",  # a merge last: base.batch_size was made
     "trainer:\n  devices: 1\n  <<: *base\n  batch_size: 32\n"),
    ("bs: &bs 8\ntrainer: {devices: 1, eval_batch: *bs}\n",
     "trainer: {devices: 1, eval_batch: *bs, batch_size: 32}\n"),
    # an empty last value (`plugins:`): its null's mark lies past the blank and comment lines below it
    ("trainer:\n  devices: 1\n  plugins:\n\n# ---- model ----\nmodel:\n  x: 1\n",
     "trainer:\n  devices: 1\n  plugins:\n  batch_size: 32\n\n# ---- model ----\nmodel:\n"),
])
def test_create_keys_goes_after_a_last_value_that_is_an_alias_or_empty(tmp_path, text, expected):
    """A section ending in `optimizer: *opt` got the new key after the anchored mapping's last line, up the
    file: inside `opt:` (bench apply crashed: "produced unexpected values ... a bench bug"), or, at the top
    level, between other keys; one ending in an empty `plugins:` got it below the next section's comment."""
    file = tmp_path / "c.yaml"
    file.write_text(text)
    p = plan(target_for(file, keys={"batch_size": "trainer.batch_size"}), {"batch_size": 32}, {}, create_keys=True)
    assert expected in p.new_text
    assert load(p.new_text)["trainer"]["batch_size"] == 32


def test_create_keys_in_a_flow_mapping_leaves_the_last_entrys_comment_on_its_line(tmp_path):
    """`root: x  # r` as a `{...}` mapping's last entry, one per line: the new entry went between `x` and its
    comment, which then spoke of the new key (`batch_size: 32       # r`)."""
    file = tmp_path / "c.yaml"
    file.write_text("data: {\n  workers: 2,   # w\n  root: x       # r\n}\nprecision: fp32\n")
    p = plan(target_for(file, keys={"batch_size": "data.batch_size"}), {"batch_size": 32}, {}, create_keys=True)
    assert "data: {\n  workers: 2,   # w\n  root: x,      # r\n  batch_size: 32\n}\nprecision: fp32\n" in p.new_text
    assert load(p.new_text)["data"] == {"workers": 2, "root": "x", "batch_size": 32}


def test_a_profile_of_a_key_the_main_config_lacks_says_why_not_to_pass_create_keys(tmp_path):
    """`bench apply best --create-keys` with apply.hydra was refused with "... or pass --create-keys to add it":
    the flag just passed, which cannot help, since the profile may hold only keys the main config has."""
    target = plain_hydra_target(tmp_path, config="batch_size: 8\n")
    with pytest.raises(UserError) as refused:
        write_hydra_profile(target, {"batch_size": 32, "precision": "bf16-mixed"}, "NVIDIA H200", PROVENANCE)
    said = str(refused.value)
    assert "precision" in said and "apply.hydra" in said and "add it to config.yaml" in said
    assert "pass --create-keys" not in said
