"""`bench`: parse, call, print. Every UserError becomes one line on stderr and exit code 2."""
from __future__ import annotations

import contextlib
import datetime
import functools
import io
import json
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import click
from rich.console import Console
from rich.markup import escape

from harness import __version__, apply, busy, knobs, launch, ledger, nvml, pareto, record, report, spec as specs, storage as stores, study as studies
from harness.errors import UserError
from harness.live import LiveProgress, outcome, unread_note
from harness.record import Record, leak_words
from harness.units import count, is_whole, parse_duration, parse_size, size
from harness.workloads import WORKLOADS

MIN_COLUMNS = 40
"""The narrowest table `bench report` prints, whatever COLUMNS says (one value per line fits in it)."""
out = Console(soft_wrap=True)  # progress lines stay whole in logs and pipes
err = Console(stderr=True)


def a_results_folder(ctx, param, value):
    """--results '' wrote the study into the current folder, without the .gitignore a results folder gets."""
    if not value.strip():
        raise click.BadParameter(f"{value!r} is empty; name the folder that holds the studies, or leave --results out")
    return Path(value)


results_option = click.option("--results", type=click.Path(), default="results", show_default=True,
                              callback=a_results_folder, help="Folder that holds the studies (embedded storage and logs).")


def a_file(ctx, param, value):
    """--to '' and --out '': click's Path reads an empty name as ".", which was then said to be a folder."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} is empty; name a file, or leave {param.opts[0]} out")
    return None if value is None else Path(value)


def a_scenario(ctx, param, value):
    """--scenario '' named no scenario and ran (or showed) the spec without any: refused as the typo it is."""
    for name in (value if isinstance(value, tuple) else (value,)):
        if name is not None and not name.strip():
            raise click.BadParameter(f"{name!r} is empty; name one of the spec's scenarios, or leave --scenario out")
    return value


scenario_option = click.option("--scenario", metavar="NAME", callback=a_scenario, help="The study of this scenario of the same spec.")


def a_storage(ctx, param, value):
    """--storage '' used the results folder's journal, as if it were left out: refused as the typo it is."""
    if value is not None and not value.strip():
        raise click.BadParameter(f"{value!r} is empty; give a storage URL (e.g. sqlite:///bench.db), or leave --storage out")
    return value


storage_option = click.option("--storage", metavar="URL", callback=a_storage,
                              help="Any Optuna storage URL instead of the embedded one.")


def user_errors(fn):
    """UserError -> one line, exit 2 (a traceback only with --debug). Bugs keep their tracebacks. Ctrl-C
    that a command does not catch itself (a sweep and a trial stop their trial) -> one line, exit 130,
    not click's "Aborted!" and exit 1."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as exc:  # launch.Stopped (SIGTERM, SIGHUP) carries its own exit code
            err.print(f"{str(exc) or 'interrupted'}: the command stopped", highlight=False, soft_wrap=True)
            sys.exit(getattr(exc, "exit_code", 130))
        except UserError as exc:
            if click.get_current_context().find_root().params.get("debug"):
                traceback.print_exc()  # the traceback asked for, and still the user's error's exit code
            say_error(str(exc))
    return wrapper


def stopped_by_signals(fn):
    """SIGTERM and SIGHUP stop the command as Ctrl-C does (launch.stop_signals_interrupt): one line, and a main
    config and its Hydra profile written together both put back; by default they ended it between the two."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with launch.stop_signals_interrupt():
            return fn(*args, **kwargs)
    return wrapper


def note(line: str) -> None:
    """A note on stderr beside a command's output, its text the user's (not markup)."""
    err.print(f"note: {escape(line)}", highlight=False, soft_wrap=True)


def say_error(message: str) -> None:
    """One line on stderr, exit 2. Escaped: the message quotes user input, which is not markup, and can
    hold a line break (a file name may), shown as \\n so the error stays one line."""
    one_line = record.printable(message.strip().replace("\r", "\\r").replace("\n", "\\n"))
    err.print(f"[red]error:[/red] {escape(one_line)}", highlight=False, soft_wrap=True)
    sys.exit(2)


@contextlib.contextmanager
def one_line_usage_errors():
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:
        raise
    except click.UsageError as exc:
        where = f"; see `{exc.ctx.command_path} --help`" if exc.ctx else ""
        say_error(exc.format_message().rstrip(".") + where)


class WholeHelp(click.Command):
    """`bench --help` lists each command's whole first paragraph, wrapped, never cut with "..."."""

    def get_short_help_str(self, limit: int = 45) -> str:
        return " ".join((self.short_help or self.help or "").split("\n\n")[0].split())


class Bench(click.Group):
    """Usage errors (a bad option value, an unknown option) are one line and exit 2 too, not click's block."""

    command_class = WholeHelp

    def make_context(self, *args, **kwargs):
        with one_line_usage_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with one_line_usage_errors():
            return super().invoke(ctx)


@click.group(cls=Bench, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks for user errors too.")
@click.version_option(__version__, prog_name="bench")
def main(debug: bool) -> None:
    """Find the fastest training config that fits your GPU, by measuring short real trials."""


# ---- sweep ---------------------------------------------------------------------------------------

@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--trials", default="auto", show_default=True, metavar="N|auto",
              help="Trials the study should hold; auto stops once no config left is predicted to beat "
                   "the best by more than its noise, with the spec's `trials` as the cap.")
@click.option("--timeout", "timeout", metavar="DURATION", help="Stop starting trials after this long, e.g. 30m.")
@click.option("--device", metavar="auto|cpu|cuda|cuda:N", default="auto", show_default=True,
              help="auto: CUDA when a GPU is seen, else the CPU.")
@click.option("--study", "study_name", metavar="NAME", help="Study name (default: the spec's).")
@click.option("--scenario", "scenarios", metavar="NAME", multiple=True, callback=a_scenario, help="Run only this scenario (repeatable).")
@click.option("--memory-budget", metavar="SIZE", help="Run trials under this memory, e.g. 24GiB.")
@storage_option
@results_option
@user_errors
def sweep(spec_path, trials, timeout, device, study_name, scenarios, memory_budget, storage, results):
    """Run (or resume) the study of SPEC: short real trials over the search space."""
    fixed_total = None if trials == "auto" else parse_trials(trials)
    device = resolve_device(device)
    deadline = time.monotonic() + timeout_option(timeout, "timeout_s", "a sweep") if timeout is not None else None
    busy.wait_budget(), stores.heartbeat_s(), stores.retry_s()  # a typo in a BENCH_* variable is said before a study is made
    # a database study writes nothing under the current folder; trial logs only where --results says
    logs = results if not storage or click.get_current_context().get_parameter_source("results").name != "DEFAULT" else None
    # every scenario is checked against the device before the first trial runs; what it drops is said once
    # its study is open (a refused resume is one line)
    specs_to_run, device_notes = [], []
    for spec in load_specs(spec_path, scenarios, study_name, memory_budget):
        device_notes.append([])
        specs_to_run.append(device_spec(spec, device, say=device_notes[-1].append))
    if len(specs_to_run) > 1:
        check_scenarios(specs_to_run, device, storage, results)
    started = time.monotonic()  # --timeout, else each spec's own `timeout:`, counts from the command's start
    choices = [run_sweep(spec, device, fixed_total or spec.trials,
                         deadline or (started + spec.timeout_s if spec.timeout_s else None),
                         storage, logs, auto=fixed_total is None, notes=said)
               for spec, said in zip(specs_to_run, device_notes)]
    for spec, choice in zip(specs_to_run, choices):  # the answer, in the report's own lines
        if choice.best is not None and not report.spoiled(choice):
            study = f"study {spec.study}: " if len(specs_to_run) > 1 else ""
            for line in report.headline(choice):
                if not line.startswith("headroom left"):
                    out.print(escape(study + line), soft_wrap=True)
    out.print(last_line(specs_to_run, choices, device))



