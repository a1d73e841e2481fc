"""The choice, computed once: feasibility under a memory budget, the Pareto front, noise-aware ties,
the best config, the baseline it is compared with, tiers, compile payback and why. Every view
(terminal, HTML, JSON/CSV, `bench apply`, the live sweep output) shows this one `Choice`; none
computes a figure of its own. The rows it is given are never changed.

Throughput is samples/s, or tokens/s for a study whose `objective` is tokens (the fair measure when
a searched knob such as seq_len changes what one sample is); a config's figure is the median of its
trial and its confirmation runs (`speed`). A row is a candidate for best when it measured (ok), its
windows agree (not `noisy`), its loss did not rise beyond chance (else it is `unsafe`:
shown, never chosen), its compile pays back within the training run (`Payback`), and its peak
leaves the requested headroom of the capacity (the budget, else the device's memory). Differences
smaller than the measured noise of two configs are ties; a tie goes to the config with more
headroom where headroom is scarce (one above 75% of the capacity), else to the faster. A leader
tied with the baseline is no reason to change the user's config: then best is the baseline, unless
another candidate beats the baseline beyond the noise of side-by-side runs (ties are not transitive).
Tiers pick the same way under stricter headroom: the guides' "safe / balanced / aggressive".
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from harness.errors import UserError
from harness.record import OK, Record
from harness.units import is_whole, size

TIERS = {"safe": 0.25, "balanced": 0.15, "aggressive": 0.05}
MIN_NOISE = 0.01  # below 1% nobody should care which config is faster
MAX_NOISE = 0.10  # a very noisy trial (a loaded machine) must not tie with one 2x faster
NOISY_CV = 0.5
"""A trial whose measured windows' step times vary more than this (coefficient of variation) is
`noisy`: its median says little (a loaded machine gave CVs of 70-108%), so it is never ranked."""
UNTELLABLE = 0.5
"""A tie band this wide (1x ± 50%) says the paired runs decide nothing, and the words say that instead."""
APART_ROUNDS = 4
"""Rounds side by side after which a config whose every run there was faster than every run of your
config's (or slower) differs beyond their ratios' spread: were the two alike, one side or the other
would take all the top places by chance 2 times in C(8, 4) = 70 over 4 rounds (1 in 10 over 3). A sweep
runs 4 only after a wide tie (Sweep.settle_wide_tie); simulated for two alike configs with 8-12% noise
per run, 4-6% of such ties then end apart, and 0.3-0.6% of all such sweeps change your config. The
quickstart kept your config over a leader that ran 164.5-180.9 against your 112.0-152.1, because your
config's own noise spread the ratios by ± 0.28."""
BUSY_NOISE = "noisy: their timed windows disagree (most often a busy machine); sweep again when it is quiet"
"""Why `bench apply best` finds no best when every trial was noisy (one line, exit 2)."""
LOSS_SLACK = 0.01
"""A config whose loss rose over its trial by more than the baseline's own rise (if it rose) plus
chance, the larger of this share and LOSS_SCATTERS of its step-to-step scatter, is `unsafe`: faster,
maybe, but not training as the user's config does."""
LOSS_SCATTERS = 3
"""Two batches' losses differ by more than 3x their median step-to-step change about 2% of the time
by chance: a rise under that says nothing in a trial of a few steps (a contrastive loss on a CPU
moves 2-6% from one batch to the next). A trial of three losses can never show such a rise."""
ASSUMED_RUN_STEPS = 10_000
"""Optimizer steps of the training run compile must pay back in, when the target config names none."""


@dataclass(frozen=True)
class Standing:
    """One trial as the choice sees it: the record and the figures every view shows for it."""

    record: Record
    speed: float | None
    """The throughput the choice is made on: the median of the trial and its confirmation runs."""
    runs: int
    """How many measured runs `speed` is the median of (1 = not confirmed)."""
    noise: float
    """Relative noise of `speed`, within [MIN_NOISE, MAX_NOISE] (see `noise`)."""
    cv: float | None = None
    """The coefficient of variation behind `speed` (see `spread`): what `± cv` shows beside it."""
    noisy: bool = False
    """Its windows disagree beyond NOISY_CV: shown, never ranked."""
    unsafe: str | None = None
    """Why its loss rose beyond chance (`worse_loss`); such a config is never best."""
    pareto: bool = False
    """On the front of the ranked rows (no other is both faster and lighter)."""
    best: bool = False
    tier: str | None = None

    @property
    def number(self) -> int:
        return self.record.number

    @property
    def status(self) -> str:
        """The status every view shows: the record's, or `noisy` for a run too noisy to rank."""
        return "noisy" if self.noisy else self.record.status

    @property
    def config(self) -> dict:
        return self.record.config

    @property
    def runs_words(self) -> str:
        """What `speed` is: "median of 3 runs", or "one run" (not "median of 1 run")."""
        return f"median of {self.runs} runs" if self.runs > 1 else "one run"

    @property
    def peak(self) -> int | None:
        return self.record.peak

    @property
    def confirmed(self) -> bool:
        return self.runs > 2

    @property
    def measured(self) -> bool:
        """Ran to the end (ok) with a throughput: something to compare with. A diverged trial's
        throughput trained nothing."""
        return self.record.measured and bool(self.speed)

    @property
    def caveat(self) -> str | None:
        """Why its figure is not one to act on, where it is not (a trial named by number may be any)."""
        if self.noisy:
            return f"its windows disagree ({self.record.step_cv:.0%} CV): noisy, not ranked, not a measurement to act on"
        if self.unsafe:
            return f"never chosen as best: {self.unsafe}"
        if self.record.unsearched:
            return f"never chosen as best: {unsearched_words(self)}"
        if self.record.one_timing and not self.confirmed:
            return "its figure is one warm-up step's (cut there as far slower than the best so far), not a timed measurement"
        return None


