"""What to measure next, and when to stop: the model's predictions turned into decisions. No Optuna, no processes.

Given the measured rows (trial records) and the space of configs, `Planner.next` fits the model
(harness.model), predicts every unmeasured config's throughput and peak with an uncertainty, and
returns the config with the largest expected improvement over the best measured config that fits,
weighted by the chance that it fits (constrained EI, in log throughput). A config of a family
never measured has a wide prediction, so it is measured when the model says it may win. Known
facts overrule the model: a config at or above a batch of its memory family that ran out of memory
or over the usable memory is never proposed (harness.search holds those rules and the skip
records), and one at or below a batch measured to fit surely fits.

Given `stop`, it returns None once no config it would measure (unmeasured, not a memory saver its
twin makes needless, in time) has even that chance (STOP_CHANCE for `--trials auto`) to fit and
beat the best by more than the best's measured noise. `study.Sweep` drives
it with Optuna as the ledger; benchmarks/search_replay.py and search_eval.py drive the same code.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import model, pareto, search
from harness.record import Record

STOP_CHANCE = 0.05
"""--trials auto stops once every unmeasured config's chance to fit and beat the best by more than
its noise is under this."""
EAGER_STOP_CHANCE = 0.2
"""The eager search hands over to compile sooner: compiling removes a step's fixed cost, which no
eager config can, so the last few percent of eager refinement are worth less than its first trial."""
TRUST = 16
"""The largest batch proposed is this many times the largest that has run (finders double; the model
may stride further, not blindly)."""
SLOW_END = 2.0
"""A step's time limit is checked at its predicted speed less this many sds (at most SLOW_SD_CAP each):
a batch far past those measured may slow down more than the line says (a CPU's caches)."""
SLOW_SD_CAP = 0.35
"""So the slow end is at most 2x under the prediction: after one trial every other config's spread is
a factor of 10, and a limit checked at 100x slower would leave nothing but the smallest batches."""
PEAK_SD_CAP = 0.25
"""The largest log-spread of a predicted peak the chance to fit uses (a factor of 1.28)."""
SHOWN = 5
"""Predicted configs a study keeps for its report."""
ACTIVATION_CUT = 0.9
"""A knob value that keeps under this share of the activations is one that can let a batch fit."""
AS_MEASURED = "is faster as measured"
"""Why a knob value wins when the fit gives it no effect worth a figure."""


def gain_words(v: pareto.Versus, against: str) -> str:
    """"+35% over batch 64", and "(within the noise)" where the report calls the pair a tie."""
    return f"{v.ratio - 1:+.0%} over {against}" + (" (within the noise)" if v.tie else "")


def normal_cdf(z):
    return 0.5 * (1 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2)))


def normal_pdf(z):
    return np.exp(-0.5 * np.asarray(z) ** 2) / math.sqrt(2 * math.pi)