def timeout_option(text: str, field: str, what: str) -> float:
    """--timeout held to the range of the spec's own field; `--timeout ''` is bad input, not the option left out."""
    seconds = parse_duration(text, "--timeout")
    low, high = specs.LIMITS[field]
    if not low <= seconds <= high:
        raise UserError(f"--timeout {text}: {what} takes {low:g}s to {high / 86400:g} days; give one in that range, like 30m")
    return seconds


def trial_timeout(text: str, spec) -> float:
    """`bench trial --timeout`, held to the spec's own rule: longer than the longest a trial measures."""
    seconds = timeout_option(text, "trial_timeout_s", "a trial")
    if why := specs.short_timeout(seconds, spec):
        raise UserError(f"--timeout {text}: {why}: give a longer one")
    return seconds


def budget_option(text: str | None, flag: str) -> int | None:
    """A memory size option, held to the spec's memory_budget range; None where it was not given."""
    if text is None:
        return None
    budget = parse_size(text, flag)
    most = specs.LIMITS["memory_budget"][1]
    if budget > most:
        raise UserError(f"{flag} {text}: a memory budget is at most {most / 1024**4:g} TiB; give one like 24GiB")
    return budget


def load_specs(path: Path, scenarios: tuple, study_name: str | None, memory_budget: str | None) -> list:
    """The spec, or one spec per scenario (all of them when the spec has scenarios and none is named)."""
    if study_name is not None:
        specs.check_name(study_name, "--study")
    base = specs.load(path)
    names = tuple(dict.fromkeys(scenarios)) or base.scenarios or (None,)  # a name given twice runs once
    if study_name and len(names) > 1:
        raise UserError("--study names one study, but this spec runs several scenarios; add --scenario NAME")
    loaded = [specs.load(path, name) if name else base for name in names]
    budget = budget_option(memory_budget, "--memory-budget")
    return [quick(replace(s, study=study_name or s.study, memory_budget=budget or s.memory_budget)) for s in loaded]


QUICK_ENV = "BENCH_QUICK"


def quick(spec):
    """BENCH_QUICK=N: a smoke run of a spec (`bench sweep`, `bench trial`), as the README test runs every
    command: at most N trials, a built-in workload's tiny preset (unless `--preset` says otherwise),
    about a second of measuring per trial, and no searched compile (a cold compile is a minute on a
    CPU). Its numbers are not the real ones."""
    value = os.environ.get(QUICK_ENV)
    if not value:
        return spec
    if not is_whole(value) or int(value) < 1:
        raise UserError(f"{QUICK_ENV}={value!r}: give the number of trials of a quick smoke run (e.g. 3), or unset it")
    measure = replace(spec.measure, warmup_steps=1, window_s=0.05, min_windows=2, max_windows=3, max_seconds=1.0)
    workload = {**spec.workload, "preset": "tiny"} if "name" in spec.workload else spec.workload
    search = dict(spec.search)
    if "off" in getattr(search.get("compile"), "choices", ()):
        search["compile"] = replace(search["compile"], choices=("off",))
    return replace(spec, trials=min(spec.trials, int(value)), measure=measure, workload=workload, search=search,
                   smoke=True)


def device_spec(spec, device: str, say=None):
    """The spec narrowed to what `device` can honour; each dropped search value is said once, through
    `say` where given (bench trial says them once its --set is accepted: a refusal is one line)."""
    spec, notes = specs.for_device(spec, device)
    spec, more = specs.fit_nproc(spec, device, devices_available(device))
    for line in notes + more:
        (say or note)(line)
    return spec


def resolve_device(device: str) -> str:
    """auto -> cuda when NVML sees a GPU (without importing torch here), else cpu."""
    gpus = nvml.visible()
    if device == "auto":
        return "cuda:0" if gpus else "cpu"
    if device == "cpu":
        return device
    if device == "cuda" or (device.startswith("cuda:") and is_whole(device[5:])):
        index = int(device[5:]) if ":" in device else 0
        if index >= gpus:
            raise UserError(f"--device {device}: {'no CUDA GPU is visible' if not gpus else f'only {gpus} GPU(s) visible'}; "
                            "use --device cpu or a GPU index that exists (see `bench doctor`)")
        return f"cuda:{index}"
    raise UserError(f"--device {device!r}: use auto, cpu, cuda or cuda:N")


def devices_available(device: str) -> int:
    """How many processes a trial may start on `device`: the GPUs from its index on, or the CPU cores."""
    if device == "cpu":
        return len(os.sched_getaffinity(0))
    return nvml.visible() - int(device.partition(":")[2] or 0)


def parse_trials(value: str) -> int:
    low, high = specs.LIMITS["trials"]
    if not is_whole(value) or not low <= int(value) <= high:
        raise UserError(f"--trials {value}: give a whole number from {low} to {high:,}, or auto")
    return int(value)


def run_sweep(spec, device, total, deadline, storage_url, results, auto=False, notes=()) -> pareto.Choice:
    """Sweep one spec; the choice `bench report` makes of its study. Ctrl-C, SIGTERM and SIGHUP stop the running
    trial and record it interrupted. `notes`: what narrowing the spec to the device dropped, said once its
    study is open."""
    progress = LiveProgress(spec, out)
    try:
        with launch.stop_signals_interrupt():
            return sweep_into_study(spec, device, total, deadline, storage_url, results, progress, auto, notes)
    except (KeyboardInterrupt, UserError, OSError) as exc:
        to_terminal(progress.stop)  # a running spinner keeps the terminal's cursor hidden: stop it before any message
        if isinstance(exc, OSError) and stores.is_no_space(exc):
            raise UserError(f"no space left on the device ({exc.filename or 'writing the study'}); the study is "
                            "intact: free some space and re-run the same command to resume") from None
        if not isinstance(exc, KeyboardInterrupt):
            raise
        why = str(exc) or "interrupted"
        to_terminal(progress.cut_short)
        confirming = getattr(exc, "confirmation", None)
        what = ("the running trial was stopped and recorded as interrupted" if progress.running is not None
                else f"the confirmation run of #{confirming} was stopped; it runs again, side by side with its "
                     "round's other run, and every trial's measurement is kept"
                if confirming is not None else "no trial was running, nothing measured is lost")  # waiting for quiet
        to_terminal(lambda: err.print(f"{why}: {what}; re-run the same command to resume", soft_wrap=True))  # one line
        sys.exit(getattr(exc, "exit_code", 130))