@dataclass(frozen=True)
class Versus:
    """A config against the baseline: the ratio of their speeds, the spread of the ratios of the runs
    made side by side (None without two confirmation rounds of both), and whether it is within the noise."""

    ratio: float
    spread: float | None
    paired: int
    """Confirmation rounds both ran (side by side): what the spread is over. Not each trial's own run,
    made minutes apart and perhaps on a busier machine."""
    tie: bool
    bound: float
    """How far from 1x the ratio must be to count: twice the spread, or either config's own noise."""
    apart: tuple[float, float] | None = None
    """Over APART_ROUNDS or more rounds side by side, every run of one was faster than every run of the
    other (its slowest and your fastest there, or its fastest and your slowest): then the spread of the
    ratios is no band, and only either config's own noise makes a tie."""

    @property
    def paired_band(self) -> bool:
        """The tie band is twice the paired runs' spread, not either config's own noise."""
        return self.spread is not None and self.bound == 2 * self.spread

    @property
    def untellable(self) -> bool:
        """A tie whose band is the paired runs' spread at ±50% or more: they decide nothing, so no
        "4.87× ± 5.46" is printed as if it were a figure with an error bar."""
        return self.tie and self.paired_band and self.bound >= UNTELLABLE

    @property
    def shows_spread(self) -> bool:
        return self.spread is not None and not self.untellable

    def figure(self) -> str:
        """"1.29× ± 0.21" for a chart or a stat; the ratio alone where there is no spread to read; "?×"
        where the rounds disagree too much for any ratio (4.04 and 26.4 made a "15.21×" headline)."""
        if self.untellable:
            return "?×"
        return f"{self.ratio:.2f}×" + (f" ± {self.spread:.2f}" if self.shows_spread else "")

    def text(self, unit: str) -> str:
        if self.untellable:
            head = f"?× the {unit} ({self.side_by_side_words()})"
        elif not self.shows_spread:
            head = f"{self.ratio:.2f}× the {unit} ({self.side_by_side_words()})"
        else:  # the spread is of the ratio, so it has no unit: "± 0.13 samples/s" misread it
            head = f"{self.ratio:.2f}× the {unit}, ± {self.spread:.2f} over {self.side_by_side_words()}"
        return f"{head} — {self.verdict()}"

    def verdict(self) -> str:
        """"a tie: within the noise (...)" or "beyond the noise[: why]": the words every view gives."""
        if self.tie:
            return f"a tie: {self.noise_words()}"
        apart = self.apart_words()
        return "beyond the noise" + (f": {apart}" if apart else "")

    def apart_words(self) -> str | None:
        """Why a ratio inside twice the paired runs' spread is no tie (None where it is not inside it)."""
        if self.tie or self.apart is None or 2 * (self.spread or 0.0) < abs(self.ratio - 1):
            return None
        mine, yours = self.apart
        if mine > yours:
            return f"its slowest run side by side ({mine:.1f}) beat your config's fastest ({yours:.1f})"
        return f"its fastest run side by side ({mine:.1f}) lost to your config's slowest ({yours:.1f})"

    def side_by_side_words(self) -> str:
        if self.paired == 0:
            return "not confirmed side by side"
        if self.paired == 1:
            return "one run each side by side, too few for a spread"
        return f"{self.paired} runs each side by side"

    def noise_words(self) -> str:
        """The band the ratio fell inside, and where it comes from (a spread of ±0.15 alone reads as a win at 1.29x)."""
        if self.untellable:  # "1× ± 20.56" is no band anyone can read
            return (f"runs side by side disagree too much to tell (their ratios spread ± {self.spread:.2f}); "
                    "more rounds side by side, with the machine kept quiet, would tell")
        source = "twice the spread of the paired runs" if self.paired_band else "the runs' own noise"
        return f"within the noise (1× ± {self.bound:.2f}, {source})"


@dataclass(frozen=True)
class Payback:
    """A compiled config against its eager twin (same knobs, compile off), or the fastest eager config
    that fits where no twin was measured."""

    trial: int
    eager: int
    compile_s: float
    saved_s_per_step: float
    break_even_steps: float | None
    """Steps after which the compile time is paid back; None when it is not faster beyond the noise."""
    pays: bool
    """Paid back within the training run the choice was told of (Choice.run_steps)."""


