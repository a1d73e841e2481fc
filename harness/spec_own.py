"""The spec's `workload:` forms for a user's model as it is, and params read from the apply target.

Forms (exactly one per spec, besides the built-in `name:`):
    factory: "pkg.mod:build"                          build(params) -> harness.workloads.Workload
    model: "pkg.mod:Class", loss: "...", batch: "..." a model class, loss(out, y), batch(batch_size) -> (x, y)
    lightning: {model: "pkg.mod:Lit", data: "..."}   a LightningModule (+ LightningDataModule)
    hf: {config: path, task: causal-lm}               a transformers model from a local config
A Lightning or Hugging Face model trains in its own Trainer (`loop: trainer`, the default), built
from the apply target's `trainer:` section or TrainingArguments file; `loop: bench` trains it in
bench's own loop.

Params may come from the apply target (the user's own config) so nothing is written twice:
`params_from: model` takes a whole section (its `init_args` when it is LightningCLI-style
`class_path` + `init_args`), `params: {width: {from: model.width}}` one key. A searched param read
this way is written back to the key it came from, without an `apply.keys` entry.
Parent side: never imports torch or the user's code.
"""
from __future__ import annotations

import importlib.util
import keyword
import re
import sys
import warnings
from pathlib import Path

from harness.errors import UserError, as_written, did_you_mean
from harness.spec_yaml import read_yaml

FORMS = ("name", "factory", "model", "lightning", "hf")
HF_TASKS = ("causal-lm", "masked-lm", "sequence-classification")
LOOPS = ("trainer", "bench")
_MISSING = object()


def own_form(wl: dict, where: str, base_dir: Path, raw_apply, check_ref) -> dict:
    """The child's workload section for the `model` / `lightning` / `hf` forms, params resolved."""
    target = Target(raw_apply, base_dir, where)
    section: dict = {}
    if "model" in wl:
        for key in ("model", "loss", "batch"):
            if key not in wl:
                raise UserError(f"{where}: workload.{key} is missing; the model form needs model (a class), "
                                "loss (loss(output, target)) and batch (batch(batch_size) -> (inputs, target))")
            section[key] = check_ref(wl[key], f"workload.{key}")
    elif "lightning" in wl:
        section["loop"] = loop(wl, where)
        section["lightning"] = lightning_refs(wl["lightning"], target, where, check_ref)
        if "data" not in section["lightning"]:
            check_no_datamodule(target, where, needs_one=section["loop"] == "trainer" and "batch" not in wl)
        data_section = target.section("data") if target.has("data") else {}
        section["data_params"] = {k: v for k, v in data_section.items()}
        if section["loop"] == "trainer":  # the user's trainer settings, as LightningCLI passes them to Trainer
            section["trainer_args"] = target.section("trainer") if target.has("trainer") else {}
    else:
        section["hf"] = hf_section(wl["hf"], base_dir, where)
        section["loop"] = loop(wl, where)
        if section["loop"] == "trainer":  # the apply target is the user's TrainingArguments file
            section["training_args"] = target.arguments() if target.file is not None and target.file.exists() else {}
    if "batch" in wl and "batch" not in section:
        section["batch"] = check_ref(wl["batch"], "workload.batch")
    default_from = "model" if "lightning" in wl else None
    params, origins = resolve_params(wl, target, where, default_from)
    section["params"] = params
    section["strict"] = [k for k in (wl.get("params") or {})]
    section["origins"] = origins
    return section


def check_loop_form(wl: dict, where: str) -> None:
    """`loop` picks a framework's Trainer or bench's loop; other forms always train in bench's loop."""
    if "loop" in wl and not ("lightning" in wl or "hf" in wl):
        raise UserError(f"{where}: workload.loop only applies to the lightning and hf forms (their own Trainer "
                        "or bench's loop); remove it")


def loop(wl: dict, where: str) -> str:
    """Where a Lightning or Hugging Face model trains: its own Trainer (default) or bench's loop."""
    value = wl.get("loop", "trainer")
    if value not in LOOPS:
        raise UserError(f"{where}: workload.loop must be trainer (the framework's own Trainer) or bench "
                        f"(bench's training loop), got {as_written(value)}")
    return value


