"""What was measured, for people (a rich table and summary) and for pipelines (JSON, CSV, pandas).

Every view here shows the one harness.pareto.Choice it is handed: the speed of a config is the
choice's (the median of its confirmed runs), its marks (best, Pareto, tier, noisy, unsafe) are the
choice's, and the summary's sentences are the choice's `why`. The HTML page (`_html`)
reads the same Choice.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from collections import Counter
from dataclasses import dataclass

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from harness import busy, failures, knobs, pareto, record
from harness.search import describe
from harness.pareto import Choice, Standing
from harness.report import _time
from harness.units import count, fixed, size

JSON_KEYS = ("number", "status", "config", "throughput", "peak_memory", "tokens_per_s", "memory", "timing", "flops",
             "loss", "env", "error", "workload", "adapter", "log", "reused", "start", "repeats", "skip", "busy",
             "remeasured_after", "unread_params", "version")


def annotate(rows: list[dict], info: dict, run_steps: int | None = None, run_source: str | None = None,
             applies: bool = True) -> Choice:
    """The study's choice: harness.pareto.choose with the study's budget, headroom and objective, and the
    search's model (harness.planner: why best is best, predictions) that the sweep kept with the study."""
    choice = pareto.choose(rows, info.get("memory_budget"), info.get("headroom", 0.1), info.get("objective", "samples"),
                           run_steps=run_steps, run_source=run_source)
    return dataclasses.replace(choice, model=info.get("model"), applies=applies)


def marks(s: Standing, choice: Choice) -> dict:
    """The choice's verdict on one trial, as JSON/CSV carry it: the figure it was chosen on and its marks."""
    against = choice.against_baseline(s)
    return {"pareto": s.pareto, "best": s.best, "leader": choice.leader is s, "baseline": s.record.baseline,
            "tier": s.tier, "tiers": [name for name, t in choice.tiers.items() if t is s],
            "noisy": s.noisy, "unsafe": s.unsafe, "unsearched": list(s.record.unsearched) or None,
            "speed": {"value": s.speed, "unit": choice.unit, "runs": s.runs, "cv": s.cv, "noise": s.noise}
            if s.speed else None,
            "peak": s.peak,  # bytes: the highest over its runs, what fit is judged on
            "fits": choice.fits(s),  # its peak leaves the headroom (your faster config may not)
            # untellable: the rounds side by side disagree too much for any ratio (the terminal's "?×")
            "vs_baseline": {**against.__dict__, "untellable": against.untellable} if against else None,
            **({"model": choice.model} if s.best and choice.model else {})}


def to_json(choice: Choice) -> str:
    """One object per trial: the stored record's keys plus the choice's marks and figures; its own run's rates
    as the table reads them (none for a run over the budget: `Record.rate`)."""
    rows = [{**{k: v for k, v in s.record.to_dict().items() if k in JSON_KEYS},
             "throughput": s.record.rate("samples"), "tokens_per_s": s.record.rate("tokens"), **marks(s, choice)}
            for s in choice.rows]
    return json.dumps(finite(rows), indent=1, default=str, allow_nan=False)