@dataclass(frozen=True)
class Choice:
    objective: str
    rows: tuple[Standing, ...]
    """Every trial, by number."""
    best: Standing | None
    """What the measurements justify: the leader; where the leader ties with the baseline, a candidate
    that surely beats the baseline, else the baseline."""
    leader: Standing | None
    """The fastest candidate (ties within the noise broken by pick's rule)."""
    baseline: Standing | None
    versus: Versus | None
    """The leader against the baseline (None without a measured, steady baseline, or when it is the baseline)."""
    capacity: float | None
    capacity_label: str
    """"budget" or "device memory"."""
    headroom: float
    tiers: dict[str, Standing | None] = field(default_factory=dict)
    front: tuple[Standing, ...] = ()
    unsafe_fastest: Standing | None = None
    """The fastest config faster than best whose loss rose beyond chance."""
    unsearched_fastest: Standing | None = None
    """The fastest config faster than best with a value the last sweep did not search (Record.unsearched)."""
    passed_over: Standing | None = None
    """The fastest candidate measured faster than the leader yet not chosen: within the noise of it
    where memory is scarce (the lighter wins), or one run against the leader's confirmed runs."""
    unsure: Standing | None = None
    """Where a leader tied with your config and yours stays: the fastest other candidate faster than
    yours, which is no win beyond the noise of rounds run side by side with yours (Choice.kept)."""
    paybacks: tuple[Payback, ...] = ()
    run_steps: int = ASSUMED_RUN_STEPS
    run_source: str = ""
    """Where run_steps came from (the target's max_steps, epochs x steps, or the assumption)."""
    why: tuple[str, ...] = ()
    candidates: tuple[int, ...] = ()
    """Trials best is chosen from: measured, steady, no worse a loss than the baseline's, a compile that
    pays back, within the headroom. The sweep's confirmation race runs among these."""
    model: dict | None = None
    """The search's model as the sweep kept it (harness.planner): why best is best, and predictions for
    configs never measured. Predictions, never measurements."""
    applies: bool = True
    """False where the study's spec has no `apply:` section: no config file was read for the baseline
    (it is the spec's defaults) and none can be written, so no view offers `bench apply`."""

    @property
    def unit(self) -> str:
        return f"{self.objective}/s"

    @property
    def kept(self) -> bool:
        """The leader ties with the baseline: the user's config stays."""
        return self.best is not None and self.leader is not None and self.best is not self.leader \
            and self.best is self.baseline

    @property
    def wide_tie(self) -> bool:
        """Your config kept over a leader measured more than MAX_NOISE faster: a tie only because their
        rounds side by side disagree (a noisy machine), not because the two run alike."""
        v = self.versus
        return self.kept and v is not None and v.paired_band and v.ratio - 1 > MAX_NOISE

    @property
    def sure_over_tie(self) -> bool:
        """The leader ties with the baseline, and best is another config that beats it beyond the noise."""
        return self.best is not None and self.leader is not None and self.best is not self.leader \
            and self.best is not self.baseline and self.versus is not None and self.versus.tie

    def set_aside_for(self, chosen: Standing | None, headroom: float) -> str | None:
        """Why `chosen` (best, or a tier's pick under its `headroom`) is slower than your config: yours ran
        faster, steadily, but leaves less than that headroom. None where that is not so."""
        b = self.baseline
        if (b is None or chosen is None or chosen is b or not b.measured or b.noisy
                or self.fits(b, headroom) is not False or b.speed <= chosen.speed):
            return None
        return (f"your config (trial {b.number}) is faster ({b.speed:.1f} {self.unit}) but peaks at {size(b.peak)} "
                f"and leaves less than the {headroom:.0%} headroom of the {size(self.capacity)} {self.capacity_label}: "
                f"trial {chosen.number} is the fastest config that leaves it")

    def fits(self, s: Standing, headroom: float | None = None) -> bool | None:
        """`s`'s peak leaves `headroom` (else the study's) of the capacity; None where either is unknown."""
        h = self.headroom if headroom is None else headroom
        return None if not self.capacity or s.peak is None else s.peak <= self.capacity * (1 - h)

    def standing(self, number: int) -> Standing | None:
        return next((s for s in self.rows if s.number == number), None)

    def against_baseline(self, row: Standing) -> Versus | None:
        """`row` against the user's config, as the report states it; None for the baseline itself, and
        where either is noisy: its windows disagree too much for any ratio (or "tie: false") to mean anything."""
        if self.baseline is None or not self.baseline.measured or row.record.baseline or row.noisy or self.baseline.noisy:
            return None
        return versus(row.record, self.baseline.record, self.objective)

    def no_ratio(self, row: Standing) -> str | None:
        """Why `against_baseline` gives `row` no ratio ("no ratio: trial 1 ran too noisy to compare (154%
        CV)"), for apply's header; None where it gives one, and for your config itself."""
        base = self.baseline
        if base is None or row.record.baseline or self.against_baseline(row) is not None:
            return None
        if not base.measured:
            return f"no ratio: your config ended {base.record.status}"
        noisy = row if row.noisy else base if base.noisy else None
        if noisy is None:
            return None
        who = "your config" if noisy is base else f"trial {noisy.number}"
        return f"no ratio: {who} ran too noisy to compare ({noisy.record.step_cv:.0%} CV)"

    def under(self, budget: int) -> "Choice":
        """The same choice made for a card of `budget` bytes (`bench apply --budget`): the same rules
        (steady, no worse a loss, a compile that pays back, a tie keeps your config), another capacity."""
        return choose([s.record for s in self.rows], budget, self.headroom, self.objective, self.run_steps, self.run_source)

    def row_for(self, which: str, budget: int | None = None, study: str = "the study") -> Standing:
        """The row `bench apply WHICH [--budget SIZE]` writes: best or a tier (of the choice made again for
        a card of `budget` bytes, where given), or a trial number. A WHICH that names nothing measured is
        the user's error."""
        if is_whole(which):
            if budget:
                raise UserError(f"trial {which} and --budget {size(budget)}: a trial number names the config "
                                "itself; drop --budget, or say best or a tier to choose under it")
            return self.trial_row(which, study)
        if which != "best" and which not in TIERS:
            raise UserError(f"{which!r}: say best, safe, balanced, aggressive or a trial number")
        # over it by more than its printed rounding: "say at most 79.21 GiB" must accept 79.21GiB
        if budget and self.capacity and budget > self.capacity and size(budget) != size(self.capacity):
            swept = (f"the {size(self.capacity)} budget the study was swept under" if self.capacity_label == "budget"
                     else f"the {size(self.capacity)} of device memory the trials ran on")
            raise UserError(f"--budget {size(budget)}: more than {swept}, so configs that ran out of memory there were "
                            f"never measured above it; say at most {size(self.capacity)}, or sweep a new study with "
                            f"--memory-budget SIZE")
        choice = self.under(budget) if budget else self
        row = choice.best if which == "best" else choice.tiers[which]
        if row is None and budget:
            room = self.headroom if which == "best" else TIERS[which]
            whose = "the spec keeps" if which == "best" else f"the {which} tier keeps"
            raise UserError(f"--budget {size(budget)}: no measured config fits under it with the {room:.0%} headroom "
                            f"{whose}; give a larger --budget, or sweep smaller batch sizes")
        if row is None:
            noisy_rows = [s for s in self.rows if s.noisy]
            why = (f" (trial{'s' if len(noisy_rows) > 1 else ''} {', '.join(f'#{s.number}' for s in noisy_rows)} "
                   f"{BUSY_NOISE})" if noisy_rows else "")
            raise UserError(f"{which}: no measured config qualifies in study {study}{why}; see `bench report`")
        return self.standing(row.number)

    def trial_row(self, which: str, study: str) -> Standing:
        row = self.standing(int(which))
        if row is None:
            raise UserError(f"trial {which}: not in study {study}; `bench report` lists the trials")
        if row.record.status != OK or not row.speed:
            raise UserError(f"trial {which} ended {row.record.status}, not a feasible measurement; pick an ok trial")
        return row