def check_trainer_knobs(workload: dict, search: dict, fixed: dict, where: str) -> None:
    """The knob values the user's Trainer cannot run, refused at load rather than by every trial."""
    for knob in ("parallel", "precision"):
        for value in search[knob].choices if knob in search else (fixed.get(knob),):
            if why := trainer_refusal(workload, knob, value):
                raise UserError(f"{where}: search.{knob}: {why}")


def check_trainer_config(workload: dict, config: dict) -> None:
    """One `bench trial --set` config, as check_trainer_knobs checks a search."""
    for knob, value in config.items():
        if why := trainer_refusal(workload, knob, value):
            raise UserError(f"--set {knob}={value}: {why}")


def trainer_refusal(workload: dict, knob: str, value) -> str | None:
    """Why knob=value cannot run inside the user's Trainer (bench's own loop can), or None. Several
    processes share the model through the Trainer's own DDP: fsdp is refused rather than run as something
    else; transformers' TrainingArguments has only mixed bf16."""
    if workload.get("loop") != "trainer":
        return None
    if knob == "parallel" and value == "fsdp":
        return ("fsdp inside the Trainer is not supported yet (its DDP is); search parallel: [none, ddp], "
                "or set workload.loop: bench to shard with FSDP2")
    if knob == "precision" and value == "bf16-true" and "hf" in workload:
        return ("bf16-true inside transformers.Trainer: TrainingArguments has none (its bf16 is mixed "
                "precision); search bf16-mixed, or set workload.loop: bench")
    return None


def lightning_refs(raw, target: "Target", where: str, check_ref) -> dict:
    refs = {"model": raw} if isinstance(raw, str) else {} if raw is True else raw
    if not isinstance(refs, dict) or set(refs) - {"model", "data"}:
        raise UserError(f"{where}: workload.lightning must be \"module:Class\", {{model: \"module:Class\", "
                        f"data: \"module:DataModule\"}}, or true (the classes of the config's class_path), got {as_written(raw)}")
    out = {}
    for part in ("model", "data"):
        ref = refs.get(part) or target.class_path(part)
        if ref:  # a mistake in a class_path is said where it is: in the config, not the spec
            at = f"workload.lightning.{part}" if refs.get(part) else \
                f"workload.lightning: {part}.class_path {ref.replace(':', '.')} in {target.file}"
            out[part] = check_ref(ref, at)
    if "model" not in out:
        raise UserError(f"{where}: workload.lightning.model: name the LightningModule class (\"module:Class\"), "
                        f"or give {target.file}'s model section a class_path")
    return out


def check_no_datamodule(target: "Target", where: str, needs_one: bool) -> None:
    """No datamodule class was named. A data: section's arguments then have no class to go to (LightningCLI
    refuses it too), and the Trainer has no batch size to set: a module's own train_dataloader sets its own."""
    if target.has("data"):
        raise UserError(f"{where}: workload.lightning: {target.file}'s data section has no class_path, so its "
                        "arguments have no datamodule to build; give it class_path: module.DataModule, or name the "
                        "class in workload.lightning.data")
    if needs_one:
        said = f"{target.file} has no data section" if target.file is not None else "no datamodule is named"
        raise UserError(f"{where}: workload.lightning: {said}, and bench sets the Trainer's batch size through a "
                        "LightningDataModule's batch_size; add a data: section with a class_path (module.DataModule), "
                        "name the class in workload.lightning.data, or give a batch function (workload.batch)")


