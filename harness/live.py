"""The sweep's live lines: one per trial with its outcome, and a spinner with the running child's phase."""
from __future__ import annotations

import time

from rich.console import Console
from rich.text import Text

from harness import failures, pareto, record, report, study as studies
from harness.record import Record, leak_words
from harness.units import size


class LiveProgress(studies.Progress):
    """One line per trial (duplicates too), plus a spinner with the child's phase and the time it has run.

    On a terminal, lines wrap at words to its width; in pipes and logs each stays whole.
    """

    def __init__(self, spec, out: Console):
        self.spec, self.out, self.status, self.running, self.text, self.headed = spec, out, None, None, "", False
        self.said: set[str] = set()  # notes said once per sweep
        self.unit = "tokens/s" if spec.objective == "tokens" else "samples/s"

    def say(self, text: str, **style) -> None:
        self.out.print(text, markup=False, highlight=False, soft_wrap=not self.out.is_terminal, **style)

    def started(self, done, total, study, running=0):
        if done:
            what = "already measured" if not running else \
                f"already measured or running ({running} running in another worker)"
            self.say(f"resuming: {done} of {total} trials {what}" if done <= total else
                     f"resuming: {done} trials {what}, more than the {total} asked for")

    def trial_started(self, number, done, total, config, baseline):
        label = (" (baseline: your current config)" if self.spec.apply else " (baseline: the spec's defaults)") \
            if baseline else ""
        self.text = f"[{done + 1}/{total}] #{number}{label} {report.describe(config)}"
        self.headed = False  # the header line is printed with the outcome, or before a note about the trial
        self.running = RunningTrial(f"trial {done + 1}/{total} (#{number}){label}: {report.describe(config)}",
                                    config.get("compile", "off") != "off")
        self.status = self.out.status(self.running)
        self.status.start()

    def trial_phase(self, heartbeat):
        if self.running:
            self.running.heartbeat = heartbeat
            phase = str((heartbeat or {}).get("phase") or "")
            # a pipe or log has no spinner: the wait for another trial's device lock is said once, as a note
            if phase.startswith("waiting for") and not self.out.is_terminal and not self.running.said_wait:
                self.running.said_wait = True
                self.note(phase)

    def stop(self):
        if self.status:
            self.status.stop()
            self.status = None

    def trial_finished(self, number, rec, best, note=None):
        self.stop()
        self.running = None
        said = outcome(rec, self.spec.objective, self.spec.memory_budget)
        self.say(f"    → {said}" if self.headed else f"{self.text}\n    → {said}")
        if (unread := unread_note(rec)) and unread not in self.said:
            self.said.add(unread)
            self.say(f"    {unread}")
        if best:
            self.say(f"    best so far: #{best['number']} {pareto.speed(best, self.spec.objective):.1f} {self.unit}, "
                     f"peak {size(Record.of(best).peak)}", style="dim")
            why = note or self.why_not_best(rec, best)
            if why:
                self.say(f"    {why}", style="dim")

    def cut_short(self):
        """The stopped trial's outcome, under its header: a header waits for its outcome, so a trial
        stopped early (a SIGTERM just after "best so far") was recorded without ever being named."""
        if self.running is not None:
            self.say("    → interrupted" if self.headed else f"{self.text}\n    → interrupted")

    def why_not_best(self, rec: dict, best: dict) -> str | None:
        """When this trial is faster than best but is not it: the choice's reason, with the numbers."""
        return pareto.why_not(rec, best, self.spec.memory_budget, self.spec.headroom, self.spec.objective)

    def duplicate(self, number, of, config):
        self.say(f"[dup] #{number} repeats #{of}, not run again (its result is reused; it does not count toward "
                 f"the trials): {report.describe(config)}", style="dim")

    def note(self, message):
        """A note while a trial runs (the machine is busy before it, ...) comes under that trial's header."""
        if self.running and not self.headed:
            self.say(self.text)
            self.headed = True
        self.say(f"    {message}" if self.running else message)


PHASES = {"start": "build", "first_step": "first step", "warmup": "warm-up", "measure": "measure", "teardown": "finish",
          "done": "finish"}


class RunningTrial:
    """The spinner's text, re-read on every refresh: elapsed time and the phase from the child's heartbeat."""

    def __init__(self, text: str, compiles: bool):
        self.text, self.compiles, self.started, self.heartbeat = text, compiles, time.monotonic(), None
        self.said_wait = False

    def phase(self) -> str:
        beat = self.heartbeat
        if not beat:
            return "starting"
        name = PHASES.get(beat.get("phase"), beat.get("phase", "?"))
        if name == "first step" and self.compiles:
            return "compile (first step)"
        return f"{name} step {beat['step']}" if beat.get("step") else name

    def __rich__(self):
        return Text(f"{time.monotonic() - self.started:.0f}s {self.phase()} · {self.text}",
                    no_wrap=True, overflow="ellipsis")


def unread_note(rec: dict) -> str | None:
    """A factory that never read some of its params (`widht: 128`): the trial measured its default instead."""
    unread = rec.get("unread_params")
    factory = (rec.get("workload") or {}).get("factory")
    if not (isinstance(unread, list) and unread and factory):
        return None
    names, them = ", ".join(map(str, unread)), "it" if len(unread) == 1 else "them"
    return (f"note: workload.params {names}: {factory} never read {them}, so the trial ran without {them}; "
            "check the spelling against what the function reads")


def outcome(rec: dict, objective: str = "samples", budget: int | None = None) -> str:
    status, typed = rec["status"], Record.of(rec)
    leaked = typed.leak
    if status in ("ok", "diverged") and rec.get("throughput"):
        t, cv = rec.get("timing") or {}, typed.step_cv
        rate = pareto.speed(rec, objective)  # the figure "best so far" compares
        rate, unit = (rate, objective) if rate else (rec["throughput"], "samples")
        line = (f"{status}: {rate:.1f} {unit}/s, peak {size(rec['peak_memory'])}, "
                f"cv {'-' if cv is None else f'{100 * cv:.1f}%'}, {t.get('trial_wall_s', 0):.0f}s")
        if t.get("compile_s"):
            line += f" (compile {t['compile_s']:.0f}s)"
        if t.get("cut_short"):
            share = {"1 warm-up step": studies.WARM_SLOW_CUT,
                     "1 long warm-up step": studies.LONG_WARM_SLOW_CUT}.get(t.get("cut_at"), studies.SLOW_CUT)
            line += f", {t.get('cut_at', '2 windows')}: under {share:.0%} of the best so far"
        if pareto.noisy(rec):
            line += f" — noisy: its windows disagree beyond {pareto.NOISY_CV:.0%} CV, not ranked"
        if rec.get("busy"):
            line += " — measured on a busy machine"
        if leaked:
            line += f" — {leak_words(leaked)}: a leak?"
        if typed.loss.get("unchecked"):
            line += " — its first loss is not held to the fp32 reference (the record's loss.unchecked says why)"
        return line + (f" — {rec['error']['message']}" if rec.get("error") else "")
    error = rec.get("error") or {}
    at = failures.users_frame(error) if status in ("error", "crash") else None  # as the sweep's stop line names it
    message = record.error_words(error, 160, at)
    if leaked:
        message = f"{leak_words(leaked)}: a leak? {message}"
    if status == "oom" and budget:  # torch's own line starts with the whole GPU's free memory, not the cap
        return f"oom under the {size(budget)} budget: {message}"
    return f"{status}: {message}"
