"""A mistake in the spec or the user's own config is refused when the spec loads (one line, exit 2, nothing
run or written); one only a trial child can see, but that no knob value changes (a param no function
takes, a mistyped model-config field, no datamodule), stops the sweep at its first trial, not its third."""
import json

import pytest
import yaml

from harness import trial, workloads
from tests.test_bad_input import assert_user_error, nothing_written
from tests.test_own_models import SMALL_CHARLM, SMALL_UNET, copy_example, run


def edit_spec(folder, change):
    spec = yaml.safe_load((folder / "sweep.yaml").read_text())
    change(spec)
    (folder / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))


def stopped_at_first_trial(result, *phrases):
    """The sweep's one stop line (after its notes), after a single trial; the report holds that one trial."""
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1 and "Traceback" not in result.output, result.output
    for phrase in ("stopped: the first trial failed with", *phrases):
        assert phrase in errors[0], (phrase, errors[0])
    rows = json.loads(run("report", "--format", "json").output)
    assert [r["status"] for r in rows] == ["error"], rows


# ---- Hugging Face -------------------------------------------------------------------------------------

def test_a_mistyped_hf_config_field_stops_the_sweep_at_the_first_trial(tmp_path, monkeypatch):
    """`num_hidden_layer: 4` was dropped by AutoConfig: every trial measured the 2-layer model, `ok`."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = copy_example("hf", tmp_path, monkeypatch, search={"batch_size": [4, 8, 16]})
    edit_spec(folder, lambda s: s["workload"]["params"].update(num_hidden_layer=4))
    stopped_at_first_trial(run("sweep", "sweep.yaml", "--device", "cpu"),
                           "num_hidden_layer", "(did you mean 'num_hidden_layers'?)", "config.json")


@pytest.mark.parametrize("how", ["search", "--set"])
def test_bf16_true_inside_transformers_trainer_is_refused_at_load(tmp_path, monkeypatch, how):
    folder = copy_example("hf", tmp_path, monkeypatch)
    if how == "search":
        edit_spec(folder, lambda s: s["search"].update(precision=["fp32", "bf16-true"]))
        result = run("sweep", "sweep.yaml", "--device", "cpu")
    else:
        result = run("trial", "sweep.yaml", "--device", "cpu", "--set", "batch_size=4", "--set", "precision=bf16-true")
    assert_user_error(result, "bf16-true", "TrainingArguments has none", "bf16-mixed")
    assert nothing_written(folder)


# ---- the model form (examples/unet) ---------------------------------------------------------------------

def test_a_near_miss_of_from_in_a_param_is_refused_at_load(tmp_path, monkeypatch):
    """`{form: data.image_size}` went to UNet as a dict: three TypeErrors blamed on unet.py."""
    folder = copy_example("unet", tmp_path, monkeypatch)
    edit_spec(folder, lambda s: s["workload"]["params"].update(image_size={"form": "data.image_size"}))
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"),
                      "sweep.yaml: workload.params.image_size", "'form'", "(did you mean 'from'?)")
    assert nothing_written(folder)


def test_a_param_no_function_takes_stops_the_sweep_at_the_first_trial(tmp_path, monkeypatch):
    folder = copy_example("unet", tmp_path, monkeypatch, search={"batch_size": [4, 8, 16]})
    (folder / "config.yaml").write_text(SMALL_UNET)
    edit_spec(folder, lambda s: s["workload"]["params"].update(widht=4))
    stopped_at_first_trial(run("sweep", "sweep.yaml", "--device", "cpu"), "widht: taken by none of UNet, random_batch")


# ---- a LightningCLI project ---------------------------------------------------------------------------

def lightning(tmp_path, monkeypatch, config: str, **spec):
    folder = copy_example("lightning", tmp_path, monkeypatch, search={"batch_size": [8, 16, 32]}, **spec)
    (folder / "config.yaml").write_text(config)
    return folder


NO_DATA = SMALL_CHARLM[:SMALL_CHARLM.index("data:")] + SMALL_CHARLM[SMALL_CHARLM.index("trainer:"):]


@pytest.mark.parametrize("config, said", [
    (SMALL_CHARLM.replace("  class_path: charlm.CharData\n", ""), "config.yaml's data section has no class_path"),
    (NO_DATA, "config.yaml has no data section"),
], ids=["data-without-class_path", "no-data-section"])
def test_a_trainer_with_no_datamodule_to_take_the_batch_size_is_refused_at_load(tmp_path, monkeypatch, config, said):
    """A data: section without class_path (or none) gave a false "looked for data.batch_size" note, then
    three trials failed with "CharLM has no train_dataloader"."""
    folder = lightning(tmp_path, monkeypatch, config)
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"), "sweep.yaml: workload.lightning", said,
                      "class_path")
    assert nothing_written(folder)


def test_a_module_with_no_data_in_bench_s_loop_stops_the_sweep_at_the_first_trial(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    folder = lightning(tmp_path, monkeypatch, NO_DATA)
    edit_spec(folder, lambda s: s["workload"].update(loop="bench"))
    stopped_at_first_trial(run("sweep", "sweep.yaml", "--device", "cpu"), "CharLM has no train_dataloader")


def test_a_misspelt_class_path_names_the_config_key_and_writes_nothing(tmp_path, monkeypatch):
    """It said "sweep.yaml: workload: cannot import charlm:CharLm" after a trial, and left results/ behind."""
    folder = lightning(tmp_path, monkeypatch, SMALL_CHARLM.replace("charlm.CharLM", "charlm.CharLm"))
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"),
                      "config.yaml", "model.class_path", "charlm.CharLm", "(did you mean 'CharLM'?)")
    assert nothing_written(folder)


@pytest.mark.parametrize("example, key, typo, said", [
    ("unet", "model", "unet:Unet", "(did you mean 'UNet'?)"),
    ("unet", "loss", "unet:dice_bc", "(did you mean 'dice_bce'?)"),
    ("custom", "factory", "tinyvision:buid", "(did you mean 'build'?)"),
])
def test_a_misspelt_name_in_the_spec_is_refused_at_load_with_the_near_one(tmp_path, monkeypatch, example, key, typo, said):
    """It waited for a quiet machine, failed the first trial with "module 'unet' has no attribute 'Unet'"
    and left a study behind; the Lightning form already said it at load."""
    folder = copy_example(example, tmp_path, monkeypatch)
    edit_spec(folder, lambda s: s["workload"].update({key: typo}))
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"), f"workload.{key}", said, "correct the name")
    assert nothing_written(folder)


def test_a_syntax_error_in_your_module_is_refused_at_load_with_its_line(tmp_path, monkeypatch):
    """It waited up to 90 s for a quiet machine, then failed its first trial on the import, and left a study
    whose trial read `interrupted`. Compiled at load (not run: your code runs only in a trial)."""
    folder = copy_example("unet", tmp_path, monkeypatch)
    source = (folder / "unet.py").read_text()
    (folder / "unet.py").write_text(source + "\n\ndef broken(:\n    pass\n")
    line = source.count("\n") + 3
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"), "workload.model",
                      f"unet.py:{line}: SyntaxError: invalid syntax; fix it and re-run")
    assert nothing_written(folder)


def test_a_misspelt_module_is_refused_with_the_near_one(tmp_path, monkeypatch):
    folder = copy_example("unet", tmp_path, monkeypatch)
    edit_spec(folder, lambda s: s["workload"].update(batch="unett:random_batch"))
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"),
                      "workload.batch: cannot find module 'unett' (did you mean 'unet'?)")
    assert nothing_written(folder)


def test_a_missing_apply_target_is_said_as_such(tmp_path, monkeypatch):
    """It asked to give missing.yaml's model section a class_path."""
    folder = lightning(tmp_path, monkeypatch, SMALL_CHARLM)
    edit_spec(folder, lambda s: s["apply"].update(file="missing.yaml"))
    assert_user_error(run("sweep", "sweep.yaml", "--device", "cpu"), "missing.yaml", "apply target not found")
    assert nothing_written(folder)