def check_defined(ref: str, paths: list[str], at: str) -> None:
    """A name the module's source never spells cannot be imported from it: refused at load, when the
    source is a plain top-level .py file (found, not imported: importing it is user code) that makes no names
    the text does not spell (a star import, a module __getattr__)."""
    module, _, name = ref.partition(":")
    origin = module_file(module, paths)
    if origin is None:
        return
    source = origin.read_text(errors="replace")
    try:  # compiled, not run: a syntax error is said now, not after the sweep waited for its first trial
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning (an invalid escape) is Python's to say, in the trial
            compile(source, str(origin), "exec")
    except SyntaxError as e:
        raise UserError(f"{at}: {origin}:{e.lineno}: {type(e).__name__}: {e.msg}; fix it and re-run") from None
    except ValueError as e:  # a NUL byte, before Python 3.12
        raise UserError(f"{at}: {origin}: {e}; fix it and re-run") from None
    if "import *" in source or "__getattr__" in source or re.search(rf"\b{re.escape(name)}\b", source):
        return
    defined = re.findall(r"^(?:class|def|async def)\s+(\w+)|^(\w+)\s*[:=]", source, re.MULTILINE)
    names = [a or b for a, b in defined if not keyword.iskeyword(a or b)]  # `else:` is no name
    raise UserError(f"{at}: {origin} defines no {name}{did_you_mean(name, names)}; correct the name")


def module_file(module: str, paths: list[str]) -> Path | None:
    """The .py file of a top-level module, found as import would find it; None for a package or a dotted name."""
    if "." in module:
        return None
    saved = list(sys.path)
    sys.path[:0] = paths
    try:
        found = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None
    finally:
        sys.path[:] = saved
    origin = found.origin if found is not None and found.submodule_search_locations is None else None
    return Path(origin) if origin and origin.endswith(".py") and Path(origin).is_file() else None


def hf_section(raw, base_dir: Path, where: str) -> dict:
    if not isinstance(raw, dict) or "config" not in raw or set(raw) - {"config", "task"}:
        raise UserError(f"{where}: workload.hf must be {{config: path/to/config.json, task: causal-lm}}, got {as_written(raw)}")
    config = (base_dir / str(raw["config"])).resolve()
    if not config.exists():
        raise UserError(f"{where}: workload.hf.config: {config} not found; give a local config.json (or its folder) "
                        "relative to the spec; bench never downloads one")
    task = raw.get("task", "causal-lm")
    if task not in HF_TASKS:
        raise UserError(f"{where}: workload.hf.task: {task!r} unknown; use one of {', '.join(HF_TASKS)}")
    return {"config": str(config), "task": task}


def resolve_params(wl: dict, target: "Target", where: str, default_from: str | None) -> tuple[dict, dict]:
    """params (with `from:` references read) over the `params_from` section; and param -> key path."""
    params, origins = {}, {}
    section_key = wl.get("params_from", default_from)
    if section_key is not None and (section_key != default_from or target.has(section_key)):
        if not isinstance(section_key, str):
            raise UserError(f"{where}: workload.params_from must be a key path of the apply target, like model")
        section = target.section(section_key)
        prefix = target.args_path(section_key)
        params.update(section)
        origins.update({k: f"{prefix}.{k}" for k in section})
    for name, value in (wl.get("params") or {}).items():
        check_from_spelling(name, value, where)
        if isinstance(value, dict) and set(value) == {"from"}:
            path = value["from"]
            params[name], origins[name] = target.value(path, f"workload.params.{name}"), target.real_path(path)
        else:
            params[name] = value
            origins.pop(name, None)
    return params, origins


def check_from_spelling(name: str, value, where: str) -> None:
    """`{form: data.image_size}` would reach the model as a mapping, and fail in the user's code."""
    if isinstance(value, dict) and len(value) == 1 and "from" not in value:
        key = str(next(iter(value)))
        if close := did_you_mean(key, ["from"]):
            raise UserError(f"{where}: workload.params.{name}: unknown key {key!r}{close}; "
                            f"write {name}: {{from: dotted.key}} to read the value from the apply target")