def to_terminal(write) -> bool:
    """Run `write`; False when the terminal is gone (a hang-up: EIO). Then stdout and stderr go to
    /dev/null, so that leaving, which flushes them, cannot fail too and turn exit 129 into 1."""
    try:
        write()
        sys.stdout.flush()
        sys.stderr.flush()
        return True
    except OSError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(devnull, fd)
        return False


def check_scenarios(specs_to_run: list, device: str, storage_url: str | None, results: Path) -> None:
    """Every scenario's apply target and resume, refused before the first trial of any: a refusal after the
    first scenario had run would have written its trials."""
    hardware = hardware_model(device)
    for spec in specs_to_run:
        spec = with_your_config(spec, device)[0]
        try:
            study = ledger.load(stores.existing_storage(storage_url, results, spec.study, say=note), spec.study)
        except stores.NoStudy:
            continue  # a first sweep of this scenario: nothing to resume
        if study.get_trials(deepcopy=False) or "spec_path" in study.user_attrs:
            ledger.resumed(spec, study, device, hardware, check_only=True)


def with_your_config(spec, device: str) -> tuple:
    """The spec holding what your file says for knobs it does not search, your file's current values, the
    knobs it lacks, and what apply would say of them (refused now what apply would refuse after the sweep)."""
    current = apply.read_current(spec.apply) if spec.apply else {}
    spec = spec.holding(current, device)  # what the spec does not search runs as your file has it
    missing = apply.not_found(spec.apply, current, spec.knob_names()) if spec.apply else {}
    if typo := apply.misspelled(spec.apply, missing):
        knob, key, theirs = typo
        raise UserError(f"{spec.shown}: apply: {knob} is read from {key}, which is not in {spec.apply.file.name}, but "
                        f"{theirs} is; fix the key under apply.keys (the sweep would measure a baseline that is not your config)")
    notes = []
    if spec.apply:
        written = {**{k: list(d.choices or ()) for k, d in spec.search.items()}, **{k: [v] for k, v in spec.fixed.items()}}
        derived = {k: [] for k in spec.knob_names() if k not in written}  # accumulation from effective_batch
        notes = apply.refuse_unwritable(spec.apply, {**written, **derived}, spec.shown)
    return spec, current, missing, notes


def edited_knobs(swept: dict, now: dict) -> tuple[str, str] | None:
    """("batch_size=64", "batch_size=8"): what your file makes `now` and what your config as swept made, for
    each knob where they differ; None where your file makes the config the study measured as yours."""
    knobs = [k for k in swept if k in now and now[k] != swept[k]]
    if not knobs:
        return None
    return ", ".join(f"{k}={now[k]}" for k in knobs), ", ".join(f"{k}={swept[k]}" for k in knobs)


def last_line(specs_to_run: list, choices: list, device: str) -> str:
    """The sweep's last line: what to run next, as the report would say it."""
    stayed = next((c for c in choices if report.stayed_noisy(c)), None)
    if stayed is not None:  # a rerun would measure nothing again: it said "run again", and again, forever
        return f"next: {escape(report.next_step(stayed))}"
    if any(report.spoiled(c) for c in choices):  # the report's rule: an answer noise decides is none to apply
        return ("next: run the same [bold]bench sweep[/bold] again when the machine is quiet: it measures again "
                "what a busy machine or noise spoiled; [bold]bench report[/bold] shows which")
    if not any(c.best for c in choices):
        return "next: [bold]bench report[/bold] to see why no config qualifies as best (statuses, noise, errors)"
    capped_line = next((f"next: {f'study {spec.study}: ' if len(specs_to_run) > 1 else ''}{escape(report.next_step(c))}"
                        for spec, c in zip(specs_to_run, choices)  # not "widen the search" to a search cut short
                        if c.best and (c.kept or c.best.record.baseline) and report.cut_short(c)), None)
    if not any(spec.apply for spec in specs_to_run):
        return (capped_line or
                "next: [bold]bench report[/bold] to see the measurements (an apply: section in the spec lets "
                "[bold]bench apply best[/bold] write the best config into your config file)")
    applied = [(spec, c.best.record.config, c.best.record.baseline, config_now(spec, device))  # each target read once
               for spec, c in zip(specs_to_run, choices) if spec.apply and c.best]
    if any(not baseline and not holds(now, config) for _, config, baseline, now in applied):
        return "next: [bold]bench report[/bold] to see the measurements, [bold]bench apply best[/bold] to use the best config"
    if written := next((spec.apply.file.name for spec, _, baseline, _ in applied if not baseline), None):
        return (f"next: [bold]bench report[/bold] to see the measurements; {escape(written)} holds the best config "
                "already, so [bold]bench apply best[/bold] has nothing to change")
    if edited := next(((spec.apply.file.name, words[0]) for spec, config, _, now in applied
                       if (words := edited_knobs(config, now or {}))), None):
        return (f"next: [bold]bench report[/bold] to see the measurements; your config as swept stays best; "
                f"{escape(edited[0])} holds {escape(edited[1])} now, so [bold]bench apply best[/bold] writes it back")
    if capped_line:
        return capped_line
    return ("next: [bold]bench report[/bold] to see the measurements; your config stays best, so "
            "[bold]bench apply best[/bold] has nothing to change")


def holds(now: dict | None, config: dict) -> bool:
    """Your apply target makes `config` now (`now`: config_now; an apply wrote it): nothing to apply."""
    return now is not None and all(now.get(knob, knobs.DEFAULTS.get(knob)) == value for knob, value in config.items())


def config_now(spec, device: str, current: dict | None = None) -> dict | None:
    """The config your apply target makes (`current`: its values as already read), as a new sweep would
    measure it as your config; None where it cannot be read now (moved or broken since the sweep read it:
    `bench apply` says so in its turn)."""
    if current is None:
        try:
            current = apply.read_current(spec.apply)
        except UserError:
            return None
    return spec.holding(current, device).baseline(current)