MODULES_BENCH_CANNOT_TRAIN = {
    "manual-optimization": ("""
class Manual(CharLM):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.automatic_optimization = False
""", "charlm.Manual", "Manual uses manual optimization"),
    "two-optimizers": ("""
class TwoOptimizers(CharLM):
    def configure_optimizers(self):
        half = len(list(self.parameters())) // 2
        return [torch.optim.SGD(list(self.parameters())[:half], lr=0.1),
                torch.optim.SGD(list(self.parameters())[half:], lr=0.1)]
""", "charlm.TwoOptimizers", "configure_optimizers returned 2 optimizers"),
    # said as Lightning's bare "ReadsTrainer is not attached to a `Trainer`."
    "reads-self-trainer": ("""
class ReadsTrainer(CharLM):
    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        steps = self.trainer.estimated_stepping_batches
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.1, steps)}
""", "charlm.ReadsTrainer", "ReadsTrainer reads self.trainer, which bench's own loop (loop: bench) does not have; "
                           "leave out loop: bench to measure it in your Trainer"),
}


@pytest.mark.parametrize("case", MODULES_BENCH_CANNOT_TRAIN, ids=list(MODULES_BENCH_CANNOT_TRAIN))
def test_a_module_bench_cannot_train_stops_the_sweep_at_the_first_trial(tmp_path, monkeypatch, case):
    """Manual optimization or two optimizers fail alike at every batch size: three trials ran before the stop."""
    pytest.importorskip("lightning")
    source, class_path, said = MODULES_BENCH_CANNOT_TRAIN[case]
    folder = lightning(tmp_path, monkeypatch, SMALL_CHARLM.replace("charlm.CharLM", class_path))
    with (folder / "charlm.py").open("a") as module:
        module.write(source)
    edit_spec(folder, lambda s: s["workload"].update(loop="bench"))
    stopped_at_first_trial(run("sweep", "sweep.yaml", "--device", "cpu"), said)