class Target:
    """The apply target as plain values, read only when the workload section refers to it."""

    def __init__(self, raw_apply, base_dir: Path, where: str):
        self.raw_apply, self.base_dir, self.where = raw_apply, base_dir, where
        self._data = None

    @property
    def file(self) -> Path | None:
        if isinstance(self.raw_apply, dict) and isinstance(self.raw_apply.get("file"), str):
            return (self.base_dir / self.raw_apply["file"]).resolve()
        return None

    def data(self) -> dict:
        if self._data is None:
            if self.file is None:
                raise UserError(f"{self.where}: workload params read from the user's config need apply.file; "
                                "name the config file there")
            self._data = read_yaml(self.file, "apply target")
        return self._data

    def has(self, path: str) -> bool:
        return self.file is not None and self.file.exists() and self._walk(path) is not _MISSING

    def _walk(self, path: str):
        """The value at a dotted path; a LightningCLI `init_args` level may be left out of it."""
        node = self.data()
        for part in str(path).split("."):
            if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
                node = node["init_args"]
            if not isinstance(node, dict) or part not in node:
                return _MISSING
            node = node[part]
        return node

    def real_path(self, path: str) -> str:
        """The dotted path with the `init_args` levels it passes through, as apply writes it."""
        node, out = self.data(), []
        for part in str(path).split("."):
            if isinstance(node, dict) and part not in node and isinstance(node.get("init_args"), dict):
                node, out = node["init_args"], out + ["init_args"]
            node, out = node[part], out + [part]
        return ".".join(out)

    def value(self, path, at: str):
        if not isinstance(path, str) or not path:
            raise UserError(f"{self.where}: {at}.from must be a dotted key path like model.width, got {path!r}")
        found = self._walk(path)
        if found is _MISSING:
            if group := self.hydra_group(path.split(".")[0]):
                raise UserError(f"{self.where}: {at}: from {path}: {self.file} takes {group} from its defaults list "
                                "(a Hydra config group), which bench does not compose; give the value under "
                                "workload.params instead")
            raise UserError(f"{self.where}: {at}: from {path}: no such key in {self.file}"
                            f"{did_you_mean(path, self.key_paths())}; check the key path (dotted, like model.width)")
        return found

    def hydra_group(self, head: str) -> str | None:
        """'model: small' where the file's Hydra defaults list picks a group `head` the file itself lacks."""
        defaults = self.data().get("defaults")
        for entry in defaults if isinstance(defaults, list) else []:
            if isinstance(entry, dict) and len(entry) == 1 and str(next(iter(entry))).lstrip("/") == head:
                return f"{head}: {next(iter(entry.values()))}"
        return None

    def key_paths(self, node=None, prefix: str = "") -> list[str]:
        """Every dotted key path of the file (a LightningCLI `init_args` level left out, as `_walk` allows)."""
        node = self.data() if node is None else node
        paths = []
        for key, value in (node.items() if isinstance(node, dict) else []):
            if key == "init_args":  # a level the key path may leave out
                paths += self.key_paths(value, prefix)
            else:
                paths += [f"{prefix}{key}", *self.key_paths(value, f"{prefix}{key}.")]
        return paths

    def section(self, path: str) -> dict:
        found = self.value(path, f"workload.params_from {path}")
        if isinstance(found, dict) and "class_path" in found:
            found = found.get("init_args") or {}
        if not isinstance(found, dict):
            raise UserError(f"{self.where}: workload.params_from: {path} in {self.file} is a "
                            f"{type(found).__name__}, not a mapping of arguments")
        return found

    def args_path(self, path: str) -> str:
        found = self._walk(path)
        real = self.real_path(path)
        return f"{real}.init_args" if isinstance(found, dict) and "class_path" in found else real

    def arguments(self) -> dict:
        """The whole target as keyword arguments (a TrainingArguments file)."""
        data = self.data()
        if not isinstance(data, dict):
            raise UserError(f"{self.where}: {self.file} holds a {type(data).__name__}, not TrainingArguments' keys")
        return data

    def class_path(self, path: str) -> str | None:
        """LightningCLI's class_path ("pkg.mod.Class") as "pkg.mod:Class", when the section has one; a
        target file that is not there is said as such, not as a section without a class_path."""
        if self.file is None:
            return None
        found = self._walk(path)
        if isinstance(found, dict) and isinstance(found.get("class_path"), str):
            module, _, name = found["class_path"].rpartition(".")
            return f"{module}:{name}"
        return None
