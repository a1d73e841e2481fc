"""The sweep: the ask/run/tell loop that fills a study (what a study holds and how it is read:
harness/ledger.py; where it is stored: harness/storage.py).

Two objectives: throughput (maximize) and peak memory (minimize). Every trial carries the same two
constraints (Optuna 5 `set_constraint`, feasible when <= 0): `memory` (over the budget's usable
part, or OOM) and `numerics` (diverged). An OOM is COMPLETE and infeasible, so the sampler learns
where the wall is; a crash, timeout or error is FAIL. The full trial record lives in the trial's
user attributes, so the study alone is enough to report and apply.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import math
import random
import socket
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from harness import apply, busy, failures, launch, ledger, pareto, planner, record, search, storage, units
from harness.errors import UserError
from harness.spec import Spec, all_configs, workload_label
from harness.storage import is_stale, study_dir, worker_id

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_DUPLICATES_IN_A_ROW = 30
PATIENCE = 5
"""--trials auto with an Optuna sampler (not the planner): stop after this many measured trials
without a better best."""
COMPILE_TOP = 2
"""Compile modes are tried on the best eager config, and on up to this many while compile keeps winning."""
SLOW_CUT = 0.7
"""A trial under this share of the best so far's samples/s after two windows (the faster) stops measuring
there: were the best's figure 10% high and this one's 10% low (pareto.MAX_NOISE, the most noise a figure
counts), it would still be at 0.86 of the best. At half, the quickstart's batch-768 probe (0.68 of the
best, 6.8 s steps) ran its third window and its memory breakdown, 16 of its 62 s."""
WARM_SLOW_CUT = 0.25
"""...and an eager one under this share in its first warm-up step, before any window: a single step,
so a wider margin (a compiled config's second step may still be compiling)."""
LONG_WARM_STEP_S = 2.0
LONG_WARM_SLOW_CUT = 0.55
"""...or under this share where that step took LONG_WARM_STEP_S or more. A first warm-up step that
long ran 0.89-1.13x its trial's windows' median in 33 of the 34 such eager trials of the recorded
landscapes (each recorded with one warm-up step; shorter steps reach 1.8x), so such a trial is at most
0.62 of the best, under SLOW_CUT. The 34th, a transformers Trainer's 2.6 s step at 1.46x, says a
Trainer trial at up to 0.80 of the best may be cut so, its figure then up to 30% low: still under
the 0.82 that could tie the best within the noise (pareto.MAX_NOISE either way). The quickstart's far
probes (batch 640-768, 7-9 s steps at 0.45-0.61 of the best, their warm-up steps 0.97-0.99x their
windows) under it run 2 steps, not 5: batch 640 fp32 took 23 s, 47 s when cut after two windows."""
CONFIRM_TOP = 1
CONFIRM_ROUNDS = 2
"""Before a sweep ends, the leading config and the baseline run again this many times, interleaved."""
WIDE_TIE_ROUNDS = 2
"""...and this many more, once, where the leader measured beyond any trial's noise (pareto.MAX_NOISE)
faster than your config yet ties with it because their rounds side by side disagree."""
CHALLENGERS = 2
"""...and then at most this many configs that would still beat the confirmed best on their single run."""
RESEARCHES = 1
"""With --trials auto, how many times the search goes on after confirmation lowered the best's figure."""
CONFIRM_POLL_S = 1.0
"""How often a worker looks whether another worker's confirmation run is recorded."""
TIME_UP = "sweep time limit reached; re-run the same command to continue"


class OutOfTime(Exception):
    """The sweep's time limit came before a confirmation round was to start: its runs run on a resume."""


# ---- the sweep loop ------------------------------------------------------------------------------

class Progress:
    """What the sweep tells its display; the CLI supplies the printing."""

    def started(self, done: int, total: int, study: str, running: int = 0) -> None: ...
    def trial_started(self, number: int, done: int, total: int, config: dict, baseline: bool) -> None: ...
    def trial_phase(self, heartbeat: dict | None) -> None: ...
    def trial_finished(self, number: int, rec: dict, best: dict | None, note: str | None = None) -> None:
        """`best`: the report's best as the records stand; `note`: why the leader is not it, if it is not."""
    def duplicate(self, number: int, of: int, config: dict) -> None: ...
    def note(self, message: str) -> None: ...


@dataclass
class Sweep:
    spec: Spec
    study: optuna.Study
    device: str
    results: Path | None
    """Where trial logs go; None: nowhere (a database study writes nothing under the current folder)."""
    total: int
    deadline: float | None
    progress: Progress = field(default_factory=Progress)
    claim: object = None
    """() -> a context manager held from ask to claiming a config (storage.claim_lock; default: a host lock)."""

    auto: bool = False
    """--trials auto: stop once no config left is predicted to beat the best by more than its noise (the
    planner's rule; with another sampler, once the best has not improved in PATIENCE trials)."""
    runner: object = None
    """config -> trial record. The real launcher by default; benchmarks/search_replay.py looks results up."""

    def __post_init__(self):
        self.runner = self.runner or self.launch
        self._planner = None
        # read once: the apply target's run length decides whether a compile pays back (harness.pareto)
        self.run_steps, self.run_source = run_of(self.spec.apply)
        self.stale = 0  # measured trials since the best last improved
        self.quiet = busy.Quiet(self.device, say=lambda line: self.progress.note(line), deadline=self.deadline)

    def run(self) -> None:
        launch.prestart()  # the warm trial server imports torch while the study gets ready
        self.fail_stale_trials()
        self.retry_what_stopped_the_last_sweep()
        running = len(self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        self.progress.started(self.counted(), self.total, self.spec.study, running)
        waits = self.quiet.left > 0  # BENCH_QUIET_WAIT=0: measure the machine as it is, never measure again
        # not while another worker's trial has the device: that is no outside load, and each trial looks again in its turn
        if not launch.turn_taken({"device": self.device, "config": {}}) \
                and self.quiet.wait("the sweep starts", longest=2 * busy.EACH_WAIT_S) is None and waits:
            self.remeasure_what_ran_busy()
        for _ in range(1 + RESEARCHES):
            if not self.search():
                return
            leader = self.leader_so_far()
            try:
                self.confirm()
            except OutOfTime:
                self.progress.note(TIME_UP)
                return
            after = self.leader_so_far()
            if not self.auto or not self.bar_fell(leader, after):
                break
            # --trials auto stopped against a figure confirmation did not bear out: search on against the new one
            self.stale = 0  # an Optuna sampler's patience counts from the new bar
            capped = not self.remaining()
            then = (f"the cap of {self.total} trials is reached; raise the spec's trials and re-run to search on"
                    if capped else "searching on")
            self.progress.note(f"confirmation puts the leader at {pareto.speed(after, self.spec.objective):.1f} "
                               f"{self.spec.objective}/s (#{after['number']}), not the "
                               f"{pareto.speed(leader, self.spec.objective):.1f} the search stopped against"
                               f"{self.why_the_bar_fell(leader)}: {then}")
            if capped:
                break
        self.keep_model()
        if self.quiet.closing():
            self.progress.note(self.quiet.closing())

    def why_the_bar_fell(self, leader: dict) -> str:
        """", as #6's confirmation run 1 ended crash" where a failed run, not slower runs, unseated it."""
        now = next((r for r in ledger.rows_of(self.study) if r["number"] == leader["number"]), leader)
        failed = pareto.failed_run(now)
        return f", as #{leader['number']}'s confirmation run {failed[0]} ended {failed[1]}" if failed else ""

    def search(self) -> bool:
        """Measure until the cap, the space or the planner's stop; False at the sweep's time limit."""
        duplicates_in_a_row, space = 0, self.spec.space_size()
        while self.remaining():
            if self.out_of_time():
                self.progress.note(TIME_UP)
                return False
            # only this space's configs: a resume whose spec narrowed a knob to one value keeps the others' trials
            tried = [t for t in self.measured_configs().values() if self.spec.contains(t.user_attrs["config"])]
            if len(tried) >= space and not self.queued():  # a queued config the spec dropped is set aside first
                self.progress.note(f"all {space} configs of the search space are tried: {outcome_words(tried)}")
                break
            if duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW:
                self.progress.note("the sampler keeps proposing measured configs; stopping early")
                break
            if not self.plan_next():
                break
            duplicates_in_a_row = 0 if self.run_one() else duplicates_in_a_row + 1
        return True

    def bar_fell(self, before: dict | None, after: dict | None) -> bool:
        """The confirmed best is slower than the best the search stopped against by more than any run's
        noise (pareto.MAX_NOISE): that figure was not a lucky draw but a wrong one (a busy machine)."""
        if before is None or after is None:
            return False
        objective = self.spec.objective
        return pareto.speed(after, objective) < pareto.speed(before, objective) * (1 - pareto.MAX_NOISE)

    def keep_model(self) -> None:
        """The planner's predictions for the configs never measured and one line on why best is best,
        kept with the study for `bench report` (predictions, never measurements)."""
        if self.spec.sampler == "tpe" and (rows := ledger.rows_of(self.study)):
            apart = self.compile_apart()  # the planner's own reach (queue_planned): compile modes are queued apart
            model = self.planner(rows).summary(rows, self.leader_so_far(),
                                               include=lambda c: not apart or c.get("compile", "off") == "off")
            # whether the sweep ended on its cap, over these rows: a later sweep stopped by time keeps no model
            self.study.set_user_attr("model", {**model, "rows": len(rows), "capped": self.counted() >= self.total})

    def plan_next(self) -> bool:
        """With nothing queued, queue what the search measures next; False once it should stop (--trials auto).

        The planner (harness.planner, sampler: tpe) decides: eager configs first, by the model's
        expected improvement, until none is predicted to beat the best by more than the noise (or
        only the compile phase's trials are left under the cap); then compile modes for the best
        eager config (and the next-best while compile keeps winning); then any config, compiled ones
        included, until the cap, or with --trials auto until the model's rule says stop. Other
        samplers propose every config themselves.
        """
        if self.queued():
            return True
        if self.eager_phase() and self.compile_reserve_reached():  # the cap must leave compile its trials
            self.end_eager_phase()
            return True
        if self.study.user_attrs.get("compile_phase") and self.queue_compile():
            return True
        if self.spec.sampler == "tpe":
            return self.queue_planned()
        if self.eager_phase() and self.eager_done():
            self.end_eager_phase()
            return True
        if self.auto and self.stale >= PATIENCE:
            self.progress.note(f"the best has not improved in {PATIENCE} trials: stopping (--trials auto)")
            return False
        return True

    def queue_planned(self) -> bool:
        eager = self.eager_phase()
        apart = self.compile_apart()
        rows = ledger.rows_of(self.study)
        config = self.planner(rows).next(rows, include=lambda c: not apart or c.get("compile", "off") == "off",
                                         stop=planner.EAGER_STOP_CHANCE if eager else planner.STOP_CHANCE if self.auto else None)
        if config is not None:
            self.enqueue(config)
            return True
        if eager:
            self.end_eager_phase()
            return True
        if self.auto:
            self.progress.note("no config left is predicted to beat the best by more than its noise: "
                               "stopping (--trials auto)" if any(r.get("status") == "ok" for r in rows) else
                               "no trial has given a throughput to rank (an OOM, a crash, a diverged loss), and the "
                               "configs left are ruled out by those trials (bench report says how each ended): "
                               "stopping (--trials auto)")
            return False
        return True  # every config is measured or ruled out: the sampler proposes (run() stops when all are)

    def planner(self, rows: list[dict] | None = None) -> planner.Planner:
        # the budget, or the device's memory where that is smaller or there is no budget, as the report's choice
        # takes it: known once a trial ran (a 64GiB budget on a 24GiB card would predict OOMs to fit)
        limit = pareto.capacity(ledger.rows_of(self.study) if rows is None else rows, self.spec.memory_budget)
        if self._planner is None or self._planner.limit != limit:
            self._planner = planner.Planner(list(all_configs(self.spec)), limit * (1 - self.spec.headroom) if limit else None,
                                            limit, self.device, self.spec.objective,
                                            max_step_s=None if self.device.startswith("cuda")
                                            else cpu_step_limit(self.spec), run_steps=self.run_steps)
        return self._planner

    def remaining(self) -> bool:
        self.fail_stale_trials()  # first: a dead worker's trial (this host's or another's) must not count as running
        return self.counted() < self.total

    # -- phases: eager configs first, compile only for the best eager ones ---------------------------
    def eager_phase(self) -> bool:
        return self.compile_apart() and not self.study.user_attrs.get("compile_phase")

    def compile_apart(self) -> bool:
        """Compile modes are measured apart, on the best eager configs (queue_compile), where a compile
        costs minutes and rarely pays (a CPU). On a GPU the planner weighs compile like any knob:
        removing launch overhead is often its largest single gain."""
        compile_dim = self.spec.search.get("compile")
        if self.spec.sampler == "grid" or not compile_dim or set(compile_dim.choices) <= {"off"}:
            return False
        return not (self.spec.sampler == "tpe" and self.device.startswith("cuda"))

    def eager_done(self) -> bool:
        eager = [c for c in all_configs(self.spec) if c.get("compile") == "off"]
        return all(search.key(c) in self.measured_configs() for c in eager) or self.stale >= PATIENCE

    def compile_reserve_reached(self) -> bool:
        """Only the trials the compile phase may need are left under the cap."""
        reserve = COMPILE_TOP * (len(self.spec.search["compile"].choices) - 1)
        return self.total - self.counted() <= reserve

    def end_eager_phase(self) -> None:
        self.study.set_user_attr("compile_phase", True)
        self.stale = 0
        if self.queue_compile():
            self.progress.note("eager search done; compile modes queued for the best eager config")

    def queue_compile(self) -> bool:
        """Queue every compile mode of the next-best eager config (by measured speed, feasible ones),
        up to COMPILE_TOP of them: the best always, each further one only while compiling has beaten
        its eager twin beyond the noise and paid back, since a cold compile costs a minute on a CPU, and
        only the modes the model gives a chance (compile_may_win). False if none."""
        if self.study.user_attrs.get("compile_closed"):  # declined once: not argued again at every trial
            return False
        rows = ledger.rows_of(self.study)
        candidates = {r["number"] for r in self.candidates(rows)}
        eager = sorted((r for r in rows if r["number"] in candidates and r["config"].get("compile") == "off"),
                       key=lambda r: -pareto.speed(r, self.spec.objective))[:COMPILE_TOP]
        compiled: dict[tuple, list[dict]] = {}
        for r in rows:
            if r["config"].get("compile", "off") != "off":
                compiled.setdefault(eager_twin(r["config"]), []).append(r)
        if len(compiled) >= COMPILE_TOP:  # a new best eager config found after them is not compiled too
            return False
        # where compiling lost to its eager twin (or never pays back), it is not tried again on a better eager
        # config found later (the quickstart spent a second minute compiling batch 32 after batch 24's compile
        # ran 18% slower); the next one would pay the same minute
        twins = {search.key(r["config"]): r for r in rows if r["config"].get("compile", "off") == "off"}
        if compiled and not any(c["number"] in candidates and pareto.faster(c, twins[key], self.spec.objective)
                                for key, runs in compiled.items() if key in twins for c in runs):
            return False
        tried = [r for r in eager if search.key(r["config"]) in compiled]
        untried = [r for r in eager if r not in tried]
        if not untried:
            return False
        configs = [{**untried[0]["config"], "compile": mode} for mode in self.spec.search["compile"].choices
                   if mode != "off"]
        if tried:
            configs = self.compile_may_win(tried[-1], untried[0], configs, rows)
            if not configs:
                self.study.set_user_attr("compile_closed", True)
                return False
        for config in configs:
            self.enqueue(config)
        return True

    def compile_may_win(self, won: dict, next_best: dict, configs: list[dict], rows: list[dict]) -> list[dict]:
        """The compile modes of the next-best eager config that the model, which has now seen compile's
        effect, gives a STOP_CHANCE to beat the best by more than the noise: the quickstart compiled batch
        24 bf16 for 69 s after batch 40's compile won by 18%, and it ran 148.7 against the best's 188.8."""
        plan = self.planner(rows)
        chances = plan.chances(configs, rows)
        speed, beat = max(chances, key=lambda pair: pair[1])
        unit = f"{self.spec.objective}/s"
        eager = f"#{next_best['number']} ({pareto.speed(next_best, self.spec.objective):.1f} {unit} measured eager)"
        if beat < planner.STOP_CHANCE:
            best = plan.best(rows)
            against = f" (#{best['number']}, {pareto.speed(best, self.spec.objective):.1f} measured)" if best else ""
            chance = "under 0.1%" if beat < 0.001 else f"{math.floor(beat * 1000) / 10:g}%"
            self.progress.note(f"compile beat eager on #{won['number']}, but {eager} compiled is predicted at "
                               f"{speed:.1f}, a {chance} chance to beat the best{against} by more than its noise: "
                               "not compiled")
            return []
        self.progress.note(f"compile beat eager on #{won['number']}: compiling the next-best eager config too, "
                           f"{eager}, predicted at {speed:.1f} compiled")
        return [config for config, (_, chance) in zip(configs, chances) if chance >= planner.STOP_CHANCE]

    def enqueue(self, config: dict) -> None:
        self.study.enqueue_trial(ledger.sampler_params(self.spec, config), user_attrs={"config": config})

    def queued(self) -> bool:
        return bool(self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))

    # -- one trial ---------------------------------------------------------------------------------
    def run_one(self) -> bool:
        """Ask, run (or skip, or drop a duplicate) and tell one trial. False when nothing was measured."""
        done = self.counted()
        trial, config, previous, drawn = self.claim_next()
        told: list[dict] = []  # the child's record once its run returned: what a Ctrl-C from here on keeps
        try:
            return self.run_claimed(trial, config, previous, drawn, done, told)
        except KeyboardInterrupt as stop:  # Ctrl-C, SIGTERM, SIGHUP between the claim and the tell, outside the run
            if ledger.still_running(self.study, trial):  # never left so: it would hold its config forever
                if told:
                    self.tell(trial, self.completed(trial, config, told[0]))  # measured: kept, as recover_trials keeps it
                else:
                    self.tell_interrupted(trial, config, str(stop) or "interrupted by the user (Ctrl-C)")
            raise

    def completed(self, trial, config: dict, rec: dict) -> dict:
        """The child's record made the study's: its number, config, log and what it re-measures (idempotent)."""
        rec.update(number=trial.number, config=config)
        if trial.user_attrs.get("remeasured_after"):  # what spoiled the run this one replaces, and which, for the report
            replaced = trial.user_attrs.get("remeasures")
            rec["remeasured_after"] = {**trial.user_attrs["remeasured_after"],
                                       **({"trial": replaced} if replaced is not None else {})}
        rec.setdefault("error", None)
        rec["log"] = self.log_of(trial.number)
        return rec

    def run_claimed(self, trial, config: dict, previous, drawn: bool, done: int, told: list) -> bool:
        """run_one's claimed trial, run (or skipped, or dropped as a duplicate) and told; `told` gets the
        child's record once the run returned it."""
        if not trial.user_attrs.get("baseline") and not self.spec.contains(config):
            self.set_aside(trial, config, drawn)
            self.enqueue_unmeasured(trial.number)
            return False
        if previous is not None and previous.number not in (trial.number, trial.user_attrs.get("remeasures")):
            self.tell_duplicate(trial, previous)
            self.progress.duplicate(trial.number, previous.number, config)
            self.enqueue_unmeasured(trial.number)
            return False
        # sampler: grid measures every config (that is how landscapes are recorded and skips checked)
        skip = None if self.spec.sampler == "grid" else search.skip_reason(config, ledger.rows_of(self.study),
                                                                           usable_memory(self.spec))
        if skip:
            self.tell_skipped(trial, config, skip)
            return False
        baseline = bool(trial.user_attrs.get("baseline"))
        self.progress.trial_started(trial.number, done, self.total, config, baseline)
        began = time.monotonic()
        try:
            with storage.heartbeat(self.study, trial):
                rec = self.runner(config, trial.number)
        except KeyboardInterrupt as stop:  # its wall time stays in the sweep's time split, as "ended early"
            self.tell_interrupted(trial, config, str(stop) or "interrupted by the user (Ctrl-C)",
                                  wall_s=time.monotonic() - began)
            raise
        if rec["status"] == record.INTERRUPTED and self.server_died_before(config):
            rec = dict(rec, status=record.CRASH, error={**rec["error"], "message": (
                "its warm trial server was killed during this config's trial twice: the trial may be what kills it")})
        if rec["status"] == record.INTERRUPTED:  # stopped from outside (its trial server was killed): runs again
            self.progress.trial_finished(trial.number, rec, *self.best_as_reported(trial.number))
            self.tell_interrupted(trial, config, rec["error"]["message"], kind=rec["error"]["type"])
            return True
        if (rec.get("error") or {}).get("type") == "FactoryImportError":  # every config would fail alike: stop
            self.tell_interrupted(trial, config, rec["error"]["message"], kind="FactoryImportError")
            where = "workload.factory" if "factory" in self.spec.workload else "workload"  # the message names the import
            raise UserError(f"{self.spec.shown}: {where}: {rec['error']['message']}; fix it and re-run "
                            f"(traceback in {self.log_path(trial.number)})")
        if rec["status"] in (record.OK, record.DIVERGED) and pareto.speed(rec, self.spec.objective) is None:
            # tokens/s of a workload whose samples have no length: so would every config be
            self.tell_interrupted(trial, config, "no tokens/s: the workload reports no tokens_per_sample")
            raise UserError(f"{self.spec.shown}: objective: tokens, but workload {workload_label(self.spec.workload)} "
                            "reports no tokens_per_sample (its samples have no length); set objective: samples and re-run")
        told.append(rec)
        self.completed(trial, config, rec)
        before = self.leader_so_far()
        self.tell(trial, rec)
        leader = self.leader_so_far()
        improved = leader is not None and (before is None or leader["number"] != before["number"])
        self.stale = 0 if improved else self.stale + 1
        self.progress.trial_finished(trial.number, rec, *self.best_as_reported(trial.number))
        if leader is None:
            self.stop_if_every_config_fails_alike(rec["log"])
        return True

    def stop_if_every_config_fails_alike(self, log: str | None) -> None:
        """Nothing trained and the first trials (every config, in a smaller space; the first alone when it
        marked its error `every_config`) failed with one error in the user's code: stop, and have the next
        sweep run them again (the user was told to fix it and re-run)."""
        rows = ledger.rows_of(self.study)
        enough = min(failures.SAME_ERROR_STOPS_AFTER, self.spec.space_size())
        if same := failures.hopeless(rows, enough):
            self.study.set_user_attr("stopped_on_error", [r["number"] for r in rows if r["status"] == record.ERROR])
            raise UserError(failures.stop_message(same, 1 if same.get("every_config") else enough, log))

    # -- the ledger: a trial's life is asked -> claimed -> measured | interrupted (re-queued) ----------
    # Every step below is one write to the study. A sweep killed between any two of them leaves a state
    # the next sweep recovers (recover_trials): a trial asked but never claimed, or claimed by a process
    # that is gone, is interrupted and its config queued again; it never counts as measured.

    def claim_next(self):
        """Ask the study for the next trial and claim it for this worker: (trial, config, measured twin or
        None, whether the sampler drew the config rather than the study queueing it).

        Ask and claim happen under the claim lock, which recover_trials takes too: a RUNNING trial without
        a worker seen under that lock was asked by a process that died before claiming it.
        """
        with self.claiming():
            trial = self.study.ask()
            try:
                # suggest() even for enqueued trials: it records their fixed params with distributions,
                # so the sampler sees every trial (baseline, grid, compile and frontier probes included).
                params = ledger.suggest(trial, self.spec, eager_only=self.eager_phase() and "config" not in trial.user_attrs)
                drawn = "config" not in trial.user_attrs
                config = trial.user_attrs.get("config") or self.spec.config(params)
                trial.set_user_attr("config", config)
                if not trial.user_attrs.get("baseline") and self.baseline_pending(config):
                    trial.set_user_attr("baseline", True)  # the baseline's config, measured by this trial instead
                trial.set_user_attr("worker", worker_id())  # last: the claim
                storage.first_beat(self.study, trial)
                previous = self.measured_configs(besides=trial.number).get(search.key(config))
            except KeyboardInterrupt:  # Ctrl-C while claiming: interrupted now, as the CLI says, not at the next resume
                self.tell_interrupted(trial, trial.user_attrs.get("config"), "interrupted by the user (Ctrl-C)")
                raise
        return trial, config, previous, drawn

    def baseline_pending(self, config: dict) -> bool:
        """`config` is the baseline's and no baseline trial has measured (or is measuring) it: the baseline
        was interrupted and this trial (a grid's twin, or its re-queued self) carries its mark on."""
        marked = [t for t in self.study.get_trials(deepcopy=False) if t.user_attrs.get("baseline")
                  and t.state != TrialState.WAITING]
        return (bool(marked) and all(ledger.interrupted(t) for t in marked)
                and any(search.key(t.user_attrs.get("config") or {}) == search.key(config) for t in marked))

    def job(self, config: dict, number: int, repeat: bool = False) -> dict:
        """Trial `number`'s job. With a results folder, trials share the study's reusable figures
        (harness.reuse) and each config keeps its compile cache, warm only for a `repeat` of a
        measured config (launch.compile_cache)."""
        job = dict(self.spec.job(self.device, config), trial=number, repeat=repeat)
        # a config at a fraction of the best so far needs no precise figure; in samples/s, so not where
        # the objective is tokens (a longer sequence has fewer samples/s and may still lead)
        best = None if repeat or self.spec.objective != "samples" else self.leader_so_far()
        if best is not None and best.get("throughput"):
            job["measure"] = dict(job["measure"], slow_below=SLOW_CUT * best["throughput"])
            if config.get("compile", "off") == "off":
                job["measure"]["warm_slow_below"] = WARM_SLOW_CUT * best["throughput"]
                job["measure"].update(long_warm_slow_below=LONG_WARM_SLOW_CUT * best["throughput"],
                                      long_warm_step_s=LONG_WARM_STEP_S)
        if self.results is not None:
            folder = study_dir(self.results, self.spec.study)
            digest = hashlib.sha256(repr(search.key(config)).encode()).hexdigest()[:16]
            job.update(reuse_dir=str(folder / "reuse"), compile_cache=str(folder / "inductor" / digest))
        return job

    def launch(self, config: dict, number: int, repeat: bool = False) -> dict:
        """Run `config` in a fresh child, once the machine is quiet (or the wait for quiet is over: then
        the record says it ran busy; running it again would measure the same load)."""
        looked = {}

        def look():  # once the device is ours: another worker's trial on it is waited out, not load
            looked["busy"] = self.quiet.wait(f"trial {number}" + (" (confirmation run)" if repeat else ""))
            looked["before"] = busy.snapshot(self.device)

        def beat(heartbeat):
            others.beat(heartbeat)
            self.progress.trial_phase(heartbeat)

        others = busy.OthersWhileMeasuring()
        log = self.confirmation_log_path(number) if repeat else self.log_path(number)
        rec = launch.run(self.job(config, number, repeat), launch.Limits(self.spec.trial_timeout_s, self.spec.stall_s),
                         log, on_beat=beat, on_turn=look)
        rec["busy"] = looked["busy"] or busy.verdict(looked["before"], busy.snapshot(self.device), others.cores())
        self.quiet.measured(rec["busy"] if rec.get("throughput") else None)  # load spoils a speed, not an OOM
        return rec

    # -- confirmation ------------------------------------------------------------------------------
    def out_of_time(self) -> bool:
        """No run may start: the sweep's time limit (--timeout, or the spec's timeout) has passed."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def confirm(self) -> None:
        """Re-measure the leader and the baseline in fresh processes, interleaved (A B B A), or your config
        alone where it leads (one lucky run of it must not be the bar the others lose to); then each
        config that would win over the confirmed best beyond the noise if its single run held (at most
        CHALLENGERS), with the baseline again: a race, so best is never beaten by an unconfirmed run and
        no run is spent on a clear loser."""
        rows = ledger.rows_of(self.study)
        fits = self.candidates(rows)
        confirmed = [r for r in fits if pareto.confirmed(r)]
        if confirmed:  # a resume after the race: the confirmed best leads, and only the challenger rule races
            # another (the fastest single run led instead, a hair over it, and each re-run changed the answer)
            leaders = [pareto.pick(confirmed, self.spec.objective, pareto.capacity(fits, self.spec.memory_budget))]
        else:
            leaders = sorted(fits, key=lambda r: -pareto.speed(r, self.spec.objective))[:CONFIRM_TOP]
        base = next((r for r in rows if r.get("baseline") and r["status"] == record.OK), None)
        chosen = leaders + ([base] if base and all(base["number"] != r["number"] for r in leaders) else [])
        if not chosen or (len(fits) < 2 and (base is None or chosen == [base])):
            return  # one config fits: no choice among configs to confirm
        # alone where your config did not run ok (or has no trial): nothing to run it side by side with
        rounds = self.rounds_for(chosen, CONFIRM_ROUNDS)
        to_do = self.runs_to_do(chosen, rounds)
        if any(to_do.values()):  # a resume after the confirmation says only what is left
            self.progress.note("confirming: " + confirmation_words(to_do))
        self.confirm_runs(chosen, rounds)
        for _ in range(CHALLENGERS):
            challenger, bar = self.challenger()
            if challenger is None:
                break
            # beside your config, in rounds of their own: its tie with your config is read from runs made side
            # by side, and your config's earlier rounds ran beside the leader, minutes before
            raced = [challenger] + ([base] if base else [])
            self.progress.note(f"#{challenger['number']} ran faster once than {bar}: "
                               f"confirming it too" + (", side by side with your config" if base else ""))
            self.confirm_runs(raced, self.rounds_for(raced, CONFIRM_ROUNDS))
        self.settle_wide_tie()

    def settle_wide_tie(self) -> None:
        """A leader measured more than MAX_NOISE faster than your config that ties with it only because
        their rounds side by side disagree (a noisy host ran your config at 168.6, 123.0 and 171.6 and kept
        it over a 1.30× leader) runs WIDE_TIE_ROUNDS more rounds with it: a gain that size is not given
        up on two rounds, and four tell what two could not. Once per study, so a resume does not repeat it."""
        rows = ledger.rows_of(self.study)
        choice = self.choice(rows)
        if not choice.wide_tie:
            return
        by_number = {r["number"]: r for r in rows}
        pair = [by_number[choice.leader.number], by_number[choice.baseline.number]]
        rounds = self.rounds_for(pair, CONFIRM_ROUNDS + WIDE_TIE_ROUNDS)
        if any((to_do := self.runs_to_do(pair, rounds)).values()):
            self.progress.note(f"#{pair[0]['number']} ties with your config only because their runs side by side "
                               "disagree: " + confirmation_words(to_do))  # no "1× ± 31.60": no band anyone reads
        self.confirm_runs(pair, rounds)

    def rounds_for(self, chosen: list[dict], whole: int) -> range:
        """The rounds `chosen` run so that `whole` of them are made together: those after the last round
        some of them ran and others did not, which never becomes one. A resume whose leader changed found
        your config's rounds 0 and 1 made with the old leader, and a sweep killed mid-round left one run
        of it: the new runs of that round would be made apart (days, on a resume) yet read side by side."""
        attrs = self.study.user_attrs
        numbers = {r["number"] for r in chosen}
        top = max([k for n, k, _ in ledger.confirm_slots(attrs) if n in numbers]
                  + [len((attrs.get("repeats") or {}).get(str(n)) or []) - 1 for n in numbers], default=-1)
        open_ = {k: {self.confirmation_free(attrs.get(ledger.confirm_key(r["number"], k)), r["number"], k, attrs)
                     for r in chosen} for k in range(top + 1)}
        start = max((k + 1 for k, states in open_.items() if len(states) > 1), default=0)
        made = sum(open_[k] == {False} for k in range(start))
        return range(start, start + max(whole - made, 0))

    def confirm_runs(self, chosen: list[dict], rounds: range) -> None:
        """The runs of `rounds` of each of `chosen`, interleaved; each run kept as its own record
        (study attribute confirm:NUMBER:ROUND), so a resume runs only what is missing. One worker claims
        every run left at once: runs split between workers (or devices) would not be side by side.
        Returns once every run is recorded, by this worker or another."""
        while True:
            slots = self.claim_confirmation(chosen, rounds)
            if not slots:
                if not self.confirmation_pending(chosen, rounds):
                    return
                if self.out_of_time():
                    raise OutOfTime
                time.sleep(CONFIRM_POLL_S)  # another worker's runs: their results decide what comes next
                continue
            broken = set()  # rounds whose run was stopped from outside: they run again whole, in a later claim
            for done, (row, round_) in enumerate(slots):
                if round_ in broken:
                    continue
                try:
                    # a round begun is finished: its runs are read side by side, and half of one is run again whole
                    if self.out_of_time() and (done == 0 or slots[done - 1][1] != round_):
                        raise OutOfTime
                    self.mark([s for s in slots[done + 1:] if s[1] not in broken],
                              {"state": "claimed", "worker": worker_id(), "at": time.time()})
                    made = self.confirmation_run(row, round_, rounds)  # ^ the later runs' claims kept fresh for other hosts
                except BaseException:
                    # stopped: the runs not made are free to run again, and so are those of the stopped run's
                    # round made before it, so that the round runs again side by side
                    self.mark([s for s in slots[:done] if s[1] == round_] + slots[done:], {"state": "free"})
                    raise
                if not made:
                    broken.add(round_)
                    self.mark([s for s in slots if s[1] == round_], {"state": "free"})

    def mark(self, slots: list[tuple[dict, int]], state: dict) -> None:
        """Each slot set to `state`, keeping the busy run it makes again (remeasure_what_ran_busy)."""
        attrs = self.study.user_attrs
        for row, round_ in slots:
            key = ledger.confirm_key(row["number"], round_)
            self.study.set_user_attr(key, {**state, **kept_run(attrs.get(key))})

    def confirmation_run(self, row: dict, round_: int, rounds: range) -> bool:
        """One claimed confirmation run, made and recorded; False where its child was stopped from
        outside (its trial server killed), and nothing is recorded."""
        try:
            rec = self.runner(row["config"], row["number"], repeat=True)  # a warm compile cache is fine here
        except KeyboardInterrupt as stop:
            stop.confirmation = row["number"]  # what the CLI's one line says was stopped
            raise
        if rec["status"] == record.INTERRUPTED:
            return False
        run = {"status": rec["status"], "throughput": rec.get("throughput"), "tokens_per_s": rec.get("tokens_per_s"),
               "peak_memory": rec.get("peak_memory"), "busy": rec.get("busy")}
        key = ledger.confirm_key(row["number"], round_)
        # the busy run it replaces is kept: a round stopped half-way runs again whole, and stands till then
        self.study.set_user_attr(key, {"state": "done", "run": run, **kept_run(self.study.user_attrs.get(key))})
        value = pareto.speed(run, self.spec.objective) if run["throughput"] else None  # the unit trials are told in
        speed = f"{value:.1f} {self.spec.objective}/s" if value else (rec.get("error") or {}).get("message", "")
        # counted among this config's own runs: a challenger's rounds 2-3 are its runs 1 and 2, not "3 of 4"; a
        # round run again after a stop, or another worker's, counts once
        runs = ledger.confirmation_runs(self.study.user_attrs).get(str(row["number"]), [])
        earlier = sum(r["round"] not in rounds for r in runs)  # its runs made before this race
        self.progress.note(f"  #{row['number']} confirmation run {len(runs)} of {earlier + len(rounds)}: "
                           f"{run['status']} {speed}".rstrip())
        return True

    def claim_confirmation(self, chosen: list[dict], rounds: range) -> list[tuple[dict, int]]:
        """Every confirmation run of `rounds` nobody has done or is doing, claimed by this worker; in A B B A
        order, so that neither config always runs first in its round (just after another config's process)."""
        slots = []
        with self.claiming():
            attrs = self.study.user_attrs
            for round_ in rounds:
                for row in (chosen if round_ % 2 == 0 else chosen[::-1]):
                    key = ledger.confirm_key(row["number"], round_)
                    if self.confirmation_free(attrs.get(key), row["number"], round_, attrs):
                        slots.append((row, round_))
            self.mark(slots, {"state": "claimed", "worker": worker_id(), "at": time.time()})
        return slots

    def confirmation_free(self, slot, number: int, round_: int, attrs: dict) -> bool:
        """Not done, not claimed by a live worker (on this host: its process lives; elsewhere: it claimed
        the run less than a trial's time limit ago), and not done before confirm:* records existed."""
        if round_ < len((attrs.get("repeats") or {}).get(str(number)) or []):  # a study from before
            return False
        if not isinstance(slot, dict) or slot.get("state") not in ("claimed", "done"):
            return True
        if slot["state"] == "done":
            return False
        worker = slot.get("worker") or {}
        if worker.get("host") == socket.gethostname():
            return is_stale(worker)
        return time.time() - float(slot.get("at") or 0) > 2 * self.spec.trial_timeout_s + 60

    def runs_to_do(self, chosen: list[dict], rounds: range = range(CONFIRM_ROUNDS)) -> dict[int, int]:
        """Each of `chosen`'s confirmation runs of `rounds` not yet done, by trial number (a claimed one
        counts: it may be a dead worker's)."""
        attrs = self.study.user_attrs
        return {r["number"]: sum((attrs.get(ledger.confirm_key(r["number"], k)) or {}).get("state") != "done"
                                 and k >= len((attrs.get("repeats") or {}).get(str(r["number"])) or [])
                                 for k in rounds)
                for r in chosen}

    def confirmation_pending(self, chosen: list[dict], rounds: range) -> bool:
        """A run of `chosen` in `rounds` is claimed and not yet done (claim_confirmation found none free: a
        live worker's)."""
        attrs = self.study.user_attrs
        return any((attrs.get(ledger.confirm_key(r["number"], k)) or {}).get("state") == "claimed"
                   for r in chosen for k in rounds)

    def challenger(self) -> tuple[dict | None, str]:
        """The fastest unconfirmed fitting config that would be chosen over the confirmed leader if its
        single run held (pareto.prefer), beyond the noise of either, or tied with it and lighter where
        memory is scarce; where the leader ties with your config, which stays, one faster than
        your config beyond the noise: ties are not transitive, and confirmed it may be chosen over the tie.
        With it, the bar it beat, in the words the report uses (the leader, or your config)."""
        objective, rows = self.spec.objective, ledger.rows_of(self.study)
        fits = self.candidates(rows)
        capacity = pareto.capacity(fits, self.spec.memory_budget)
        best = pareto.pick([r for r in fits if pareto.confirmed(r)], objective, capacity)
        if best is None:
            return None, ""
        # raced and still unconfirmed (a run crashed or ran out of memory): not a config to act on, nor to race again
        fits = [r for r in fits if not pareto.confirmed(r) and self.race_left(r)]
        # beyond the noise of either (a single run a hair over the median is no news on a host whose runs
        # spread 8-10%, the quickstart raced one such after another), or tied and lighter where memory is scarce
        open_ = [r for r in fits if pareto.prefer([best, r], objective, capacity) is r
                 and (pareto.faster(r, best, objective) or not pareto.roomy([best, r], capacity))]
        bar = f"the confirmed leader's median (#{best['number']})"
        choice = None if open_ else self.choice(rows)
        if choice is not None and choice.kept:
            base = next(r for r in rows if r["number"] == choice.baseline.number)
            open_ = [r for r in fits if pareto.faster(r, base, objective)]
            bar = (f"your config (#{base['number']}) beyond the noise (your config stays: the leader, "
                   f"#{choice.leader.number}, ties with it)")
        return max(open_, key=lambda r: pareto.speed(r, objective), default=None), bar

    def race_left(self, row: dict) -> int:
        """Runs of `row`'s race not yet done: CONFIRM_ROUNDS rounds from the first it ran in (a challenger's
        start after your config's rounds; counted from round 0, a challenger whose run failed was raced again
        and again, and the next one never)."""
        first = min((k for n, k, _ in ledger.confirm_slots(self.study.user_attrs) if n == row["number"]), default=0)
        return self.runs_to_do([row], range(first, first + CONFIRM_ROUNDS))[row["number"]]

    def candidates(self, rows: list[dict]) -> list[dict]:
        """The rows the report's choice may pick as best (harness.pareto.Choice.candidates: a compile
        that does not pay back within the target's run is not one): the ones worth confirming."""
        return self.planner(rows).candidates(rows)

    def claiming(self):
        """Workers take turns from ask to claiming a config, and in recovering stale trials.

        Without it two workers can both claim one sampled config (each checks before the other
        has written its own), or both recover one stale trial (the second tell raises).
        """
        return (self.claim or storage.claim_lock(None, self.results, self.spec.study))()

    def log_path(self, number: int) -> Path | None:
        if self.results is None:
            return None
        return study_dir(self.results, self.spec.study) / "logs" / f"trial-{number:04d}.log"

    def confirmation_log_path(self, number: int) -> Path | None:
        """A confirmation run's own log beside its trial's, which keeps the trial's output: the next free
        trial-NNNN-confirm-K.log, created here so that two workers never pick the same K."""
        if self.results is None:
            return None
        folder = study_dir(self.results, self.spec.study) / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        for run in itertools.count(1):
            path = folder / f"trial-{number:04d}-confirm-{run}.log"
            try:
                path.open("x").close()
                return path
            except FileExistsError:
                continue

    def log_of(self, number: int, written: bool = False) -> str | None:
        """The log path a record names: absolute, readable from wherever `bench report` runs (`written`:
        only where the child wrote one)."""
        log = self.log_path(number)
        return str(log.resolve()) if log and (log.is_file() or not written) else None

    # -- telling -----------------------------------------------------------------------------------
    def tell(self, trial: optuna.Trial, rec: dict) -> None:
        speed = pareto.speed(rec, self.spec.objective)
        status = rec["status"]
        trial.set_user_attr("status", status)
        trial.set_user_attr("record", rec)
        limit = usable_memory(self.spec)
        if status in (record.OK, record.DIVERGED):
            peak = float(rec["peak_memory"])
            trial.set_constraint("memory", peak / limit - 1.0 if limit else -1.0)
            trial.set_constraint("numerics", 1.0 if status == record.DIVERGED else -1.0)
            self.study.tell(trial, [float(speed), peak])
        elif status == record.OOM:
            # Optuna COMPLETEs a trial only with values, and an OOM measured none. Told as COMPLETE with
            # the `memory` constraint violated, the constrained samplers learn the infeasible region
            # (FAIL would let them propose it again) and best_trials never holds it. The values are the
            # sampler's penalty only, marked as such: no throughput, and memory no better than the
            # budget (or than any config measured so far). Reports read the record, whose peak is null.
            trial.set_constraint("memory", 1.0)
            trial.set_constraint("numerics", -1.0)
            trial.set_user_attr("values_are_penalty", True)
            self.study.tell(trial, [0.0, self.oom_penalty()])
        elif status == record.SKIPPED:  # the sampler learns the wall (infeasible), as from an OOM
            trial.set_constraint("memory", 1.0)
            trial.set_constraint("numerics", -1.0)
            self.study.tell(trial, [0.0, float(rec["skip"].get("predicted_peak") or usable_memory(self.spec) or 0.0)])
        else:
            self.study.tell(trial, state=TrialState.FAIL)

    def oom_penalty(self) -> float:
        if self.spec.memory_budget:
            return float(self.spec.memory_budget)
        told = [t.values[1] for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
        return max(told, default=0.0)

    def tell_duplicate(self, trial, previous) -> None:
        """A config measured before is not run again, nor told as a second observation of it:
        FAIL, which samplers ignore, marked duplicate_of (the measurement is already in the history)."""
        trial.set_user_attr("duplicate_of", previous.number)
        trial.set_user_attr("status", previous.user_attrs.get("status"))
        self.study.tell(trial, state=TrialState.FAIL)

    def set_aside(self, trial, config: dict, drawn: bool) -> None:
        """A config the spec does not hold (queued, or drawn from the study's old choices, before a resume
        narrowed a knob's list; or `drawn` with a value only your config has, which is said before the
        sweep): not run, FAIL (samplers ignore it), in no view and no count."""
        dropped = self.spec.unheld(config)  # a fixed one: a list narrowed to one value
        trial.set_user_attr("outside_space", True)
        self.study.tell(trial, state=TrialState.FAIL)
        if drawn and dropped:  # the sampler's choices hold your config's values so that it could be enqueued: said before
            yours = ledger.baseline_config(self.study) or {}
            dropped = [knob for knob in dropped if knob not in yours or yours[knob] != config[knob]]
            if not dropped:
                return
        dropped = [f"{knob} {config[knob]}" for knob in dropped]
        self.progress.note(f"trial {trial.number} not run: {', '.join(dropped) or search.describe(config)} is no longer "
                           "in the spec's search space (the study queued or drew it before the spec changed)")

    def tell_skipped(self, trial, config: dict, skip: dict) -> None:
        """Not run: its family proves it cannot fit. The sampler learns the wall (infeasible);
        reports never show it as a measurement and it is never chosen."""
        self.tell(trial, {"status": record.SKIPPED, "config": config, "throughput": None, "peak_memory": None,
                          "number": trial.number, "error": None, "skip": skip})
        self.progress.note(f"trial {trial.number} skipped: {search.describe(config)}: {skip['reason']} "
                           f"(from trial{'s' if len(skip['from']) > 1 else ''} {', '.join(map(str, skip['from']))})")

    def enqueue_unmeasured(self, number: int) -> None:
        """Samplers re-propose measured configs (TPE on a small space does, often): queue one not yet measured."""
        if self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            return
        rng, measured = random.Random(self.spec.seed * 100_003 + number), self.measured_configs()
        for _ in range(1000):
            params = {name: rng.choice(dim.choices) if dim.choices else rng.randint(dim.low, dim.high)
                      for name, dim in self.spec.search.items()}
            if self.eager_phase() and "compile" in params:
                params["compile"] = "off"
            config = self.spec.config(params)
            if search.key(config) not in measured:
                self.enqueue(config)
                return

    def server_died_before(self, config: dict) -> bool:
        """An earlier trial of `config` was interrupted by its trial server's death: twice is the trial's doing."""
        key = search.key(config)
        return any(search.key(t.user_attrs.get("config") or {}) == key
                   and ((t.user_attrs.get("record") or {}).get("error") or {}).get("type") == launch.SERVER_DIED
                   for t in self.study.get_trials(deepcopy=False, states=(TrialState.FAIL,)))

    def tell_interrupted(self, trial, config: dict | None, why: str, kind: str = "Interrupted",
                         wall_s: float | None = None) -> None:
        """Never a measured result: FAIL, marked interrupted, and its config queued to run again.

        Without a config (asked from the sampler, killed before it was claimed) nothing is queued: the
        sampler proposes afresh.
        """
        rec = {"status": record.INTERRUPTED, "config": config or {}, "throughput": None, "peak_memory": None,
               "number": trial.number, "error": {"type": kind, "message": why},
               "log": self.log_of(trial.number, written=True)}  # what the child printed, where it got that far
        if wall_s is not None:
            rec["timing"] = {"trial_wall_s": wall_s}
        trial.set_user_attr("status", record.INTERRUPTED)
        trial.set_user_attr("record", rec)
        if config:  # queued before the FAIL: a kill between the two leaves a RUNNING trial, recovered again
            ledger.requeue(self.study, self.spec, config, trial.user_attrs)
        self.study.tell(trial, state=TrialState.FAIL)

    def retry_what_stopped_the_last_sweep(self) -> None:
        """The trials that stopped the last sweep with one error in the user's code are set aside
        (superseded: no view shows them, none counts) and their configs queued again: after "fix it and
        re-run the same command", the fixed code is what gets measured."""
        with self.claiming():
            stopped = self.study.user_attrs.get("stopped_on_error") or []
            if not stopped:
                return
            trials = {t.number: t for t in self.study.get_trials(deepcopy=False)}
            for number in stopped:
                attrs = trials[number].user_attrs if number in trials else {}
                if attrs.get("config"):
                    ledger.requeue(self.study, self.spec, attrs["config"], attrs)
            ledger.supersede(self.study, stopped)
            self.study.set_user_attr("stopped_on_error", [])  # last: a kill before it retries again, nothing lost
        self.progress.note(f"running again the {len(stopped)} config(s) that stopped the last sweep with an error")

    def remeasure_what_ran_busy(self) -> None:
        """On a quiet machine, what a busy one measured runs again, so that "run the same command again
        when the machine is quiet" does what it says: a trial measured busy, or too noisy to rank (once),
        has its config queued, and a busy confirmation run is freed to run again. Each old figure stands
        until its new one is recorded (ledger.superseded, `kept`): a sweep stopped before that loses
        nothing. A confirmed trial keeps its own run: the median of its runs already outvotes one busy figure."""
        with self.claiming():
            trials = self.study.get_trials(deepcopy=False)
            rows, attrs = ledger.rows_of(self.study), self.study.user_attrs
            queued = ledger.remeasured(trials)
            again = [r for r in rows if r["status"] == record.OK and not pareto.confirmed(r) and r["number"] not in queued
                     and not r.get("unsearched")  # out of the search now: never chosen, nothing to measure again
                     and (r.get("busy") or (pareto.noisy(r) and "noisy_cv" not in (r.get("remeasured_after") or {})))]
            by_number = {t.number: t for t in trials}
            for r in again:
                first = r.get("busy") or {"noisy_cv": record.Record.of(r).step_cv}
                ledger.requeue(self.study, self.spec, r["config"], {**by_number[r["number"]].user_attrs,
                                                                     "remeasured_after": first, "remeasures": r["number"]})
            done = {(n, k): slot["run"] for n, k, slot in ledger.confirm_slots(attrs)
                    if isinstance(slot, dict) and slot.get("state") == "done" and isinstance(slot.get("run"), dict)}
            runs = [slot for slot, run in done.items() if run.get("busy")]
            # a busy run's round runs again whole: the other configs' runs of it too, to be side by side again
            spoiled = {k for _, k in runs}
            partners = [slot for slot in done if slot[1] in spoiled]
            for slot in set(runs) | set(partners):
                self.study.set_user_attr(ledger.confirm_key(*slot), {"state": "free", "kept": done[slot]})
        if again:
            self.progress.note(f"the machine is quiet: measuring again {units.count(len(again), 'trial')} a busy machine or noise "
                               "spoiled (" + ", ".join(f"#{r['number']}" for r in again) + ")")
        if runs:
            extra = len(set(partners) - set(runs))
            self.progress.note(f"the machine is quiet: {units.count(len(runs), 'confirmation run')} made on a busy machine run again"
                               + (f", with the {units.count(extra, 'run')} side by side with them" if extra else ""))

    def fail_stale_trials(self) -> None:
        """RUNNING trials no live worker holds: interrupted, re-queued (recover_trials)."""
        with self.claiming():
            storage.fail_stale_trials(self.study)
            self.recover_trials()

    def recover_trials(self) -> None:
        """Under the claim lock: a trial claimed by a process that died on this host (kill -9, reboot, a
        full disk), or asked and never claimed (its asker died in the claim window, which this lock
        covers), is interrupted and runs again; one that died after writing its record is told it.
        Another host's dead worker is found by Optuna's heartbeat (storage.requeue_stale)."""
        for ft in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            worker = ft.user_attrs.get("worker")
            if worker and not is_stale(worker):
                continue
            handle = optuna.trial.Trial(self.study, ft._trial_id)  # Optuna has no public handle by number
            rec = ft.user_attrs.get("record")
            if rec and rec.get("status") != record.INTERRUPTED:  # killed between its record and the tell
                with warnings.catch_warnings():  # constraints written before the kill stay as they were
                    warnings.filterwarnings("ignore", "The constraint value is ignored", UserWarning)
                    self.tell(handle, rec)
                self.progress.note(f"trial {ft.number} was measured by a process that died before it was told; "
                                   "its measurement is kept")
                continue
            self.tell_interrupted(handle, ft.user_attrs.get("config"), "its bench process died" if worker else
                                  "its bench process died before claiming it")
            if ft.user_attrs.get("config"):  # none drawn yet: nothing to run again, and no row shows it
                self.progress.note(f"trial {ft.number} was left running by a process that died; it runs again")

    # -- counting ----------------------------------------------------------------------------------
    def counted(self) -> int:
        """Trials that count toward the total: measured (not duplicates, not interrupted) or running."""
        trials = self.study.get_trials(deepcopy=False)  # read once: a database study pays a query per read
        aside = ledger.superseded(self.study, trials) | ledger.remeasured(trials)  # the new trial counts instead
        done = sum(1 for t in trials if t.state in (TrialState.COMPLETE, TrialState.FAIL)
                   and not ledger.not_run_itself(t) and t.number not in aside
                   and not ledger.interrupted(t) and t.user_attrs.get("status") != record.SKIPPED)
        running = sum(t.state == TrialState.RUNNING for t in trials)  # other workers'
        return done + running

    def measured_configs(self, besides: int | None = None) -> dict:
        """config key -> the trial that measured it (running ones too, so workers never run a config twice).

        `besides`: a trial just claimed, left out so that another worker's claim of its config is seen.
        """
        out, aside = {}, ledger.superseded(self.study)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL, TrialState.RUNNING)):
            if ledger.interrupted(t) or ledger.not_run_itself(t) or t.number == besides or t.number in aside:
                continue
            if "config" in t.user_attrs:
                out.setdefault(search.key(t.user_attrs["config"]), t)
        return out

    def choice(self, rows: list[dict] | None = None) -> pareto.Choice:
        """The choice `bench report` makes of the study as it stands (a compile judged against the run
        the apply target describes, as the report judges it)."""
        rows = ledger.rows_of(self.study) if rows is None else rows
        choice = pareto.choose(rows, self.spec.memory_budget, self.spec.headroom, self.spec.objective,
                               run_steps=self.run_steps, run_source=self.run_source)
        return replace(choice, applies=self.spec.apply is not None,  # "your config as swept", or "the baseline"
                       model=self.study.user_attrs.get("model"))

    def best_as_reported(self, number: int | None = None) -> tuple[dict | None, str | None]:
        """The row `bench report` would call best now, and the report's reason where trial `number` (just
        measured) or the leader is faster yet not best: a tie with your config, or one run a confirmed best outranks."""
        rows = ledger.rows_of(self.study)
        choice = self.choice(rows)
        best = next((r for r in rows if choice.best is not None and r["number"] == choice.best.number), None)
        if choice.kept or choice.sure_over_tie:
            return best, choice.why[0]
        if choice.passed_over is not None and choice.passed_over.number == number:
            return best, pareto.passed_over_words(choice)
        return best, pareto.ruled_out(choice, number)  # else pareto.why_not's noise, headroom or tie

    def leader_so_far(self) -> dict | None:
        """The leading config's row: the planner's bar and the slow cut's (ties with your config do not matter here)."""
        rows = ledger.rows_of(self.study)
        leader = self.choice(rows).leader
        return next((r for r in rows if leader is not None and r["number"] == leader.number), None)


def run_of(target) -> tuple[int | None, str]:
    """The optimizer steps of the training run the apply target describes (None: pareto.ASSUMED_RUN_STEPS),
    and where they come from, in the words every view gives: the report, `bench apply` and the live line."""
    steps, said = apply.run_length(target) if target else (None, "no apply target")
    return steps, said if steps else f"an assumed run of {pareto.ASSUMED_RUN_STEPS:,} steps ({said})"


def cpu_step_limit(spec: Spec) -> float:
    """The slowest optimizer step a CPU trial may be predicted (at its slow end) to take. A trial runs its
    first step, the warm-up steps, at least min_windows timed steps and about two more for the memory
    breakdown and the fp32 reference: those fit in half the trial's timeout (allowed all of it, the
    quickstart's batch 1024 ran 20 s steps for 178 of its 180 s), and a warm-up step in half the stall limit."""
    steps = 1 + spec.measure.warmup_steps + spec.measure.min_windows + 2
    return min(spec.stall_s / 2, spec.trial_timeout_s / (2 * steps))


def kept_run(slot) -> dict:
    """Of a confirmation slot, the busy run it is to make again ({"kept": run}), or nothing."""
    return {"kept": slot["kept"]} if isinstance(slot, dict) and isinstance(slot.get("kept"), dict) else {}


def usable_memory(spec: Spec) -> float | None:
    return spec.memory_budget * (1 - spec.headroom) if spec.memory_budget else None


def confirmation_words(to_do: dict[int, int]) -> str:
    """"#5, #0 run 2 more times each, interleaved", or per trial where a resume left them uneven."""
    left = {number: runs for number, runs in to_do.items() if runs}
    if len(set(left.values())) == 1:
        runs = next(iter(left.values()))
        return (", ".join(f"#{number}" for number in left) + f" run {runs} more time{'s' * (runs > 1)}"
                + (" each, interleaved" if len(left) > 1 else ""))
    return ", ".join(f"#{number} {runs} more run{'s' * (runs > 1)}" for number, runs in left.items()) + ", interleaved"


def outcome_words(trials) -> str:
    """"5 measured, 2 skipped (predicted not to fit), 1 oom": how the configs of a space ended."""
    ends = collections.Counter(t.user_attrs.get("status") or "running" for t in trials)
    ended = {record.OK: "measured", record.SKIPPED: "skipped (predicted not to fit)"}
    return ", ".join(f"{n} {ended.get(status, status)}" for status, n in
                     sorted(ends.items(), key=lambda kv: (kv[0] != record.OK, kv[0] != record.SKIPPED, -kv[1], kv[0])))


def eager_twin(config: dict) -> tuple:
    """The key of the same config without compile."""
    return search.key({**config, "compile": "off"})