@dataclass
class Planner:
    space: list[dict]
    """Every config the search may measure."""
    usable: float | None
    """Peak memory a config may use and still count (budget less headroom); None: no budget."""
    limit: float | None
    """Where a run runs out of memory (the budget): an OOM says the peak was above it."""
    device: str
    objective: str = "samples"
    max_step_s: float | None = None
    """No config is proposed whose predicted optimizer step takes longer (a trial that cannot finish
    its warm-up inside the stall limit is a lost trial, and on a CPU batch 2048 gets there)."""
    run_steps: int | None = None
    """Optimizer steps of the run the apply target describes (None: pareto's assumption): a compile that
    does not pay back within it is not a candidate, as in the report's choice."""

    def fit(self, rows: list[dict]) -> model.Fit:
        return model.fit(searched(rows), self.space, self.device, self.objective, self.limit)

    def next(self, rows: list[dict], include=lambda config: True, stop: float | None = None) -> dict | None:
        """The config to measure next among those `include` admits; None when none is left (or when
        no config has a `stop` chance to fit and beat the best by more than the noise)."""
        rows = searched(rows)
        open_ = self.open_configs(rows, include)
        if not open_:
            return None
        fitted = self.fit(rows)
        scored = self.score(open_, rows, fitted)
        # a config left out here must not keep the search going either: the stop rule sees the same ones
        admitted = self.saver_needed(open_, rows, fitted) * self.in_time(open_, rows, scored)
        if not admitted.any():
            return None
        scored["acquisition"] = scored["acquisition"] * admitted
        if stop is not None and (scored["beat"] * admitted).max() < stop:
            return None
        return open_[int(np.argmax(scored["acquisition"]))]

    def open_configs(self, rows: list[dict], include=lambda config: True) -> list[dict]:
        """Configs not measured, not proven over the memory, not above half the samples a step of their
        family took where it ran past the trial timeout (the step-time prediction that let it run was
        wrong, so halve, as the finders do at a wall: stepping down one rung at a time cost three
        timeouts in a row), under any batch larger than the dataset, and within TRUST x the largest batch that ran:
        extrapolating a line a hundredfold is a guess, and a step that takes minutes is a lost trial."""
        measured = {search.key(r["config"]) for r in rows}
        ran = [r["config"]["batch_size"] for r in rows if r.get("status") in ("ok", "diverged")]
        reach = TRUST * max(ran or [r["config"]["batch_size"] for r in rows] or [math.inf])
        if self.space:  # your config may lie far below the space (batch 8 beside 160..256): its smallest batch is in reach
            reach = max(reach, min(c["batch_size"] for c in self.space))
        reach = min([reach] + [b for r in rows if (b := over_dataset(r)) is not None])
        kin = families(rows)
        out = []
        for c in self.space:
            mine = kin.get(search.memory_family(c), [])
            if (include(c) and c["batch_size"] <= reach and search.key(c) not in measured
                    and search.skip_reason(c, mine, self.usable) is None and not search.above_wall(c, mine, self.usable)
                    and not any(r.get("status") == "timeout" and step_samples(r["config"]) < 2 * step_samples(c)
                                for r in mine)):
                out.append(c)
        return out

    def score(self, configs: list[dict], rows: list[dict], fitted: model.Fit) -> dict:
        """Per config (arrays): predicted log speed and its sd, chance to fit, expected improvement
        weighted by that chance, and the chance to fit and beat the best by more than its noise."""
        pred = fitted.predict(configs)
        fit = self.fit_chance(configs, rows, pred)
        best = self.best(rows)
        mu, sd = pred["speed"], pred["speed_sd"]
        if best is None:  # nothing fits yet: the largest expected speed, a config that does not fit counting 0
            return {**pred, "fit": fit, "acquisition": fit * np.exp(mu), "beat": fit}
        gap = mu - math.log(pareto.speed(best, self.objective))
        z = gap / sd
        ei = sd * (normal_pdf(z) + z * normal_cdf(z))
        margin = math.log(1 + pareto.noise(best))
        return {**pred, "fit": fit, "acquisition": fit * ei, "beat": fit * normal_cdf((gap - margin) / sd)}

    def chances(self, configs: list[dict], rows: list[dict]) -> list[tuple[float, float]]:
        """Per config: its predicted throughput and its chance to fit and beat the best by more than the
        best's noise (as the stop rule weighs it)."""
        rows = searched(rows)
        scored = self.score(configs, rows, self.fit(rows))
        return [(float(np.exp(mu)), float(beat)) for mu, beat in zip(scored["speed"], scored["beat"])]

    def in_time(self, configs: list[dict], rows: list[dict], scored: dict) -> np.ndarray:
        """1 where the config's optimizer step, at the slow end of its predicted speed, is within max_step_s
        (with no speed measured yet the model has no scale to say)."""
        per_sample = self.per_sample(rows)
        if not self.max_step_s or per_sample is None:
            return np.ones(len(configs))
        work = np.array([step_samples(c) for c in configs], dtype=float) * per_sample
        slow = np.exp(scored["speed"] - SLOW_END * np.minimum(scored["speed_sd"], SLOW_SD_CAP))
        return (work / slow <= self.max_step_s).astype(float)

    def per_sample(self, rows: list[dict]) -> float | None:
        """What one sample is in the objective's unit: 1, or the tokens a sample measured (the median over
        the trials that measured both); None before anything is measured. A noisy run counts: its
        windows disagree, but it still says how long a step takes, and on a busy machine every run
        may be noisy (the limit then went unchecked and batch 1280 x 2 ran into the trial timeout)."""
        measured = [r for r in rows if Record.of(r).measured and pareto.speed(r, self.objective)]
        if self.objective == "samples" or not measured:
            return 1.0 if measured else None
        ratios = [pareto.speed(r, "tokens") / pareto.speed(r, "samples") for r in measured if pareto.speed(r, "samples")]
        return float(np.median(ratios)) if ratios else None

    def saver_needed(self, configs: list[dict], rows: list[dict], fitted: model.Fit) -> np.ndarray:
        """0 for a config with a memory saver (checkpointing) whose twin without it is in the space and
        probably fits at the same batch: the twin is as large and faster, so the saver cannot win there."""
        twins = [{**c, **{k: off for k, off in search.MEMORY_SAVERS.items() if k in c}} for c in configs]
        searchable = {search.key(c) for c in self.space}
        saving = np.array([twin != c and search.key(twin) in searchable for twin, c in zip(twins, configs)])
        if not saving.any():
            return np.ones(len(configs))
        twin_fits = self.fit_chance(twins, rows, fitted.predict(twins))
        return np.where(saving & (twin_fits >= 0.5), 0.0, 1.0)

    def fit_chance(self, configs: list[dict], rows: list[dict], pred: dict) -> np.ndarray:
        if not self.usable:
            return np.ones(len(configs))
        # An OOM bounds the peak from one side only, which the fit's curvature does not see: capped,
        # the spread trusts the model's line over an unmeasured family's prior-wide guess.
        chance = normal_cdf((math.log(self.usable) - pred["peak"]) / np.minimum(pred["peak_sd"], PEAK_SD_CAP))
        kin = families(rows)
        some_fit = {name: search.frontier(family, self.usable)[0] is not None for name, family in kin.items()}
        for i, config in enumerate(configs):
            name = search.memory_family(config)
            fit, wall = search.frontier(kin.get(name, []), self.usable, config)
            if fit is not None and config["batch_size"] <= fit:
                chance[i] = 1.0
            elif wall is not None and config["batch_size"] >= wall:  # measured over: the fit's line does not overrule it
                chance[i] = 0.0
            elif wall is not None and config["batch_size"] > wall // 2 and not some_fit[name]:
                # nothing of this family fits yet: halve from its wall, as the finders do (where it fits
                # without accumulation, the model's held gradients say whether accumulating fits too)
                chance[i] = 0.0
        return chance

    def best(self, rows: list[dict]) -> dict | None:
        """The config `bench report` leads with (harness.pareto.choose): the bar a config must beat."""
        leader = self.choice(rows).leader
        return next((r for r in rows if leader is not None and r["number"] == leader.number), None)

    def candidates(self, rows: list[dict]) -> list[dict]:
        """The rows the report may choose as best: measured, steady, no worse a loss than your config's,
        within the headroom, a compile that pays back."""
        chosen = set(self.choice(rows).candidates)
        return [r for r in rows if r["number"] in chosen]

    def choice(self, rows: list[dict]) -> pareto.Choice:
        headroom = 1 - self.usable / self.limit if self.usable and self.limit else 0.0
        return pareto.choose(rows, self.limit, headroom, self.objective, run_steps=self.run_steps)

    # -- explaining ------------------------------------------------------------------------------
    def summary(self, rows: list[dict], best: dict | None, include=lambda config: True) -> dict:
        """What a study keeps for its report: the configs the model predicts fastest among those never
        measured (predicted, never measurements), one line on why `best` is best, and how many configs
        `include` admits that `--trials auto` would still measure (`next`'s stop rule): where that is
        none, the search ended on its own, not on its cap."""
        rows = searched(rows)
        open_ = self.open_configs(rows)
        out = {"predicted": [], "why": self.why(rows, best), "why_for": best["number"] if best else None}
        if not open_ or not pareto.measured(rows, self.objective):  # no speed measured: nothing to scale a prediction
            return out
        fitted = self.fit(rows)
        scored = self.score(open_, rows, fitted)
        admitted = self.saver_needed(open_, rows, fitted) * self.in_time(open_, rows, scored) \
            * np.array([bool(include(c)) for c in open_])
        out["worth_measuring"] = int(((scored["beat"] * admitted) >= STOP_CHANCE).sum())
        likely, shown = [], set()
        for i in np.argsort(-scored["speed"]):  # the fastest likely fit of each family, not five batches of one
            family = search.speed_family(open_[i])
            if scored["fit"][i] >= 0.5 and family not in shown and len(likely) < SHOWN:
                likely.append(i)
                shown.add(family)
        out["predicted"] = [{"config": open_[i], "speed": float(np.exp(scored["speed"][i])),
                             "speed_sd": float(scored["speed_sd"][i]), "peak_memory": float(np.exp(scored["peak"][i])),
                             "fit_chance": float(scored["fit"][i]), "beat_chance": float(scored["beat"][i])}
                            for i in likely]
        return out

    def why(self, rows: list[dict], best: dict | None) -> str | None:
        """One line: what buys `best` the most. A knob value that lets its batch fit, against the best
        measured config without it; one that is faster at the same batch, against that config with the
        knob changed (measured, else predicted: the best without bf16 at batch 8 credited bf16 with the
        +140% that batch 128 bought); else its batch against its family's measured neighbours."""
        if best is None:
            return None
        rows = searched(rows)
        fits = self.candidates(rows)
        fitted = self.fit(rows)
        speed = pareto.speed(best, self.objective)
        # a knob is a reason only where best is faster than what it is compared with
        reasons = [reason for level in fitted.levels
                   if (reason := self.knob_reason(level, best, rows, fits, fitted)) and reason[0] > 1]
        batch, family = best["config"]["batch_size"], search.speed_family(best["config"])
        kin = [r for r in rows if search.speed_family(r["config"]) == family]
        above_batch = [r for r in kin if r["config"]["batch_size"] > batch]
        smaller = [r for r in kin if r["config"]["batch_size"] < batch and r in fits]
        larger = [r for r in above_batch if r in fits]
        if not reasons and not smaller:
            if any(pareto.speed(r, self.objective) > speed for r in fits):
                return None  # best won a tie (lighter, or confirmed): the choice's own words say why
            ruled_out = any((pareto.speed(r, self.objective) or 0) > speed and search.fits(r, self.usable)
                            for r in rows if r not in fits)  # a compile that does not pay back, a loss that rose
            return f"#{best['number']} is the fastest config measured that fits" + \
                (" and is not ruled out (the faster ones are, each with its reason)" if ruled_out else "")
        below = max(smaller, key=lambda r: r["config"]["batch_size"], default=None)
        gain, line = max(reasons, default=(0.0, ""), key=lambda x: x[0])
        if below is None:
            return line
        over_below = self.over(best, below)
        if over_below is None:
            return line or None  # the two's runs side by side tell nothing: the report says so, not a figure
        if gain >= over_below.ratio:
            return line
        if over_below.ratio <= 1:
            return None  # a smaller batch's one run was faster: best won on its confirmed runs, which the choice says
        words = gain_words(over_below, f"batch {below['config']['batch_size']}")
        if not larger:
            over = any(not search.fits(r, self.usable) and r.get("status") in ("ok", "diverged", "oom", "skipped")
                       for r in above_batch)
            # a larger batch that ran noisy, timed out or failed was measured, just not ranked
            scope = "that fits" if over else "that ran steadily" if above_batch else "measured"
            return f"batch {batch} is the largest of its family {scope}: {words}"
        above = min(larger, key=lambda r: r["config"]["batch_size"])
        over_above = self.over(best, above)
        if over_above is None:
            return f"batch {batch}: {words}"
        gain = over_above.ratio - 1
        if gain > 0:
            above_words = gain_words(over_above, f"batch {above['config']['batch_size']}")
            return f"batch {batch} is the fastest of its family: {words} and {above_words}, which also fits"
        # chosen within the noise of a larger batch (less memory, or confirmed where it was not)
        return (f"batch {batch}: {words}; batch {above['config']['batch_size']} also fits and measured "
                f"{-gain:.0%} faster, within the noise")

    def knob_reason(self, level: tuple, best: dict, rows: list[dict], fits: list[dict],
                    fitted: model.Fit) -> tuple[float, str] | None:
        """(best's speed over the config it is compared with, the line) for one of best's knob values,
        or None where that value is not why best wins."""
        knob, value = level
        without = [r for r in fits if r["config"].get(knob) != value]
        if best["config"].get(knob) != value or not without:
            return None
        alt = max(without, key=lambda r: pareto.speed(r, self.objective))
        batch, other = best["config"]["batch_size"], alt["config"].get(knob)
        if other is None:  # a config from before the knob was searched (a resume's baseline)
            return None
        effect = fitted.effects()[level]
        # it cuts activations, best's batch is larger than alt's, and without it that batch would not fit
        lets_fit = effect["A"] < ACTIVATION_CUT and batch > alt["config"]["batch_size"] \
            and self.needed_to_fit(best["config"], knob, other, rows, fitted)
        words = self.effect_words(effect, batch, lets_fit)
        if not words:
            return None
        if words != AS_MEASURED:  # its per-sample and activation figures are the model's, not a measurement
            words += " (fitted)"
        if lets_fit:
            v = self.over(best, alt)
            against = f"the best without it (#{alt['number']}, {search.describe(alt['config'])})"
            return None if v is None else (v.ratio, f"{knob}={value} {words}: {gain_words(v, against)}")
        twin = {**best["config"], knob: other}
        measured = next((r for r in fits if r["config"] == twin), None)
        if measured:
            v = self.over(best, measured)
            if v is None:
                return None
            gain, said = v.ratio, gain_words(v, f"#{measured['number']}, the same with {knob}={other}")
        else:
            twin_speed = float(np.exp(fitted.predict([twin])["speed"][0]))
            gain = pareto.speed(best, self.objective) / twin_speed
            said = f"{gain - 1:+.0%} over the same with {knob}={other}, predicted {twin_speed:.1f} {self.objective}/s"
        return gain, f"{knob}={value} {words}: {said}"

    def over(self, row: dict, other: dict) -> pareto.Versus | None:
        """`row` against `other` as the report gives it (pareto.versus): the ratio of the runs the two made
        side by side where both were confirmed together, else of their figures (the medians of runs made
        minutes apart said +48% where the same pair's side-by-side rounds, shown below it, said 1.32x).
        None where those rounds disagree too much to tell (the report prints ?x; "+1279%" stood beside it),
        and where no round was side by side and either figure is a busy machine's ("+2894%")."""
        v = pareto.versus(row, other, self.objective)
        if v is None or v.untellable:
            return None
        busy = not v.paired and (Record.of(row).busy or Record.of(other).busy)
        return None if busy else v

    def needed_to_fit(self, config: dict, knob: str, other, rows: list[dict], fitted: model.Fit) -> bool:
        """Would `config` with `knob` at `other` not fit? Measured (its memory family was over the memory
        at this batch or a smaller one) or, where nothing says, as the model predicts it. Another family's
        wall says nothing: fp32 out of memory at batch 256 does not stop bf16 at 128."""
        if not self.usable:
            return False
        twin = {**config, knob: other}
        if search.above_wall(twin, rows, self.usable):
            return True
        return bool(self.fit_chance([twin], rows, fitted.predict([twin]))[0] < 0.5)

    @staticmethod
    def effect_words(effect: dict, batch: int, lets_fit: bool) -> str | None:
        """What a knob value does for `best` at `batch`; None where it is not why best wins (it costs time
        per sample and buys no batch that would not fit without it). `lets_fit`: it lets `batch` fit,
        which the best config without it could not (knob_reason)."""
        words = []
        per_sample = effect["t"] - 1
        # beyond 4x either way the fit is extrapolating from a few points, not describing a measurement
        said = abs(per_sample) >= 0.02 and 0.25 <= effect["t"] <= 4
        if said and per_sample < 0:
            words.append(f"saves {-per_sample:.0%} per sample")
        if effect["O"] < 0.9:
            words.append(f"cuts the fixed cost per step by {1 - effect['O']:.0%}")
        if lets_fit:
            cost = f"costs {per_sample:.0%} per sample and " if said and per_sample > 0 else ""
            words.append(f"{cost}lets batch {batch} fit (activations x{effect['A']:.2f})")
        elif said and per_sample > 0:
            return None  # slower per sample, and memory was no limit: the gain is some other knob's
        return " and ".join(words) or AS_MEASURED


def step_samples(config: dict) -> int:
    """Samples an optimizer step takes: what a step's time, and so a trial's timeout, grows with."""
    return config["batch_size"] * config.get("accumulation", 1)


def over_dataset(row: dict) -> int | None:
    """For a trial whose batch was larger than the dataset (harness.trial.BatchOverDataset), the largest
    batch that may run: the dataset's size where the error gave it (stepping down one batch at a time
    from 2048 spent trials on 1920 and below over 512 samples), else one less than the batch."""
    error = row.get("error") or {}
    if row.get("status") != "error" or error.get("type") != "BatchOverDataset":
        return None
    below = row["config"]["batch_size"] - 1
    return min(below, error["dataset_samples"]) if isinstance(error.get("dataset_samples"), int) else below


def families(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by memory family (harness.search.memory_family)."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(search.memory_family(r["config"]), []).append(r)
    return out


def searched(rows: list[dict]) -> list[dict]:
    """Rows that say something about a config: everything but trials still running or interrupted."""
    return [r for r in rows if r.get("config") and "batch_size" in r["config"]
            and r.get("status") not in ("running", "interrupted")]