def finite(value):
    """Strict JSON: a NaN or infinity (a diverged loss, a spread of one run) is null, not a bare NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


def flat(choice: Choice) -> list[dict]:
    """One flat dict per trial: config.* columns plus the headline figures (bytes, seconds, `speed_unit`)."""
    out = []
    for s in choice.rows:
        r = s.record
        m = marks(s, choice)
        row = {"number": r.number, "status": s.status,  # the table's: `noisy` too
               **{k: m[k] for k in ("baseline", "pareto", "best", "leader", "tier", "fits", "noisy", "unsafe")},
               "unsearched": " ".join(r.unsearched) or None, "tiers": " ".join(m["tiers"])}
        row.update({f"config.{k}": v for k, v in r.config.items()})
        step = r.timing.get("step_s") or {}
        figure, versus = m["speed"] or {}, m["vs_baseline"] or {}  # JSON's figures: none for a row that has no speed
        row.update(speed=figure.get("value"), speed_unit=figure.get("unit"), runs=figure.get("runs"),
                   speed_cv=figure.get("cv"), vs_baseline=versus.get("ratio"),
                   vs_baseline_spread=versus.get("spread"), vs_baseline_paired=versus.get("paired"),
                   vs_baseline_bound=versus.get("bound"), tie=versus.get("tie"),
                   vs_baseline_untellable=versus.get("untellable"),
                   # runs side by side wholly apart: this config's slowest (or fastest) and your fastest (or slowest)
                   vs_baseline_apart_this=(versus.get("apart") or (None, None))[0],
                   vs_baseline_apart_yours=(versus.get("apart") or (None, None))[1],
                   throughput=r.rate("samples"), tokens_per_s=r.rate("tokens"),  # none over the budget
                   peak_memory=r.peak_memory, peak=m["peak"], step_s=step.get("median"),
                   step_cv=r.step_cv,  # the typed record's: none for one warm-up step's timing (its raw cv is 0.0)
                   compile_s=r.timing.get("compile_s"), tflops=r.flops.get("tflops"), mfu=r.flops.get("mfu"),
                   peak_allocated=r.memory.get("peak_allocated"), peak_reserved=r.memory.get("peak_reserved"),
                   error=record.error_words(r.error) or None)
        out.append(row)
    return out


CSV_LEAD = ("number", "status", "baseline", "pareto", "best", "leader", "tier", "fits", "noisy", "unsafe", "unsearched",
            "tiers")
CSV_FIGURES = ("speed", "speed_unit", "runs", "speed_cv", "vs_baseline", "vs_baseline_spread", "vs_baseline_paired",
               "vs_baseline_bound", "tie", "vs_baseline_untellable", "vs_baseline_apart_this", "vs_baseline_apart_yours", "throughput",
               "tokens_per_s", "peak_memory", "peak", "step_s", "step_cv", "compile_s", "tflops", "mfu", "peak_allocated",
               "peak_reserved", "error")
"""The CSV's columns either side of config.*: fixed, so a study with no trial yet still has a header row
(pandas.read_csv refuses an empty file), and DictWriter refuses a row with a column not named here."""


def to_csv(choice: Choice) -> str:
    records = flat(choice)
    configs = dict.fromkeys(k for r in records for k in r if k.startswith("config."))
    columns = [*CSV_LEAD, *configs, *CSV_FIGURES]
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns)
    writer.writeheader()
    writer.writerows(records)
    return buf.getvalue()


# ---- terminal ------------------------------------------------------------------------------------

STATUS_STYLE = {"ok": "green", "oom": "red", "timeout": "yellow", "crash": "red", "error": "red",
                "diverged": "magenta", "interrupted": "dim", "running": "cyan", "noisy": "yellow"}


def knob_columns(rows: list[Standing]) -> list[str]:
    seen = list(dict.fromkeys(k for s in rows for k in s.config))
    return [k for k in knobs.CORE if k in seen] + [k for k in seen if k not in knobs.CORE]


# Narrow terminals: short headers (the registry's) and values for the knob columns, never for a number.
SHORT_VALUE = {"bf16-mixed": "bf16m", "fp16-mixed": "fp16m", "bf16-true": "bf16t", "reduce-overhead": "r-o",
               "max-autotune": "max-at", "max-autotune-no-cudagraphs": "max-at-ncg", "default": "dflt"}


@dataclass
class Column:
    header: str
    cells: list
    number: bool = False
    knob: str | None = None

    def width(self) -> int:
        return max([len(self.header)] + [len(str(c)) for c in self.cells])


def table(choice: Choice, info: dict, width: int | None = None) -> Group:
    """The trials as a table that fits `width` columns (None: everything, `--wide`). To fit, knob
    headers and values are abbreviated, knobs that are the same in every trial move to a line under
    the table, then `% mem`, the workload's own knobs, `± cv` and `runs` go; where even that is too
    wide, each trial becomes a line of its own, wrapped at spaces. A number is never cut."""
    rows = list(choice.rows)
    columns, notes = fit(columns_for(choice), rows, width)
    if width is not None and not fits(columns, width):
        body = Text("\n".join(as_lines(columns, rows)))
    else:
        narrow = width is not None
        # every string as Text: a study name, knob or value like `[/x]` is the user's text, not rich markup
        body = Table(title=Text(f"study {info.get('name')}: {choice.unit} vs peak memory"), title_justify="left",
                     box=box.SIMPLE_HEAD if narrow else box.HEAVY_HEAD, pad_edge=not narrow)
        for c in columns:
            body.add_column(Text(c.header), no_wrap=True, min_width=c.width(),
                            justify="right" if c.number or c.knob in ("batch_size", "accumulation") else "left")
        for i, s in enumerate(rows):
            body.add_row(*[Text(str(c.cells[i]), style=STATUS_STYLE.get(str(c.cells[i]), "") if c.header == "status" else "")
                           for c in columns], style="bold" if s.best else None)
    shows_runs = any(c.header == "runs" for c in columns)
    return Group(body, Text("\n".join(notes + [legend(choice, shows_runs, width)])), summary(choice, info))


def as_lines(columns: list[Column], rows: list[Standing]) -> list[str]:
    """The table as one line of values per trial under a line naming them, for a terminal narrower
    than its columns (wrapped at spaces, so no value is cut)."""
    return ["values: " + " ".join((c.header or "marks").replace(" ", "_") for c in columns)] + \
        [" ".join(str(c.cells[i]) or "-" for c in columns) for i in range(len(rows))]  # one word per column


def shown_peak(s: Standing) -> int | None:
    """The peak a trial's row shows, in the table and on the HTML page: a measured config's (ok, or diverged:
    it ran its steps), the highest over its runs; none for an OOM, a timeout or a crash, whose record may
    hold how far it got, which is not a measurement of the config (JSON's `peak` keeps it)."""
    return s.peak if s.record.status in ("ok", "diverged") else None


def peak_unit(rows) -> tuple[str, int]:
    """The unit of a column of shown peaks: GiB where one of them is a GiB or more, else MiB (85 and 95 MiB
    both read 0.09 GiB)."""
    return ("GiB", 1024**3) if any((shown_peak(s) or 0) >= 1024**3 for s in rows) else ("MiB", 1024**2)


def columns_for(choice: Choice) -> list[Column]:
    rows, cap = choice.rows, choice.capacity
    peaks = [shown_peak(s) for s in rows]
    unit, scale = peak_unit(rows)
    in_gib = unit == "GiB"
    columns = [
        Column("#", [s.number for s in rows], number=True),
        Column("", [flags(s) for s in rows]),
        *[Column(k.replace("_", " "), [s.config.get(k, "") for s in rows], knob=k) for k in knob_columns(rows)],
        Column("status", [s.status for s in rows]),
        Column(choice.unit, [fixed(s.speed, 1) if s.speed else "-" for s in rows], number=True),
        Column("runs", [s.runs if s.speed else "-" for s in rows], number=True),
        Column("± cv", [f"{100 * s.cv:.1f}%" if s.cv is not None and s.speed else "-" for s in rows], number=True),
        Column(f"peak {unit}", ["-" if p is None else fixed(p / scale, 2 if in_gib else 1) for p in peaks],
               number=True),
        Column("% mem", [f"{100 * p / cap:.0f}%" if p is not None and cap else "-" for p in peaks], number=True),
    ]
    return columns if any(s.runs > 1 for s in rows) else [c for c in columns if c.header != "runs"]


def flags(s: Standing) -> str:
    return ("★" if s.best else "") + ("◆" if s.pareto else "") + ("B" if s.record.baseline else "") + \
        ("!" if s.unsafe else "") + ("x" if s.record.unsearched else "")


def fits(columns: list[Column], width: int) -> bool:
    """As rich draws the table: each column padded by a space either side, a space between columns
    and one at each edge."""
    return sum(c.width() + 3 for c in columns) + 1 <= width


def fit(columns: list[Column], rows: list[Standing], width: int | None) -> tuple[list[Column], list[str]]:
    """Columns (and notes for what moved out of them) that fit `width`; every number stays whole."""
    notes: list[str] = []
    if width is None:
        return columns, notes
    for c in columns:  # 1. short knob headers and values
        if c.knob and not fits(columns, width):
            c.header = knobs.SHORT.get(c.knob, c.header)
            c.cells = [SHORT_VALUE.get(v, v) if isinstance(v, str) else v for v in c.cells]
    if not fits(columns, width):  # 2. a knob with one value in every trial is a line, not a column
        same = [c for c in columns if c.knob and len({repr(v) for v in c.cells}) == 1 and rows]
        if same:
            notes.append("same in every trial: " + ", ".join(f"{c.knob}={c.cells[0]}" for c in same))
            columns = [c for c in columns if c not in same]
    for drop in ("% mem", "own knobs", "± cv", "runs"):  # 3. the least needed columns
        if fits(columns, width):
            break
        gone = [c for c in columns if c.header == drop or (drop == "own knobs" and c.knob and c.knob not in knobs.CORE)]
        columns = [c for c in columns if c not in gone]
        if gone and drop == "own knobs":
            notes.append(f"not shown ({width} columns; --wide shows them): " + ", ".join(c.knob for c in gone))
    return columns, notes


def legend(choice: Choice, shows_runs: bool, width: int | None = None) -> str:
    """The marks and words the table uses; `runs` only where the table has that column. Within `width`
    columns, lines break between entries, never inside one ("! loss rose beyond / chance" read as two)."""
    base = "your config as swept" if choice.applies else "the spec's defaults: no apply: section, no config read"
    entries = ["★ best", "◆ Pareto front", f"B baseline ({base})"]
    entries += ["! loss rose beyond chance"] if any(s.unsafe for s in choice.rows) else []  # marks no row bears: noise
    entries += ["x a value not in the search as last swept"] if any(s.record.unsearched for s in choice.rows) else []
    entries += ["noisy: windows disagree, not ranked"] if any(s.noisy for s in choice.rows) else []
    entries += ["runs: measured runs the figure is the median of"] if shows_runs else []
    entries += ["GiB = 1024³ bytes, MiB = 1024² bytes"]
    lines = [entries[0]]
    for entry in entries[1:]:
        if width is not None and len(lines[-1]) + len(LEGEND_GAP) + len(entry) > width:
            lines.append(entry)  # one longer than the width alone still wraps, at its spaces
        else:
            lines[-1] += LEGEND_GAP + entry
    return "\n".join(lines)


LEGEND_GAP = "   "


def summary(choice: Choice, info: dict) -> Text:
    return Text("\n".join(summary_lines(choice, info)))


def summary_lines(choice: Choice, info: dict) -> list[str]:
    counts = Counter(s.status for s in choice.rows)
    lines = ["trials: " + (", ".join(f"{n} {s}" for s, n in counts.most_common()) or "none yet")]
    if choice.capacity:
        lines.append(f"capacity: {size(choice.capacity)} ({choice.capacity_label}), "
                     f"required headroom {choice.headroom:.0%}")
    lines += headline(choice)
    lines += story(choice)[1 if choice.best else 0:]  # its first line, on your config, is the headline's unless none is best
    best = choice.best
    if best and best.record.memory.get("breakdown"):
        reused = (best.record.reused or {}).get("breakdown")
        where = f"tensors measured in trial {reused['trial']}, same build and shape" if reused else "measured tensors"
        lines.append("best's memory: " + ", ".join(f"{k} {size(v)}" for k, v in best.record.memory["breakdown"].items())
                     + f" ({where}; the rest of the {size(best.peak)} peak is allocator, runtime and data)")
    lines.extend(model_lines(choice))
    lines.extend(compile_lines(choice))
    lines.extend(_time.lines([s.record for s in choice.rows]))
    lines.extend(watch_lines(choice))
    lines.append("tiers (headroom of capacity: " + ", ".join(f"{n} {h:.0%}" for n, h in pareto.TIERS.items()) + "):")
    for names, tier in tier_groups(choice):
        lines.append(f"  {', '.join(names):<10} " + (f"trial {tier.number}: {tier.speed:.1f} {choice.unit}, "
                                                     f"peak {size(tier.peak)}" if tier else no_tier(choice)))
    return lines


def tier_groups(choice: Choice) -> list[tuple[list[str], Standing | None]]:
    """The tiers, safest first, those naming one trial (or none) together: one line or card, not three alike."""
    groups: list[tuple[list[str], Standing | None]] = []
    for name, tier in choice.tiers.items():
        if groups and (groups[-1][1] and groups[-1][1].number) == (tier and tier.number):
            groups[-1][0].append(name)
        else:
            groups.append(([name], tier))
    return groups


def no_tier(choice: Choice) -> str:
    """Why a tier is empty: nothing fits its headroom only where something was measured to rank."""
    if any(s.measured and not s.noisy for s in choice.rows):
        return "nothing fits"
    return "no run steady enough to rank" if any(s.measured for s in choice.rows) else "nothing measured"


def model_lines(choice: Choice) -> list[str]:
    """Why best is best, and the configs never measured that the model predicts fastest: predicted, not measured."""
    model, objective = choice.model, choice.objective
    if not model:
        return []
    lines = why_lines(choice)
    if model.get("predicted"):
        lines.append("PREDICTED, not measured (the search's model; run them with `bench trial`):")
        for p in model["predicted"]:
            lines.append(f"  {describe(p['config'])}  ~{p['speed']:.1f} {objective}/s (likely within "
                         f"×{math.exp(p['speed_sd']):.2f} either way), "
                         f"peak ~{size(p['peak_memory'])}, {p['fit_chance']:.0%} chance it fits, "
                         f"{p['beat_chance']:.0%} chance it beats {beaten(choice)}")
    return lines


def beaten(choice: Choice) -> str:
    """What a prediction's chance to beat is against: the planner's bar, the leader, which is best
    unless a tie keeps your config."""
    return f"the leader (#{choice.leader.number})" if choice.kept else "best"


def why_lines(choice: Choice) -> list[str]:
    """The model's line on the trial the sweep ended with in the lead: "why best" while it is best; the
    leader's, named, where a tie kept your config; nothing once another trial leads (a later resume)."""
    model = choice.model
    if not model or not model.get("why"):
        return []
    about = model.get("why_for")  # absent in studies from before it was kept
    if about is None or (choice.best is not None and about == choice.best.number):
        return [f"why best: {model['why']}"]
    if choice.leader is not None and about == choice.leader.number:
        return [f"why trial #{about} leads: {model['why']}"]
    return []


def headline(choice: Choice) -> list[str]:
    """Best, how it compares with the baseline, and the headroom it leaves: the lines every view quotes."""
    best, base, leader = choice.best, choice.baseline, choice.leader
    if best is None and (same := failures.common_error([s.record.to_dict() for s in choice.rows])):
        return [f"best: none — no trial trained: {failures.describe(same)}"]
    if best is None:
        return ["best: none — no measured config qualifies; see the statuses above and why below"]
    lines = [f"best: trial {best.number}  {describe(best.config)}  {best.speed:.1f} {choice.unit} "
             f"({best.runs_words}), peak {size(best.peak)}"
             + (("  — your config as swept" if choice.applies else "  — the baseline") if best.record.baseline else "")]
    if choice.versus is not None:
        kept = ", so your config stays (`bench apply best` keeps its values)" if choice.kept else ""
        lines.append(f"{'vs baseline' if leader is best else 'leader'} (trial {leader.number} vs trial {base.number}): "
                     f"{choice.versus.text(choice.unit)}{kept}, memory {signed_size(leader.peak - base.peak)}")
        if choice.sure_over_tie:
            lines.append(f"vs baseline (trial {best.number} vs trial {base.number}): "
                         f"{choice.against_baseline(best).text(choice.unit)}, memory {signed_size(best.peak - base.peak)}")
    elif base is not None and not base.measured:
        lines.append(f"baseline (trial {base.number}) ended {base.record.status}: nothing to compare against")
    elif base is not None and base.noisy:  # never best: a noisy config is not ranked
        lines.append(f"baseline (trial {base.number}): its timed windows disagree ({base.record.step_cv:.0%} CV, most "
                     "often a busy machine): not a measurement to compare against")
    if choice.capacity:
        lines.append(f"headroom left: {1 - best.peak / choice.capacity:.0%} of {size(choice.capacity)}")
    return lines


def story(choice: Choice) -> list[str]:
    """The sweep in sentences, the same in the terminal and at the top of the HTML page: the leader
    against your config (spread, tie or not), how many runs confirm it, busy periods, why, what next."""
    best, base, leader, v, unit = choice.best, choice.baseline, choice.leader, choice.versus, choice.unit
    lines = []
    if v is not None:
        verdict = f"{v.verdict()}, so your config stays; `bench apply best` keeps its values" if choice.kept \
            else v.verdict()
        lines.append(f"trial #{leader.number} against your config (#{base.number}): {v.text(unit).split(' — ')[0]}: "
                     f"{verdict}")
    elif best is not None and base is not None and best is base:
        lines.append(f"your config (#{base.number}) is the fastest measured config that fits")
    elif base is not None and base.noisy:
        lines.append(f"your config (#{base.number})'s timed windows disagree ({base.record.step_cv:.0%} CV, most "
                     "often a busy machine): not a measurement to compare against")
    elif base is not None and not base.measured:
        lines.append(f"your config (#{base.number}) ended {base.record.status}: nothing to compare against")
    elif base is not None and leader is None:
        lines.append(f"your config (#{base.number}) ran, but no config leaves the {choice.headroom:.0%} headroom of "
                     f"the {size(choice.capacity)} {choice.capacity_label}: nothing to compare with it")
    elif base is not None:
        lines.append(f"your config (#{base.number}) is not among the configs best is chosen from: nothing to compare against")
    else:
        lines.append("no baseline in this study: nothing to compare against")
    if leader is not None:
        lines.append(f"trial #{leader.number}'s {leader.speed:.1f} {unit} is the median of {leader.runs} run"
                     + (f"s (its trial and {leader.runs - 1} confirmation run{'s' if leader.runs > 2 else ''})"
                        if leader.runs > 1 else ", not confirmed"))
    lines += [line for line in [busy_story(choice), unchecked_story(choice)] if line]
    lines += [line for line in [wall_story(choice)] if line]
    lines += [line for line in choice.why if not (choice.kept and line == choice.why[0])]
    lines.append("next: " + next_step(choice))
    return lines


def unchecked_story(choice: Choice) -> str | None:
    """The trials whose first loss was not held to the fp32 reference (loss.unchecked), and why."""
    rows = [s for s in ran(choice) if isinstance(s.record.loss.get("unchecked"), str)]
    if not rows:
        return None
    return (f"the first loss of {', '.join(f'#{s.number}' for s in rows)} was not held to the fp32 reference, "
            f"so nothing vouches for their numerics: {record.printable(rows[0].record.loss['unchecked'])}")


def wall_story(choice: Choice) -> str | None:
    """Said when the best fit only because the CUDA allocator, at the memory wall, freed its cache and
    retried: it ran, but those steps paid for it, and a longer input would not fit."""
    retries = choice.best.record.memory.get("alloc_retries") if choice.best is not None else None
    if not retries:
        return None
    wall = "the budget" if choice.best.record.memory.get("budget") else "the card's memory"
    return (f"trial #{choice.best.number} ran at the memory wall: the CUDA allocator freed its cache and retried "
            f"{retries} time{'s' if retries > 1 else ''} in its steady steps to stay within {wall} (slower steps where it did); "
            "it fits, with no room for a longer input: the next smaller batch leaves some")


def ran(choice: Choice) -> list[Standing]:
    """Trials whose child ran to a result (not interrupted, skipped or still running)."""
    return [s for s in choice.rows if s.record.status not in failures.IN_FLIGHT_OR_NOT_RUN]


def measured(choice: Choice) -> list[Standing]:
    """Trials with a figure that may decide the choice: an OOM or a failure is not a figure load spoils,
    and a value the last sweep took out of the search is never chosen (nor measured again)."""
    return [s for s in ran(choice) if s.record.status == record.OK and not s.record.unsearched]


def stayed_noisy(choice: Choice) -> list[Standing]:
    """The noisy trials, when every one of them was a re-measurement of a noisy run: sweeping again on a
    quiet machine will not measure them again."""
    noisy = [s for s in measured(choice) if s.noisy]
    return noisy if all("noisy_cv" in (s.record.remeasured_after or {}) for s in noisy) else []


def spoiled(choice: Choice) -> bool:
    """The figures deciding this choice are noise: a run too noisy to rank, most runs made on a busy
    machine, or best or the leader among them. The answer is to sweep again on a quiet machine."""
    measured_rows = measured(choice)
    busy_rows = [s for s in measured_rows if ran_busy(s)]
    return (any(s.noisy for s in measured_rows) or len(busy_rows) * 2 > len(measured_rows)
            or any(s in busy_rows for s in (choice.best, choice.leader)))


def ran_busy(s: Standing) -> bool:
    """Its trial or one of its confirmation runs was measured on a busy machine."""
    return bool(s.record.busy) or any(r.busy for r in s.record.repeats)


def busy_story(choice: Choice) -> str | None:
    ran_rows = ran(choice)
    busy_any = [s for s in ran_rows if ran_busy(s)]
    # a trial with no figure (an error, a crash) has none a busy machine made low: not named among them
    busy_rows = [s for s in busy_any if s.record.throughput is not None]
    if not ran_rows:
        return None  # nothing ran to be quiet or busy for
    if not busy_any:
        return ("the machine was quiet for every trial (other processes' CPU, load, CPU steal and other GPU processes "
                "checked each time)")
    if not busy_rows:
        return f"the machine was busy during {len(busy_any)} of {len(ran_rows)} trials, none of which measured a speed"
    verdicts = [v for s in busy_rows for v in (s.record.busy, *(r.busy for r in s.record.repeats)) if v]
    # others' cores in use is what slows a trial; load1 counts bench's own child too (older records lack it)
    worst = max(verdicts, key=lambda b: (b.get("busy_cores", 0), b.get("load1", 0)))
    figureless = len(busy_any) - len(busy_rows)
    return (f"the machine was busy during {len(busy_any)} of {len(ran_rows)} trials: "
            + ", ".join(f"#{s.number}" + ("" if s.record.busy else " (in confirmation)") for s in busy_rows)
            + (f" (and {figureless} that measured no speed)" if figureless else "")
            + f"; at worst {busy.describe(worst)}; their figures may be low")


def next_step(choice: Choice) -> str:
    running = [s for s in choice.rows if s.record.status == "running"]
    if running:  # its sweep decides what runs next, and may yet measure again what load spoiled
        return f"a sweep is running (trial #{running[0].number}): `bench report` again when it ends"
    ran_rows = ran(choice)
    last_stop = max((s for s in choice.rows if s.record.status == record.INTERRUPTED), key=lambda s: s.number, default=None)
    if last_stop is not None and (last_stop.record.error or {}).get("type") == "FactoryImportError":
        # resuming as it stands stops on the same import (a later stop, after it was fixed, is another story)
        return (f"the sweep stopped on your code: {record.printable(record.error_words(last_stop.record.error, 300))}; "
                "fix it and run the same `bench sweep`")
    # an interrupted config not measured since: it said "keep your config, widen the search" to a preempted sweep
    stopped = [s for s in choice.rows if s.record.status == record.INTERRUPTED and s.config
               and all(s.config != r.config for r in ran_rows)]
    if stopped and ran_rows:  # with nothing run yet, the line below says it
        return (f"the sweep was stopped before it ended ({count(len(stopped), 'trial')} interrupted and not "
                f"measured since, #{stopped[0].number} first): run the same `bench sweep` to resume; they run again")
    if noisy := stayed_noisy(choice):
        return (f"trial{'s' if len(noisy) > 1 else ''} {', '.join(f'#{s.number}' for s in noisy)} stayed noisy when measured again on a quiet machine: "
                "give trials longer (trial.max_seconds) or steadier data, and sweep again")
    if spoiled(choice):
        return ("run `bench sweep` again when the machine is quiet: it measures again what a busy machine or noise "
                "spoiled, and the figures deciding this one are such")
    if not ran_rows:
        return "nothing ran to a result yet: run the same `bench sweep` to resume"
    if choice.best is None and not any(s.record.status in (record.OK, record.OOM, record.DIVERGED) for s in ran_rows):
        return ("no trial trained: see the statuses (a timeout wants a longer trial.timeout; an error or crash, "
                "the log its record names), then sweep again")
    if choice.best is None:
        return "no config fits: see the statuses, try smaller batch sizes or a larger memory budget"
    if choice.wide_tie:
        return (f"keep your config for now: the leader (#{choice.leader.number}) may be faster, but their runs side "
                "by side disagree too much to tell; on a quiet machine, sweep again as a new study "
                "(`bench sweep SPEC --study NEW_NAME`)")
    if choice.kept and choice.versus is not None and choice.versus.untellable:
        return (f"keep your config for now: its runs side by side with the leader (#{choice.leader.number}) disagree "
                "too much to tell the two apart; with the machine kept quiet, sweep again as a new study "
                "(`bench sweep SPEC --study NEW_NAME`)")
    if (choice.kept or choice.best.record.baseline) and (more := cut_short(choice)):
        return (f"keep your config for now: the sweep ended on its trial cap with {count(more, 'config')} never "
                "measured that the search's model gives a chance to beat it; raise the spec's trials (or "
                "--trials N) and run the same `bench sweep` to measure them")
    if choice.kept or choice.best.record.baseline:
        return "keep your config: no config measured is chosen over it; to look further, widen the search space"
    if not choice.applies:
        return (f"trial #{choice.best.number} is best; to write it into your config, add an apply: section to the "
                "spec naming the file (see `bench apply --help`)")
    if choice.best.runs < 3 and len(choice.candidates) > 1:
        return f"`bench apply best` writes trial #{choice.best.number}; it is not confirmed: `bench sweep` again confirms it"
    return f"`bench apply best` writes trial #{choice.best.number} into your config"


def cut_short(choice: Choice) -> int:
    """Configs never measured that `--trials auto` would still measure, where the sweep ended on its trial cap;
    0 where it ended on its own rule or its time limit, or its model predates its last trials."""
    model = choice.model or {}
    if not model.get("capped") or model.get("rows") != len(choice.rows):
        return 0
    return model.get("worth_measuring", 0)


def watch_lines(choice: Choice) -> list[str]:
    """Skipped configs (never measured), and trials re-measured after a busy or noisy run (the story
    names the trials measured on a busy machine)."""
    lines = []
    for s in choice.rows:
        r = s.record
        if r.status == "skipped":
            lines.append(f"skipped #{r.number} {describe(r.config)}: {skipped_words(r)}")
    return lines + remeasured_lines(choice)


def skipped_words(r: record.Record) -> str:
    """Why a skipped config was not run, as every view says it."""
    skip = r.skip or {}
    sources = skip.get("from") or []
    return (f"{skip.get('reason')} (inferred from trial{'s' if len(sources) > 1 else ''} "
            f"{', '.join(map(str, sources))}); not measured")


def remeasured_lines(choice: Choice) -> list[str]:
    """Trials that replaced a run a busy machine or noise spoiled; the run they replaced is kept out of the table."""
    lines = []
    for s in choice.rows:
        first = s.record.remeasured_after
        if first:
            why = (f"its first run's windows disagreed by {first['noisy_cv']:.0%}" if "noisy_cv" in first
                   else f"the machine was busy during its first run ({busy.describe(first)})")
            who = f"#{s.number} re-measured #{first['trial']}" if "trial" in first else f"re-measured #{s.number}"
            lines.append(f"{who} ({describe(s.config)}): {why}")
    return lines


def compile_lines(choice: Choice) -> list[str]:
    lines = []
    for p in choice.paybacks:
        if p.break_even_steps is not None:
            verdict = (f"pays for itself after {p.break_even_steps:,.0f} steps "
                       f"({'within' if p.pays else 'beyond'} {choice.run_source})")
        elif p.saved_s_per_step < 0:
            verdict = "never pays for itself (slower than eager)"
        else:
            verdict = "never pays for itself (not faster than eager beyond the noise)"
        effect = (f"{1000 * p.saved_s_per_step:.1f} ms/step saved" if p.saved_s_per_step >= 0
                  else f"{-1000 * p.saved_s_per_step:.1f} ms/step slower")
        lines.append(f"compile: trial {p.trial} spent {p.compile_s:.1f}s compiling, {effect} vs trial {p.eager}: {verdict}")
    return lines


def signed_size(delta: float) -> str:
    return ("+" if delta >= 0 else "-") + size(abs(delta))