def sweep_into_study(spec, device, total, deadline, storage_url, results, progress, auto, notes=()) -> pareto.Choice:
    spec, current, missing, config_notes = with_your_config(spec, device)
    base = spec.baseline(current)
    # said once the study is open: a resume refused there is then the command's one line
    notes = [*notes, *config_notes, *(f"your current config: {line}; the baseline takes {knob} {base.get(knob)}"
                                      for knob, line in missing.items())]
    if not specs.keeps_effective_batch(spec, base):
        notes.append(f"your current config's batch_size {base['batch_size']} does not divide effective_batch "
                     f"{spec.effective_batch}: it is measured as it is (accumulation {base.get('accumulation', 1)}), "
                     "and no other config is searched at that size")
    if not storage_url:
        make_results_folder(results)
    storage = stores.open_storage(storage_url, results, spec.study, say=lambda line: err.print(escape(line), soft_wrap=True))
    hardware = hardware_model(device)
    # under the claim lock: a worker started beside another (a Slurm array's tasks start together) finds the
    # study either not made or made whole, header and baseline, and is checked against it as any resume is;
    # else it found a study with no trial yet, took it for its own and ran under its own budget or device
    ledger.has_header(storage, spec.study)  # read first: a damaged database is said before a lock file is made beside it
    with stores.claim_lock(storage, results, spec.study)():
        spec, study = open_study(spec, base, storage, device, hardware)
    for line in notes:
        note(line)
    if outside := spec.outside(ledger.baseline_config(study) or base):  # a resume's: as first swept, whatever the file says now
        whose, what = ("your config's", "your config") if spec.apply else \
            ("the baseline's (bench's defaults: the spec has no apply: section)", "the baseline")
        err.print(f"note: {whose} {', '.join(outside)} {'is' if len(outside) == 1 else 'are'} not in the spec's "
                  f"search: it is measured as {what}, and no other config is searched with "
                  f"{'it' if len(outside) == 1 else 'them'}", markup=False, highlight=False, soft_wrap=True)
    where = stores.redact(storage_url) if storage_url else str(stores.study_dir(results, spec.study))
    out.print(f"[bold]bench sweep[/bold] {escape(spec.study)}: {escape(specs.workload_label(spec.workload))} "
              f"on {device}, {spec.space_size()} configs in the space, up to {count(total, 'trial')} "
              f"(then runs confirming the leader beside {'your config' if spec.apply else 'the baseline'}) → {escape(where)}")
    if spec.smoke:
        out.print(f"{QUICK_ENV} is set: a quick smoke run (tiny preset, short measurements, no compile), not numbers to act on")
    if spec.memory_budget:
        out.print(f"memory budget {size(spec.memory_budget)}, headroom {spec.headroom:.0%}")
        warn_budget_above_device(spec.memory_budget, device)
    sweep = studies.Sweep(spec, study, device, results, total, deadline, progress,
                          claim=stores.claim_lock(storage, results, spec.study), auto=auto)
    sweep.run()
    return sweep.choice()


def open_study(spec, base: dict, storage, device: str, hardware: str | None):
    """The study `spec` names, made with its header and baseline where it is new, else checked as a resume
    (refused where its runs would not compare) whether or not a trial of it has run yet: the caller holds
    the claim lock, so another worker's study is seen whole. Returns the spec as the study runs it."""
    made = ledger.has_header(storage, spec.study)
    study = ledger.create(ledger.including(spec, base), storage, device, hardware)
    if made or study.get_trials(deepcopy=False):  # a resume: the study's own space, device and budget
        spec = ledger.resumed(spec, study, device, hardware)
        if not study.get_trials(deepcopy=False):  # a first sweep stopped between its header and its baseline
            ledger.enqueue_baseline(study, ledger.including(spec, base), base)
        if headroom := ledger.rechosen(spec, study):
            err.print(f"note: {headroom}", markup=False, highlight=False, soft_wrap=True)
        if unsearched := ledger.mark_unsearched(study, spec):
            values = ", ".join(sorted({v for values in unsearched.values() for v in values}))
            err.print(f"note: {'trial' if len(unsearched) == 1 else 'trials'} {', '.join(f'#{n}' for n in unsearched)} "
                      f"measured {values}, which this sweep does not search (the spec's search, on this machine): "
                      "kept as measured, never chosen as best", markup=False, highlight=False, soft_wrap=True)
        swept = ledger.baseline_config(study)
        if spec.apply and swept and (edited := edited_knobs(swept, base)):
            err.print(f"note: {spec.apply.file.name} makes {edited[0]} now, but this study measured your "
                      f"config as first swept ({edited[1]}): "
                      "every comparison with your config is with that one; to have your file as it is now "
                      "measured as your config, sweep a new study (--study NAME)", markup=False, highlight=False,
                      soft_wrap=True)
        if changed := ledger.measuring_changes(spec, study):
            err.print(f"note: this run measures trials otherwise than the study's first ({'; '.join(changed)}): its "
                      "figures are ranked with theirs; start a new study with --study NAME to keep them apart",
                      markup=False, highlight=False, soft_wrap=True)
    else:
        spec = ledger.including(spec, base)
        ledger.enqueue_baseline(study, spec, base)
    ledger.enqueue_grid(study, spec)
    return spec, study


def hardware_model(device: str) -> str | None:
    """The model of the device a sweep runs on (NVML's GPU name, the CPU's model name): a study's
    resume compares it with the one it was created with (torch stays out of the parent)."""
    from harness import doctor
    return doctor.cpu_model() if device == "cpu" else nvml.device_name(device)


def warn_budget_above_device(budget: int, device: str) -> None:
    total = device_memory(device)
    if total and budget > total:
        err.print(f"warning: memory budget {size(budget)} is more than the {size(total)} {device} has; "
                  "trials are limited by the device, not the budget", soft_wrap=True)


def device_memory(device: str) -> int | None:
    """Bytes the device holds: host RAM for cpu, NVML's total for a GPU (torch stays out of the parent)."""
    if device == "cpu":
        import psutil
        return psutil.virtual_memory().total
    return nvml.total_memory(device)


def make_results_folder(results: Path) -> None:
    """A results folder bench creates ignores itself in git: measurements are not source."""
    if results.exists():
        return
    try:
        results.mkdir(parents=True)
        (results / ".gitignore").write_text("# written by bench: studies are measurements, not source\n*\n")
    except OSError:
        return  # not writable: opening the storage there says so, in one line


# ---- trial ---------------------------------------------------------------------------------------

@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@click.option("--set", "overrides", multiple=True, metavar="KNOB=VALUE", help="Knob value (repeatable).")
@click.option("--device", metavar="auto|cpu|cuda|cuda:N", default="auto", show_default=True,
              help="auto: CUDA when a GPU is seen, else the CPU.")