# ---- the figures of one row ----------------------------------------------------------------------

def speed(row, objective: str = "samples") -> float | None:
    """The throughput a study optimizes: samples/s, or tokens/s; the median over the trial and its
    confirmation runs where it was confirmed."""
    runs = Record.of(row).runs(objective)
    return statistics.median(runs) if len(runs) > 2 else (runs[0] if runs else None)


def figure_runs(row, objective: str = "samples") -> int:
    """How many runs `speed` is the median of: every ok run once confirmed (three or more), else the
    trial's own (one confirmation run that failed leaves two, and a median of two would be its mean)."""
    runs = len(Record.of(row).runs(objective))
    return runs if runs > 2 else min(runs, 1)


def single(row, objective: str) -> float | None:
    """The trial's own run's throughput (not its confirmation runs)."""
    return Record.of(row).rate(objective)


def runs_of(row, objective: str = "samples") -> list[float]:
    """Every measured throughput of a config: its trial, then its confirmation runs."""
    return Record.of(row).runs(objective)


def spread(row, objective: str = "samples") -> float | None:
    """The coefficient of variation behind a row's speed: across its runs once confirmed (the speed is
    their median), else its timed windows' step times; None for one warm-up step's figure."""
    rec = Record.of(row)
    runs = rec.runs(objective)
    if len(runs) > 2:
        return statistics.stdev(runs) / statistics.mean(runs)
    return rec.step_cv


def noise(row, objective: str = "samples") -> float:
    """Relative noise of a row's throughput: twice its `spread`, within [MIN_NOISE, MAX_NOISE]; one
    warm-up step's figure, the most."""
    rec = Record.of(row)
    cv = spread(rec, objective)
    cv = MAX_NOISE if cv is None and rec.one_timing else cv or 0.0
    return min(max(2 * cv, MIN_NOISE), MAX_NOISE)


def noisy(row) -> bool:
    """Its measured windows disagree beyond NOISY_CV and no confirmation runs replaced them: not a
    measurement to rank. Once confirmed, its figure is the median of three runs in fresh processes,
    whose spread is its noise."""
    cv = Record.of(row).step_cv
    return cv is not None and cv > NOISY_CV and not confirmed(row)


def confirmed(row) -> bool:
    return len(runs_of(row)) > 2


def confirming(row) -> bool:
    """Its confirmation is under way (or was cut short by a kill): runs made, none failed, too few yet.
    A B B A gives your config its third run while the leader's last is still running."""
    repeats = Record.of(row).repeats
    return bool(repeats) and not confirmed(row) and all(r.status == OK for r in repeats)


def failed_run(row) -> tuple[int, str] | None:
    """(1-based place, status) of its first confirmation run that did not measure, or None."""
    return next(((k + 1, r.status) for k, r in enumerate(Record.of(row).repeats) if r.status != OK), None)


def loss_rise(row) -> float | None:
    """How much the loss rose over the trial, as a share of its first value (negative: it fell); None
    where either loss is missing or not finite (a NaN rise would make every comparison with it false)."""
    loss = Record.of(row).loss
    first, last = loss.get("first"), loss.get("last")
    if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in (first, last)) or not first:
        return None
    return (last - first) / abs(first)


def worse_loss(row, base) -> str | None:
    """Why `row` is unsafe, or None: its loss rose over the trial by more than the baseline's own rise
    plus chance (LOSS_SLACK, LOSS_SCATTERS x its scatter). Not against the baseline's fall: a trial at
    another batch size sees other batches for another number of steps, and a loss with in-batch
    negatives sits higher at a larger batch."""
    mine = loss_rise(row)
    if mine is None or mine <= 0:
        return None
    loss = Record.of(row).loss
    scatter = loss.get("scatter")
    chance = max(LOSS_SLACK, LOSS_SCATTERS * (scatter or 0.0) / abs(loss["first"]))
    theirs = max(loss_rise(base) or 0.0, 0.0) if base is not None else 0.0
    if mine <= theirs + chance:
        return None
    by = (f"{LOSS_SCATTERS}x its step-to-step scatter, at least {LOSS_SLACK:.0%}" if scatter is not None
          else "no step-to-step scatter recorded")
    over = f" over the baseline's own rise of {theirs:+.1%}" if theirs > 0 else ""
    return f"its loss rose {loss['first']:.4g} → {loss['last']:.4g} ({mine:+.1%}), beyond chance ({chance:.1%}: {by}){over}"