def test_an_iterable_dataset_stops_the_sweep_at_the_first_trial(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    folder = lightning(tmp_path, monkeypatch, SMALL_CHARLM.replace("charlm.CharData", "charlm.StreamData"))
    with (folder / "charlm.py").open("a") as module:
        module.write("""
class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(())


class StreamData(CharData):
    def train_dataloader(self):
        return torch.utils.data.DataLoader(Stream(), batch_size=self.batch_size)
""")
    edit_spec(folder, lambda s: s["workload"].update(loop="bench"))
    stopped_at_first_trial(run("sweep", "sweep.yaml", "--device", "cpu"), "StreamData.train_dataloader() yields an "
                           "IterableDataset")


# A model brought as it is that imports Lightning or transformers, on an install without the extra
# (README, "Bring your own model": `pip install -e ".[lightning]"` / `".[hf]"`): the sweep's one line
# says which extra to install, not only "No module named 'lightning'".
@pytest.mark.parametrize("missing, extra", [("lightning", "lightning"), ("lightning.pytorch", "lightning"),
                                            ("transformers", "hf")])
def test_a_missing_extra_is_named_with_its_install_line(monkeypatch, missing, extra):
    def load(ref):
        raise ModuleNotFoundError(f"No module named '{missing}'", name=missing)
    monkeypatch.setattr(workloads, "load_factory", load)
    with pytest.raises(trial.FactoryImportError) as caught:
        trial.import_factory("charlm:CharLM")
    message = str(caught.value)
    assert message.startswith("cannot import charlm:CharLM: ModuleNotFoundError: No module named")
    assert f'pip install -e ".[{extra}]"' in message


def test_a_module_of_your_own_that_is_missing_gets_no_install_line(monkeypatch):
    def load(ref):
        raise ModuleNotFoundError("No module named 'charlm'", name="charlm")
    monkeypatch.setattr(workloads, "load_factory", load)
    with pytest.raises(trial.FactoryImportError) as caught:
        trial.import_factory("charlm:CharLM")
    assert "pip install" not in str(caught.value)


def test_the_hf_form_without_transformers_says_which_extra_in_one_line(tmp_path):
    """The hf form imports transformers while bench builds the workload, not from a factory of yours: the
    trial failed with a bare "No module named 'transformers'" (a sweep ran three such trials before stopping)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    shutil.copytree(root / "examples" / "hf", tmp_path / "hf")
    shadow = tmp_path / "shadow" / "transformers"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'transformers'\", name='transformers')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow"), "BENCH_QUICK": "2"}
    done = subprocess.run([sys.executable, "-m", "harness", "trial", "sweep.yaml", "--device", "cpu"], cwd=tmp_path / "hf",
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert 'pip install -e ".[hf]"' in done.stderr, done.stderr