@click.option("--scenario", metavar="NAME", callback=a_scenario, help="Take the workload and budget from this scenario.")
@click.option("--memory-budget", metavar="SIZE", help="Run under this memory, e.g. 24GiB.")
@click.option("--timeout", metavar="DURATION", help="Trial time limit (default: the spec's).")
@click.option("--preset", metavar="NAME", help="Built-in workload preset to use instead of the spec's, e.g. tiny.")
@user_errors
def trial(spec_path, overrides, device, scenario, memory_budget, timeout, preset):
    """Run one config of SPEC and print its JSON record on stdout."""
    spec = quick(specs.load(spec_path, scenario))
    if preset is not None:  # `--preset ""` is a preset named nothing, not the spec's
        spec = specs.with_preset(spec, preset)
    if memory_budget is not None:
        spec = replace(spec, memory_budget=budget_option(memory_budget, "--memory-budget"))
    device = resolve_device(device)
    notes: list[str] = []
    spec = device_spec(spec, device, say=notes.append)
    config = specs.trial_config(spec, specs.parse_overrides(overrides, spec))
    specs.check_config(config, device, "--set", devices_available(device))
    specs.check_shapes(spec, config, device, "--set")
    specs.check_effective_batch(spec, config)
    limits = launch.Limits(trial_timeout(timeout, spec) if timeout is not None else spec.trial_timeout_s, spec.stall_s)
    for line in notes:
        note(line)
    try:  # Ctrl-C, SIGTERM, SIGHUP: the trial's group killed and its folder removed, as in a sweep
        with launch.stop_signals_interrupt():
            rec = launch.run(spec.job(device, config), limits, None)
    except KeyboardInterrupt as exc:
        err.print(f"{str(exc) or 'interrupted'}: the trial was stopped; nothing was measured", soft_wrap=True)
        sys.exit(getattr(exc, "exit_code", 130))
    rec.setdefault("config", config)
    click.echo(json.dumps(rec, indent=1, default=str))
    click.echo(outcome(rec, spec.objective, spec.memory_budget), err=True)  # the record is for tools; this line is for you
    if unread := unread_note(rec):
        click.echo(unread, err=True)
    sys.exit(1 if rec["status"] in ("crash", "error") else 0)


# ---- report --------------------------------------------------------------------------------------

@main.command("report")
@click.argument("study_name", metavar="[STUDY]", required=False)
@click.option("--study", "study_option", metavar="NAME", help="The study, as sweep and apply name it (or give it as STUDY).")
@click.option("--format", "fmt", type=click.Choice(["table", "csv", "json", "html"]),
              help="What to write  [default: --out's kind by its suffix, else table]")
@click.option("--out", "out_path", type=click.Path(), callback=a_file, help="Write to this file instead of stdout.")
@click.option("--wide", is_flag=True, help="Table: every column, however wide (default: fit the terminal).")
@scenario_option
@storage_option
@results_option
@user_errors
def report_cmd(study_name, study_option, fmt, out_path, wide, scenario, storage, results):
    """Show what a study measured (default: the most recent one)."""
    if study_name is not None and study_option is not None and \
            typed_study(study_name, results, storage) != typed_study(study_option, results, storage):
        raise UserError(f"study named twice, as {study_name} and as --study {study_option}: give one")
    study_name = study_name if study_name is not None else study_option
    fmt, fmt_given = report_format(fmt, out_path, wide), bool(fmt)
    name = pick_study(study_name, scenario, results, storage)
    study = ledger.load(stores.existing_storage(storage, results, name, say=note), name)
    rows, info = ledger.rows_of(study), ledger.study_info(study)
    spec_path = spec_path_of(info, storage, results)
    spec = study_spec(spec_path, info, say=note)
    choice = study_choice(rows, info, spec)
    out_given = out_path is not None
    if fmt == "html" and not out_path:
        out_path = stores.study_dir(results, name) / "report.html"
        make_results_folder(results)  # a study in a database has none yet: made as a sweep makes it, ignored by git
        out_path.parent.mkdir(parents=True, exist_ok=True)
    if out_path:
        refuse_own_file(out_path, spec_path, spec, storage, results, name)
        if out_path.suffix and out_path.suffix.lower() not in SUFFIX_FORMATS and not fmt_given:  # r.xlsx got the table
            raise UserError(f"--out {out_path}: bench writes a table (.txt, .md), .csv, .json or .html, not "
                            f"{out_path.suffix}; name it {out_path.stem}.csv for a spreadsheet, or give --format "
                            "to write that kind under this name")
    if fmt == "table":
        # COLUMNS or the terminal, read now (80 when piped or written to a file); the summary wraps at word boundaries
        console = Console(file=io.StringIO() if out_path else None, soft_wrap=wide, width=1 << 16 if wide else None,
                          color_system=None if out_path else "auto")  # a file gets no escape codes, FORCE_COLOR or not
        if console.width < MIN_COLUMNS:  # COLUMNS=0 printed nothing, COLUMNS=1 a column of letters
            console.width = MIN_COLUMNS
        console.print(report.table(choice, info, None if wide else console.width), crop=False)
        for warning in study_warnings(spec, rows, info):
            console.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)
        if not out_path:
            return
        text = console.file.getvalue()
    elif fmt == "html":
        text = report.render_html(choice, {**info, "warning": " ".join(study_warnings(spec, rows, info)) or None})
    else:
        text = report.to_json(choice) if fmt == "json" else report.to_csv(choice)
    if out_path:
        write_text(out_path, text, "--out" if out_given else "the page's own place")
        err.print(f"wrote {out_path}", markup=False)
    else:
        click.echo(text)


def report_format(fmt: str | None, out_path: Path | None, wide: bool) -> str:
    """--format as given, else the kind --out's suffix names, else the table; refused where they disagree
    (an HTML page in r.csv) or --wide is given for what has no columns to widen."""
    named = SUFFIX_FORMATS.get(out_path.suffix.lower()) if out_path else None
    if fmt and named and fmt != named:
        raise UserError(f"--out {out_path}: a {out_path.suffix} file for --format {fmt}; name it "
                        f"{out_path.stem}{FORMAT_SUFFIX[fmt]}, or give --format {named}")
    fmt = fmt or named or "table"
    if wide and fmt != "table":
        raise UserError(f"--wide: only the table has columns to widen, not --format {fmt}; drop --wide")
    return fmt


SUFFIX_FORMATS = {".csv": "csv", ".json": "json", ".html": "html", ".htm": "html", ".txt": "table", ".md": "table"}
"""The report each --out suffix names; a file of these kinds is a report, which --out may replace."""
FORMAT_SUFFIX = {"table": ".txt", "csv": ".csv", "json": ".json", "html": ".html"}


def spec_path_of(info: dict, storage: str | None, results: Path) -> str | None:
    """ledger.spec_file, told which project holds the study's journal (the results folder's parent)."""
    return ledger.spec_file(info, None if storage else Path(results).resolve().parent)


def required_spec(info: dict, storage: str | None, results: Path, scenario: str | None):
    path = spec_path_of(info, storage, results)
    if path is None:
        raise UserError(f"study {info['name']!r} names no spec (it was not made by `bench sweep`); "
                        "report and apply need a study bench swept")
    return specs.load(path, scenario)