# ---- rules over several rows (also the sweep's: harness.study) -----------------------------------

def capacity(rows, budget: int | None) -> float | None:
    """Memory the configs must fit in: the budget, or the smallest device total the trials measured
    where there is none or it is larger (then the device is the limit, as the sweep warned)."""
    totals = [t for t in (Record.of(r).memory.get("device_total") for r in rows) if t]
    limits = [float(x) for x in ([budget] if budget else []) + ([min(totals)] if totals else [])]
    return min(limits) if limits else None


def measured(rows, objective: str = "samples") -> list:
    """The rows (as given) that measured a throughput and a peak, windows in agreement."""
    return [r for r in rows if Record.of(r).measured and speed(r, objective) and not noisy(r)]


def pareto_front(rows, objective: str = "samples") -> list:
    """Rows no other row beats on both throughput (higher) and peak memory (lower), by peak."""
    def peak(r):
        return Record.of(r).peak
    front = [r for r in rows
             if not any(speed(o, objective) >= speed(r, objective) and peak(o) <= peak(r)
                        and (speed(o, objective) > speed(r, objective) or peak(o) < peak(r)) for o in rows)]
    return sorted(front, key=peak)


def pick(candidates: list, objective: str = "samples", capacity: float | None = None):
    """Fastest candidate; among those tied with it within noise, the one using least memory, unless
    every tied one leaves the safe tier's headroom of `capacity` free: then memory is not scarce, and
    the faster median wins (0.23 against 0.28 GiB of a 24 GiB budget is no reason to give up 10%)."""
    if any(confirmed(r) for r in candidates):  # once leaders were re-measured, best is decided on the repeats
        candidates = [r for r in candidates if confirmed(r) or confirming(r)]
    return prefer(candidates, objective, capacity)


def prefer(candidates: list, objective: str = "samples", capacity: float | None = None):
    """pick's rule on the figures as they stand, confirmed or not."""
    if not candidates:
        return None
    top = max(candidates, key=lambda r: speed(r, objective))
    tied = [r for r in candidates if not faster(top, r, objective)]
    if roomy(tied, capacity):
        return top
    return min(tied, key=lambda r: (Record.of(r).peak, -speed(r, objective)))


def roomy(rows, capacity: float | None) -> bool:
    """Every row leaves the safe tier's headroom of `capacity` free: memory is no reason to choose."""
    return bool(capacity) and all(Record.of(r).peak <= capacity * (1 - TIERS["safe"]) for r in rows)


def faster(a, b, objective: str = "samples") -> bool:
    """Is `a` faster than `b` by more than the noise of either?"""
    sa, sb = speed(a, objective), speed(b, objective)
    return sa is not None and sb is not None and sa - sb > max(noise(a, objective), noise(b, objective)) * sa


def paired_runs(best, base, objective: str = "samples") -> list[tuple[float, float]]:
    """The two configs' figures in each confirmation round both ran: round 0, each trial's own run, was
    made at another time (82 against 66 on a busy machine, then 317 and 318 against 80 side by side,
    once spread the ratios by ±1.6 and called 3.96x a tie). A round is run again whole where one of its
    runs is (Sweep.confirm_runs, Sweep.remeasure_what_ran_busy)."""
    a, b = Record.of(best).by_round(objective), Record.of(base).by_round(objective)
    return [(a[k], b[k]) for k in a if a[k] and b.get(k)]  # a round where either run failed pairs nothing


def side_by_side(best, base, objective: str = "samples") -> list[float]:
    """The ratios of the confirmation rounds both ran."""
    return [mine / theirs for mine, theirs in paired_runs(best, base, objective)]


def apart(row, base, objective: str = "samples") -> tuple[float, float] | None:
    """Over APART_ROUNDS or more rounds both ran side by side: (row's slowest, base's fastest) where every
    run of `row` there was faster than every run of `base`, (row's fastest, base's slowest) where every
    one was slower, else None."""
    pairs = paired_runs(row, base, objective)
    if len(pairs) < APART_ROUNDS:
        return None
    mine, theirs = [m for m, _ in pairs], [t for _, t in pairs]
    if min(mine) > max(theirs):
        return min(mine), max(theirs)
    return (max(mine), min(theirs)) if max(mine) < min(theirs) else None


def round_spread(ratios: list[float]) -> float | None:
    """The spread of the ratios of rounds run side by side: their standard deviation over two rounds;
    over more, the median absolute deviation scaled to one (x1.4826), so that one disturbed round of
    four (a ratio of 1.59 among 1.08-1.12 on a noisy host) does not widen the band for the other three,
    as the median of the runs already outvotes it in the figure."""
    if len(ratios) < 2:
        return None
    if len(ratios) == 2:
        return statistics.stdev(ratios)
    middle = statistics.median(ratios)
    return 1.4826 * statistics.median(abs(r - middle) for r in ratios)


def middle_ratio(ratios: list[float]) -> float:
    """The median of ratios taken in logs, so a over b is 1 / (b over a): of two rounds at 1.8x and 25.8x
    the plain median, their mean, read 13.8x one way and 0.236x (1 / 4.2) the other."""
    return math.exp(statistics.median(math.log(r) for r in ratios))