def study_spec(spec_path: str | None, info: dict, say: Callable[[str], None] | None = None):
    """The spec the study was swept from, as it reads now; None when it is gone or no longer loads (the
    report still shows what was measured; `say` is told why, where the spec is there but broken)."""
    if spec_path is None:
        return None
    try:
        return specs.load(spec_path, info.get("scenario"))
    except (UserError, OSError) as e:
        if say is not None and Path(spec_path).exists():
            say(f"{str(e).rstrip('.')}. The spec no longer loads, so this report judges compile against an assumed "
                f"run of {pareto.ASSUMED_RUN_STEPS:,} steps; fix it for `bench apply`")
        return None


def study_choice(rows: list[dict], info: dict, spec) -> pareto.Choice:
    """The study's choice, with compile judged against the training run the apply target describes."""
    steps, source = studies.run_of(spec.apply if spec is not None else None)
    return report.annotate(rows, info, run_steps=steps, run_source=source,
                           applies=spec is None or spec.apply is not None)


SMOKE_WARNING = ("this study is a BENCH_QUICK smoke run (short measurements, tiny preset, no compile): not numbers "
                 "to act on; run the sweep without BENCH_QUICK, in a study of its own (--study NAME)")


def chosen_words(which: str, budget: int | None) -> str | None:
    """How `bench apply` named the row, for the header: a tier or a budget (best, or a trial number, needs no words)."""
    if which not in pareto.TIERS and not (which == "best" and budget):
        return None
    named = "best" if which == "best" else f"the {which} tier"
    return f"{named} under --budget {size(budget)}" if budget else named


SPOILED_WARNING = ("the figures deciding this study's answer were measured on a busy machine or too noisy to rank, "
                   "so the answer is noise: run the same `bench sweep` again when the machine is quiet (it measures "
                   "them again), then apply")


def noisy_baseline_warning(choice: pareto.Choice, chosen: pareto.Standing) -> str | None:
    """A config written over your own when your own was too noisy to compare with: nothing shows it is faster."""
    base = choice.baseline
    if base is None or not base.noisy or chosen.record.baseline:
        return None
    again = ("it stayed noisy when measured again on a quiet machine: give trials longer (trial.max_seconds)"
             if "noisy_cv" in (base.record.remeasured_after or {}) else
             "run `bench sweep` again on a quiet machine, which measures it again")
    return (f"your config (trial {base.number}) ran too noisy to compare against ({base.record.step_cv:.0%} CV, most "
            f"often a busy machine), so nothing shows trial {chosen.number} is faster than it; {again}")


def study_warnings(spec, rows: list[dict], info: dict) -> list[str]:
    """What every view of the study says before anyone acts on it: a smoke run, another model size."""
    return [w for w in (SMOKE_WARNING if info.get("smoke") else None, size_warning(spec, rows), leak_warning(rows)) if w]


def leak_warning(rows: list[dict]) -> str | None:
    """When the steps of some trial kept memory (harness.footprint.leak): its peak, and likely every
    other's, is a short run's, and a long run needs more."""
    leaked = [(r, Record.of(r).leak) for r in rows if r.get("status") in ("ok", "oom")]
    leaked = [(r, found) for r, found in leaked if found]
    if not leaked:
        return None
    rec, found = max(leaked, key=lambda pair: pair[1]["bytes_per_step"])
    others = f" and {len(leaked) - 1} other{'s' if len(leaked) > 2 else ''}" if len(leaked) > 1 else ""
    return (f"trial {rec.get('number')}{others}: {leak_words(found)}; something in the training code keeps each "
            "step's tensors (a list they are appended to, a loss kept with its graph), and a long run needs more "
            "memory than these peaks")


def size_warning(spec, rows: list[dict]) -> str | None:
    """When the apply target describes another model size than the trials measured."""
    if spec is None or spec.apply is None or not rows:
        return None
    workload = next((r["workload"] for r in rows if r.get("workload")), None)
    return apply.other_model_size(spec.apply, workload, set(rows[0].get("config") or {}))


def typed_study(name: str | None, results: Path, storage: str | None) -> str | None:
    """`bench report results/tinyvision`, as tab completion writes it, names the study tinyvision."""
    if name and not storage and Path(name).parent.resolve() == Path(results).resolve():
        return Path(name).name
    return name


def pick_study(name: str | None, scenario: str | None, results: Path, storage: str | None) -> str:
    """STUDY, else the most recent; with --scenario, that scenario's study of the same spec."""
    if name is not None and not name.strip():
        raise UserError("the study name is empty; name a study, or leave it out for the most recent one")
    name = typed_study(name, results, storage)
    given, name = name, name or ledger.latest_study(results, storage)
    if not scenario:
        return name
    try:
        info = ledger.study_info(ledger.load(stores.existing_storage(storage, results, name), name))
    except UserError:
        if given is None:
            raise
        return pick_study(f"{given}-{scenario}", None, results, storage)  # the spec's study name, as sweep names it
    if info.get("scenario") == scenario:
        return name  # that scenario's study already, whatever it is named (`bench sweep --study NAME --scenario`)
    if given is not None and info.get("scenario"):
        raise UserError(f"study {given!r} was swept as scenario {info['scenario']}, and --scenario {scenario} "
                        "names another; give the study or the scenario, not both")
    try:
        return required_spec(info, storage, results, scenario).study
    except UserError as exc:
        if given is not None:
            raise
        raise UserError(f"--scenario {scenario}: looked for in the spec of the most recent study, {name}: {exc}; name "
                        f"a study of the spec that has it, as in `bench report STUDY --scenario {scenario}`") from None


def refuse_own_file(path: Path, spec_path: str | None, spec, storage: str | None, results: Path, name: str,
                    option: str = "--out") -> None:
    """`--out` (a report) or `--to` (apply's config) onto the study's journal or database, its spec, or
    bench's files in any study's folder would replace what bench reads with what it writes; so would
    either onto a backup apply made, and a report onto the apply target, into the Hydra group of
    profiles apply writes, or over any existing file that is not a report: refused. The folder written
    into must exist (a typo there made folders from the root down). `--to` replaces only a config an
    earlier apply wrote (your spec or another config there is not bench's to overwrite), never the
    apply target itself (apply without --to writes that, with its Hydra profile)."""
    writes = "the report" if option == "--out" else "the config"
    owned = {"the study's journal": None if storage else stores.study_dir(results, name) / stores.JOURNAL,
           "the study's database": stores.sqlite_path(storage) if storage else None,
           "the study's spec": spec_path,
           "the spec's apply target": spec.apply.file if option == "--out" and spec is not None and spec.apply else None}
    target = path.resolve()
    for what, own_path in owned.items():
        # by inode too: a hard link of the spec is the spec (apply wrote a training config into it)
        if own_path is not None and specs.same_path(Path(own_path), target):
            raise UserError(f"{option} {path}: that is {what}, which bench reads to report and apply; write "
                            f"{writes} to another file")
    group = spec.apply.hydra_group_dir if option == "--out" and spec is not None and spec.apply else None
    if group is not None and target.is_relative_to(Path(group).resolve()):
        raise UserError(f"{option} {path}: that is inside the spec's Hydra config group {group}, where apply "
                        "writes each device's profile and every file is a Hydra option; write the report elsewhere")
    own = None if storage else stores.study_dir(results, name).resolve()
    folder = own if own and target.is_relative_to(own) else study_folder_holding(target, results)
    if folder and not (option == "--out" and target.name.startswith("report")):
        whose = "the study's folder" if folder == own else f"study {folder.name}'s folder"
        raise UserError(f"{option} {path}: inside {whose} only report files go (its journal, logs, locks and "
                        f"caches are bench's); write {writes} elsewhere")
    if apply.BACKUP_INFIX in target.name:
        raise UserError(f"{option} {path}: that is a backup bench apply made of your config, maybe its only copy; "
                        f"write {writes} to another file")
    if option == "--to" and spec is not None and spec.apply and specs.same_path(Path(spec.apply.file), target):
        raise UserError(f"--to {path}: that is the spec's apply target; apply without --to writes it "
                        "(with a backup, and its Hydra profile if it has one)")
    if option == "--to" and target.is_file() and not apply.written_by_apply(target):
        raise UserError(f"--to {path}: that file exists and bench apply did not write it (no "
                        f"`{apply.PROVENANCE_MARK}` header); write the config to a new file, or remove that one first")
    if option == "--out" and target.is_file() and target.stat().st_size and not written_by_report(target):
        raise UserError(f"{option} {path}: that file exists and is not a report bench wrote (a README.md or a "
                        "package.json is yours); write the report to another file, or remove that one first")
    if not target.parent.is_dir():
        raise UserError(f"{option} {path}: folder {target.parent} does not exist; create it, or write {writes} elsewhere")
    if target.is_dir():
        raise UserError(f"{option} {path}: a folder, not a file; name a file in it for {writes}")


def written_by_report(path: Path) -> bool:
    """Whether an existing file holds what `bench report` writes in its kind (by suffix): --out replaces
    only that, never a README.md or a config.json that happens to have a report's suffix."""
    kind = SUFFIX_FORMATS.get(path.suffix.lower())
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if kind == "html":
        return "<title>bench report:" in text
    if kind == "csv":
        return text.startswith("number,status,")
    if kind == "json":
        try:
            rows = json.loads(text)
        except ValueError:
            return False
        return isinstance(rows, list) and all(isinstance(r, dict) and {"number", "status"} <= r.keys() for r in rows)
    head = " ".join(text.split()[:40])  # the table's title (wrapped where the study's name is long), or its narrow form
    return kind == "table" and (head.startswith("values: #") or bool(re.match(r"study \S.*: \S+ vs peak memory", head)))


def study_folder_holding(target: Path, results: Path) -> Path | None:
    """The folder of any study under `results` (one holding a journal) that `target` lies in, or None."""
    root = results.resolve()
    for folder in target.parents:
        if not folder.is_relative_to(root):
            return None
        if (folder / stores.JOURNAL).exists():
            return folder
    return None


def write_text(path: Path, text: str, named_by: str = "--out") -> None:
    """Replace a regular file atomically (through a symlink, at its target); write into anything else
    (/dev/stdout, a FIFO, a device) as it is, never replacing it with a file. `named_by`: what chose the
    path, for the error (the user's --out, or the HTML page's place in the study folder)."""
    try:
        if path.exists() and not path.is_file():  # opened by its own name: /dev/stdout's link is a pipe's
            with open(path, "w") as stream:
                stream.write(text)
            return
        target = path.resolve()
        apply.replace_file(target, text.encode())
    except OSError as exc:
        if named_by == "--out":
            raise UserError(f"--out {path}: cannot write ({exc.strerror or exc}); pick a writable path") from None
        raise UserError(f"{path} ({named_by}): cannot write ({exc.strerror or exc}); give --out with a writable "
                        "path") from None


# ---- apply ---------------------------------------------------------------------------------------