def versus(row, base, objective: str = "samples") -> Versus | None:
    """`row` against the baseline, or None where either has no speed; a tie when the ratio is within
    twice the spread of the side-by-side ratios or within either config's noise. With two or more
    rounds side by side the ratio is theirs (their median, in logs), so the figure and its band come from the
    same runs: the medians' ratio took in each trial's own run, made apart (2.28× ± 0.00 printed
    where the paired rounds said 2.231 and 2.232)."""
    mine, theirs = speed(row, objective), speed(base, objective)
    if not mine or not theirs:
        return None
    ratios = side_by_side(row, base, objective)
    spread = round_spread(ratios)
    ratio = middle_ratio(ratios) if spread is not None else mine / theirs
    separate = apart(row, base, objective)
    band = 2 * spread if spread is not None and separate is None else 0.0
    bound = max(band, noise(row, objective), noise(base, objective))
    return Versus(ratio=ratio, spread=spread, paired=len(ratios), tie=abs(ratio - 1) <= bound, bound=bound,
                  apart=separate)


def paybacks(rows, objective: str = "samples", run_steps: int = ASSUMED_RUN_STEPS, fits=lambda r: True) -> list[Payback]:
    """For each measured compiled config: its compile cost and break-even against its eager twin (same
    knobs, compile off) or, where no twin was measured, the fastest eager config that fits: what the
    user would run without compile. Time saved per step is the compiled step's samples at the two speeds."""
    recs = [Record.of(r) for r in rows if Record.of(r).measured]
    eager = {_without_compile(r.config): r for r in recs if r.config.get("compile", "off") == "off"}
    fastest = max((r for r in eager.values() if fits(r)), key=lambda r: speed(r, objective) or 0.0, default=None)
    out = []
    for r in recs:
        if r.config.get("compile", "off") == "off":
            continue
        alt = eager.get(_without_compile(r.config)) or fastest
        step = (r.timing.get("step_s") or {}).get("median")
        if alt is None or not step or r.timing.get("compile_s") is None or not speed(alt, objective):
            continue
        # samples (or tokens) one compiled step trains: its own run's rate is that over its own step time
        # (record: batch x accumulation x nproc / step_s median); its confirmed median is another run's speed
        per_step = step * r.rate(objective)
        saved = per_step * (1 / speed(alt, objective) - 1 / speed(r, objective))
        cost = r.timing["compile_s"] - (alt.timing.get("first_step_s") or 0.0)
        even = max(cost, 0.0) / saved if saved > 0 and faster(r, alt, objective) else None
        out.append(Payback(trial=r.number, eager=alt.number, compile_s=r.timing["compile_s"],
                           saved_s_per_step=saved, break_even_steps=even,
                           pays=even is not None and even <= run_steps))
    return out


def _without_compile(config: dict) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in config.items() if k != "compile"))


# ---- the choice ----------------------------------------------------------------------------------

def choose(rows, budget: int | None, headroom: float, objective: str = "samples",
           run_steps: int | None = None, run_source: str | None = None) -> Choice:
    """The choice over `rows` (records as stored, or Records); `run_steps`: the optimizer steps of the
    training run the apply target describes (None: ASSUMED_RUN_STEPS, said so in run_source)."""
    recs = sorted((Record.of(r) for r in rows), key=lambda r: (r.number is None, r.number or 0))
    cap = capacity(recs, budget)
    steps = run_steps or ASSUMED_RUN_STEPS
    source = run_source or (f"{steps:,} steps, the target's" if run_steps else
                            f"an assumed run of {ASSUMED_RUN_STEPS:,} steps (the target config names no max_steps)")
    base = next((r for r in recs if r.baseline), None)
    ok = [r for r in recs if r.measured and speed(r, objective)]
    steady = [r for r in ok if not noisy(r)]
    unsafe = {r.number: worse_loss(r, base) for r in steady if r is not base}
    safe = [r for r in steady if not unsafe.get(r.number)]
    searched = [r for r in safe if not r.unsearched]  # a value taken out of the search is not written back

    def fits(r, h):
        return not cap or r.peak <= cap * (1 - h)
    pays = paybacks(safe, objective, steps, fits=lambda r: fits(r, headroom))
    unpaid = {p.trial for p in pays if not p.pays}
    twins = {p.trial for p in pays}
    # where no eager config fits, compile is what makes training fit: nothing to pay back against
    eager_fits = any(r.config.get("compile", "off") == "off" and fits(r, headroom) for r in searched)
    usable = [r for r in searched if r.config.get("compile", "off") == "off" or r.number not in unpaid
              and (r.number in twins or not eager_fits)]
    # From every fitting row, not the front alone: a confirmed median can fall below an unconfirmed
    # single run that then "dominates" it, and best must still be decided on the confirmed runs.
    leader = pick([r for r in usable if fits(r, headroom)], objective, cap)
    base_ok = base if base is not None and base in steady else None

    def kept(row, h):
        """A pick tied with the user's config (which fits as well) keeps the user's config, unless another
        config beats it beyond the noise of runs made side by side: ties are not transitive, and a
        confirmed 1.24x must not be lost to a 1.34x whose runs spread too wide to count."""
        tie = row is not None and base_ok is not None and row is not base_ok and fits(base_ok, h) \
            and versus(row, base_ok, objective).tie
        if not tie:
            return row
        return pick([r for r in usable if fits(r, h) and sure_win(r)], objective, cap) or base_ok

    def sure_win(row) -> bool:
        v = versus(row, base_ok, objective) if row is not base_ok else None
        return v is not None and v.spread is not None and not v.tie and v.ratio > 1
    tiers = {name: kept(pick([r for r in usable if fits(r, h)], objective, cap), h) for name, h in TIERS.items()}
    # a noisy baseline's windows disagree too much for any ratio to it to mean anything (the story says so)
    against = versus(leader, base, objective) if leader is not None and base_ok is not None and leader is not base else None
    best = kept(leader, headroom)
    front = {r.number for r in pareto_front(searched, objective)}

    standings = {r.number: Standing(record=r, speed=speed(r, objective), runs=figure_runs(r, objective),
                                    noise=noise(r, objective), cv=spread(r, objective), noisy=r in ok and noisy(r),
                                    unsafe=unsafe.get(r.number), pareto=r.number in front,
                                    best=best is not None and r.number == best.number,
                                    tier=next((n for n, t in tiers.items() if t is r), None))
                 for r in recs}
    at = standings.get

    def fastest_over_best(rows):
        """The fastest of `rows` that fits and beats best beyond the noise: a faster config shown as not chosen."""
        over = [r for r in rows if fits(r, headroom) and (best is None or faster(r, best, objective))]
        return max(over, key=lambda r: speed(r, objective), default=None)
    fastest_unsafe = fastest_over_best([r for r in steady if unsafe.get(r.number)])
    unsearched_fastest = fastest_over_best([r for r in safe if r.unsearched])
    outran = [r for r in usable if fits(r, headroom) and leader is not None and r is not best
              and speed(r, objective) > speed(leader, objective)]
    passed_over = max(outran, key=lambda r: speed(r, objective), default=None)
    unsure = max((r for r in usable if fits(r, headroom) and best is base_ok and leader is not best
                  and r is not leader and r is not best and speed(r, objective) > speed(best, objective)),
                 key=lambda r: speed(r, objective), default=None) if best is not None else None
    choice = Choice(objective=objective, rows=tuple(standings.values()),
                    best=at(best.number) if best else None, leader=at(leader.number) if leader else None,
                    baseline=at(base.number) if base else None, versus=against, capacity=cap,
                    capacity_label="budget" if budget and cap == budget else "device memory", headroom=headroom,
                    tiers={n: at(t.number) if t else None for n, t in tiers.items()},
                    front=tuple(sorted((standings[n] for n in front), key=lambda s: s.peak)),
                    unsafe_fastest=at(fastest_unsafe.number) if fastest_unsafe else None,
                    unsearched_fastest=at(unsearched_fastest.number) if unsearched_fastest else None,
                    passed_over=at(passed_over.number) if passed_over else None,
                    unsure=at(unsure.number) if unsure else None,
                    paybacks=tuple(pays), run_steps=steps, run_source=source,
                    candidates=tuple(r.number for r in usable if fits(r, headroom)))
    return _with_why(choice, unpaid)