@main.command("apply")
@click.argument("which", default="best", metavar="[best|TRIAL|safe|balanced|aggressive]")
@click.option("--study", "study_name", metavar="NAME", help="Study to take it from (default: the most recent).")
@click.option("--budget", metavar="SIZE", help="Best config that fits this much memory, e.g. 24GiB.")
@click.option("--dry-run", is_flag=True, help="Print the diff; change nothing.")
@click.option("--to", "to", metavar="FILE", type=click.Path(), callback=a_file, help="Write the result to this file instead.")
@click.option("--create-keys", is_flag=True, help="Create mapped keys that the target lacks.")
@scenario_option
@storage_option
@results_option
@user_errors
@stopped_by_signals
def apply_cmd(which, study_name, budget, dry_run, to, create_keys, scenario, storage, results):
    """Write the chosen config into the spec's apply target (with a backup and a diff)."""
    which = which.lower()  # `bench apply Best` is best
    name = pick_study(study_name, scenario, results, storage)
    study = ledger.load(stores.existing_storage(storage, results, name, say=note), name)
    rows, info = ledger.rows_of(study), ledger.study_info(study)
    spec = required_spec(info, storage, results, info.get("scenario"))
    choice = study_choice(rows, info, spec)
    hidden = is_whole(which) and not budget and ledger.why_not_shown(study, int(which))
    if hidden:
        raise UserError(f"trial {which}: {hidden}")
    budget = budget_option(budget, "--budget")
    chosen = choice.row_for(which, budget, name)
    made = choice.under(budget) if budget else choice  # the choice `which` was read from
    if spec.apply is None:
        raise UserError(f"{spec.shown}: has no `apply:` section naming the config file to write; add one")
    row = chosen.record
    against = choice.against_baseline(chosen)
    versus_words = against.text(choice.unit) if against else choice.no_ratio(chosen)
    noise = report.spoiled(made)  # the report's rule: the figures deciding this answer are noise
    # best, or a tier's pick, slower than your config for the headroom: said on screen and in the file
    set_aside = None if is_whole(which) else made.set_aside_for(chosen, pareto.TIERS.get(which, made.headroom))
    current = apply.read_current(spec.apply)
    device_kind = info.get("device") or "cpu"
    edited = edited_knobs(choice.baseline.config, config_now(spec, device_kind, current)) \
        if choice.baseline and not row.baseline else None
    provenance = {"study": name, "trial": row.number, "chosen": chosen_words(which, budget), "device": row.env.get("device"),
                  "throughput": chosen.speed, "unit": choice.unit, "peak_memory": chosen.peak,
                  "vs_baseline": versus_words, "baseline": choice.baseline.number if versus_words else None,
                  "date": datetime.date.today().isoformat(), "bench_version": __version__,
                  "note": "; ".join([*(["a BENCH_QUICK smoke run, not numbers to act on"] if info.get("smoke") else []),
                                     *(["the study's answer is noise: the figures deciding it were measured "
                                        "on a busy machine or too noisy to rank"] if noise else []),
                                     *([set_aside] if set_aside else []),
                                     *([f"{spec.apply.file.name} made {edited[0]} before this apply, not your "
                                        f"config as swept ({edited[1]})"] if edited else [])])
                  or None}
    if to is not None:
        refuse_own_file(to, spec_path_of(info, storage, results), spec, storage, results, name, option="--to")
    held = spec.held(current, device_kind)
    values = to_write(row.config, spec.knob_names() + list(held))
    # the profile is planned first: one it refuses leaves the main config unwritten, and a key the main config
    # lacks is said in the profile's words (--create-keys does not help there), not as "pass --create-keys".
    # --to leaves the project alone, its Hydra group too (a profile beside the --to file is no Hydra option)
    device = row.env.get("device") or "cpu"
    profile = apply.write_hydra_profile(spec.apply, values, device, provenance, current) \
        if spec.apply.hydra_group_dir and to is None else None
    plan = apply.plan(spec.apply, values, provenance, to=to, create_keys=create_keys, current_values=current)
    # a file where only a new provenance header would change is left alone; --to: the copy is written
    # even where it reads exactly as the target does, unless it is already this very copy. The profile
    # on its own: `hardware=...` overrides the main config, so a profile edited back (or deleted) since
    # the last apply is written again
    main_due = bool(plan.changes) if to is None else not holds_already(plan)
    profile_due = profile is not None and bool(profile.changes)
    due = [p for p, is_due in ((plan, main_due), (profile, profile_due)) if is_due]
    if not dry_run:
        apply.check(*due)  # a read-only file is refused in one line, before a diff that will not be written
    if which == "best" and made.kept:
        out.print(f"keeping your config: {made.why[0]}", highlight=False, markup=False)
    if set_aside:
        out.print(set_aside, highlight=False, markup=False)
    if row.baseline and plan.changes and to is None:
        out.print(f"{spec.apply.file} no longer holds your config as swept (edited since): the diff below writes "
                  f"trial {row.number}'s values back", highlight=False, markup=False)
    elif edited:
        out.print(f"{spec.apply.file.name} makes {edited[0]} now, not your config as swept ({edited[1]}): "
                  f"'vs your config' below compares with trial {choice.baseline.number} as swept",
                  highlight=False, markup=False)
    out.print(f"trial {row.number}: {report.describe(row.config)}  {chosen.speed:.1f} {choice.unit} "
              f"({chosen.runs_words}), peak {size(chosen.peak)}"
              + (f"; vs your config as swept (trial {choice.baseline.number}) {versus_words}"
                 if versus_words else ""), highlight=False, markup=False)
    for warning in [*study_warnings(spec, rows, info), chosen.caveat and f"trial {row.number}: {chosen.caveat}",
                    noisy_baseline_warning(choice, chosen) or (SPOILED_WARNING if noise else None),
                    elsewhere_warning(info, spec, storage, results) if to is None else None,
                    *held_edited_warnings(spec, held, row.config), *(profile.warnings if profile else ())]:
        if warning:
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}", soft_wrap=True)
    if not main_due and not profile_due:
        out.print(f"nothing to change: {plan.path} already holds these values"
                  + (f", and so does {profile.path}" if profile is not None else "") + "; nothing written", markup=False)
        return
    if main_due:
        click.echo(plan.diff)
        for warning in plan.warnings:
            err.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    else:
        out.print(f"{plan.path} already holds these values; its hardware profile does not", markup=False)
    if plan.unmapped:
        out.print(f"not written (no key for them in apply.keys): {', '.join(plan.unmapped)}", markup=False)
    if profile_due:
        click.echo(profile.diff)
    elif spec.apply.hydra_group_dir and to is not None:
        out.print(f"hardware profile {spec.apply.hydra_group_dir / apply.device_slug(device)}.yaml not written: --to "
                  "leaves the project alone; apply without --to to write it", markup=False)
    if dry_run:
        out.print("dry run: nothing written")
        return
    for written, backup in zip(due, apply.write_together(*due)):  # both or neither
        out.print(f"wrote {'hardware profile ' if written is profile else ''}{written.path}"
                  + (f" (backup: {backup})" if backup else ""), markup=False)


def holds_already(plan) -> bool:
    """The --to file reads byte for byte as it would be written (an apply --to run twice the same day)."""
    try:
        return plan.path.read_bytes() == plan.new_text.encode("utf-8")
    except OSError:  # none yet, or unreadable: written (or refused) as any --to file is
        return False


def elsewhere_warning(info: dict, spec, storage: str | None, results: Path) -> str | None:
    """The spec was not found in this project (a copy, a worktree), and the one where the study was swept
    names a file outside it: said before that file is written (ledger.spec_file)."""
    project = Path(results).resolve().parent
    if storage or not info.get("spec_relative") or spec.apply.file.resolve().is_relative_to(project):
        return None
    if specs.same_path(project / info["spec_relative"], Path(spec.path)):  # found here: its target is its own choice
        return None
    return (f"the spec is not at {project / info['spec_relative']}; using {spec.path}, where the study was swept, "
            f"so this writes {spec.apply.file}, outside {project}; pass --to FILE to write elsewhere")


def held_edited_warnings(spec, held: dict, measured: dict) -> list[str]:
    """A knob held at your file's value (Spec.held) that you changed since the sweep: apply writes back the
    value every trial ran with, and says so."""
    return [f"{spec.apply.file.name}: {knob} is {value} now, but the sweep did not search it and every trial ran "
            f"{measured[knob]}, which this writes back as measured; to measure {value}, re-run the sweep"
            for knob, value in held.items() if knob in measured and measured[knob] != value]


def to_write(config: dict, named: list[str]) -> dict:
    """The knob values apply writes: every knob the spec names (searched, pinned, or held at your file's
    value: Spec.held). Any other was measured at bench's default, not chosen: writing it would change
    your file where the sweep chose nothing (your accumulation 2 became 1, and your lr with it)."""
    return {k: v for k, v in config.items() if k in named}


# ---- workloads, doctor ---------------------------------------------------------------------------

@main.command()
def workloads():
    """List the built-in workloads, their presets and the knobs each supports."""
    for name, info in WORKLOADS.items():
        out.print(f"[bold]{name}[/bold]: {info.description}")
        out.print(f"  presets: {', '.join(info.presets)}  (auto = {info.gpu_preset} on a GPU, {info.cpu_preset} on CPU)")
        extra = sorted(info.knobs)
        out.print(f"  knobs: {', '.join(sorted(knobs.UNIVERSAL))}" + (f"; workload knobs: {', '.join(extra)}" if extra else ""))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the facts as JSON.")
@results_option
@user_errors
def doctor(as_json, results):
    """What hardware this is, what it supports, and what would spoil a measurement."""
    from harness import doctor as doc
    doc.show(results, as_json=as_json, console=out)


if __name__ == "__main__":  # `python3 -m harness.cli` where bench is not installed (a GPU box)
    main()