def unsearched_words(s: Standing) -> str:
    """"compile=default is not in the search as last swept" (taken out of the spec since it was measured)."""
    values = s.record.unsearched
    return f"{', '.join(values)} {'is' if len(values) == 1 else 'are'} not in the search as last swept"


def _not_kept_because(choice: Choice) -> str:
    """Why a tie does not keep the user's config: it leaves less than the headroom (a noisy one is compared
    with nothing, so never ties)."""
    base = choice.baseline
    return (f"peaks at {size(base.peak)} and leaves less than the {choice.headroom:.0%} headroom of the "
            f"{size(choice.capacity)} {choice.capacity_label}")


def unsure_words(choice: Choice) -> str:
    """Why a config faster than your kept config is not best (Choice.unsure): over a leader that ties with
    yours, only a sure win (two or more rounds side by side, beyond their noise) replaces your config."""
    s, base, unit = choice.unsure, choice.baseline, choice.unit
    v = versus(s.record, base.record, choice.objective)
    runs = f"median of {s.runs} runs" if confirmed(s.record) else "its trial's run"
    rule = (f"but is not chosen: the leader, trial {choice.leader.number}, ties with your config, and only a win "
            "beyond the noise of two or more rounds run side by side with your config replaces it")
    if v.spread is not None:  # the ratio is the rounds' own, not the medians' (Versus)
        return (f"trial {s.number} measured {v.ratio:.2f}× your config's speed over {v.paired} rounds run side by "
                f"side ({s.speed:.1f} {unit}, {runs}) {rule}; its {v.paired} are within their noise")
    rounds = "none" if v.paired == 0 else "one"
    return (f"trial {s.number} measured {v.ratio:.2f}× your config's speed ({s.speed:.1f} {unit}, {runs}, against "
            f"your config's {base.speed:.1f}) {rule}; trial {s.number} has {rounds}")


def passed_over_words(choice: Choice) -> str:
    """Why a config measured faster than the leader is not chosen, by pick's rule: a single run the
    leader's confirmed runs outrank, or a tie lost on memory (the confirmation race leaves a single run
    unconfirmed where, as it stands, it would lose that tie anyway)."""
    s, lead, unit, cap = choice.passed_over, choice.leader, choice.unit, choice.capacity
    runs = f"median of {s.runs} runs" if confirmed(s.record) else "its trial's run"
    head = (f"trial {s.number} measured {s.speed / lead.speed - 1:.1%} faster than trial {lead.number} "
            f"({s.speed:.1f} {unit}, {runs}) but is not chosen: ")
    outranked = confirmed(lead.record) and not confirmed(s.record)
    if outranked and prefer([lead.record, s.record], choice.objective, cap) is s.record:
        failed = failed_run(s.record)
        if failed:
            return head + (f"its confirmation run {failed[0]} ended {failed[1]}, so it did not confirm (best is "
                           f"decided on configs whose every run measured; see logs/trial-{s.number:04d}-confirm-*.log)")
        return head + f"trial {lead.number} was confirmed by repeated runs and it was not (best is decided on confirmed runs)"
    tie = f"it ties with trial {lead.number} within the noise (±{max(s.noise, lead.noise):.0%}), and "
    if not cap:
        return head + tie + "with no memory capacity known a tie goes to the lighter"
    return head + tie + (f"where a tied config peaks over {1 - TIERS['safe']:.0%} of the {cap / 2**20:,.0f} MiB "
                         f"{choice.capacity_label} a tie goes to the lighter")


def unpaid_words(choice: Choice, p: Payback) -> str:
    """Why a compiled config is not chosen: its compile does not pay back within the run (never, where it is no faster)."""
    after = (f"pays back only after {p.break_even_steps:,.0f} steps; the run is {choice.run_source}"
             if p.break_even_steps is not None else "is not faster than eager beyond the noise")
    return f"trial {p.trial} (compile) {after}: not chosen"


def ruled_out(choice: Choice, number: int | None) -> str | None:
    """Why trial `number`, measured faster than best, is no candidate at all: its loss rose beyond chance, a
    value the spec no longer searches, or a compile that does not pay back within the run; in the words the
    report's `why` gives (the live line quotes them, whether or not it is the fastest such trial). None
    where it is none of these, is best, or is not faster."""
    s, best = choice.standing(number) if number is not None else None, choice.best
    if s is None or best is None or s is best or s.record.status != OK or s.noisy or not s.speed \
            or s.speed <= best.speed:
        return None
    if s.unsafe:
        return f"trial {s.number} is faster ({s.speed:.1f} {choice.unit}) but not chosen: {s.unsafe}"
    if s.record.unsearched:
        return f"trial {s.number} is faster ({s.speed:.1f} {choice.unit}) but not chosen: {unsearched_words(s)}"
    unpaid = next((p for p in choice.paybacks if p.trial == s.number and not p.pays), None)
    return unpaid_words(choice, unpaid) if unpaid is not None and s.number not in choice.candidates else None


def _with_why(choice: Choice, unpaid: set) -> Choice:
    """The reasons behind the choice, in words every view shows alike."""
    unit, why = choice.unit, []
    if choice.kept:
        why.append(f"trial {choice.leader.number} is {choice.versus.text(unit)}: your config stays; "
                   "`bench apply best` keeps its values")
    elif choice.sure_over_tie:
        sure = choice.against_baseline(choice.best)
        why.append(f"trial {choice.leader.number} leads but ties with your config within the noise; trial "
                   f"{choice.best.number} is {sure.text(unit)}: trial {choice.best.number} is best")
    elif choice.versus is not None and choice.versus.tie and choice.best is not None:
        why.append(f"trial {choice.best.number} ties with your config within the noise, but your config "
                   f"{_not_kept_because(choice)}: trial {choice.best.number} is best")
    elif set_aside := choice.set_aside_for(choice.best, choice.headroom):
        why.append(set_aside)
    if choice.unsafe_fastest:
        s = choice.unsafe_fastest
        why.append(f"trial {s.number} is faster ({s.speed:.1f} {unit}) but not chosen: {s.unsafe}")
    if choice.unsearched_fastest:
        s = choice.unsearched_fastest
        said = f"is faster ({s.speed:.1f} {unit}) but" if choice.best else f"({s.speed:.1f} {unit}) is"
        why.append(f"trial {s.number} {said} not chosen: {unsearched_words(s)}")
    if choice.passed_over:
        why.append(passed_over_words(choice))
    if choice.unsure:
        why.append(unsure_words(choice))
    for p in choice.paybacks:
        if p.trial in unpaid:
            why.append(unpaid_words(choice, p))
    # not a candidate, for want of a payback: one that is (where no eager config fits, compiling is what
    # makes training fit) lost on speed alone
    untwinned = [s.number for s in choice.rows if s.record.measured and not s.noisy and not s.unsafe
                 and not s.record.unsearched and not s.best
                 and s.number not in choice.candidates
                 and s.config.get("compile", "off") != "off" and all(p.trial != s.number for p in choice.paybacks)]
    if untwinned:
        why.append("compiled, but its compile or step time was not recorded, so whether the compile "
                   "pays back is unknown: not chosen: " + ", ".join(f"#{n}" for n in untwinned))
    noisy_rows = [s.number for s in choice.rows if s.noisy]
    if noisy_rows:
        why.append(f"not ranked, windows disagree beyond {NOISY_CV:.0%} CV (noisy): "
                   + ", ".join(f"#{n}" for n in noisy_rows))
    return Choice(**{**choice.__dict__, "why": tuple(why)})


def why_not(row, best, budget: int | None, headroom: float, objective: str = "samples") -> str | None:
    """Why `row`, faster than `best` on its figures, is not best: noise, the headroom or the tie rule
    (the live sweep output says it the moment the trial ends); None when it is best or slower."""
    rec, top = Record.of(row), Record.of(best)
    mine, theirs = speed(rec, objective), speed(top, objective)
    if rec.status != OK or rec.number == top.number or not mine or not theirs or mine <= theirs:
        return None
    if noisy(rec):
        return f"#{rec.number}'s windows disagree ({rec.step_cv:.0%} CV): noisy, not ranked"
    cap = capacity([rec, top], budget)
    if cap and rec.peak > cap * (1 - headroom):
        return (f"#{rec.number} is faster but its peak {size(rec.peak)} leaves less than the "
                f"{headroom:.0%} headroom of {size(cap)}")
    if faster(rec, top, objective):
        return None  # it will be best once the choice is made again
    gap, bound = (mine - theirs) / mine, max(noise(rec, objective), noise(top, objective))
    return (f"#{rec.number} is {gap:.1%} faster, within the measured noise (±{bound:.1%}): a tie goes to "
            f"the config with more headroom (#{top.number} peaks at {size(top.peak)}, "
            f"#{rec.number} at {size(rec.peak)})")
