"""The HTML report: escaping, self-containment, the plots' parts, and a real headless browser."""
from __future__ import annotations

import dataclasses
import html
import io
import json
import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest
from rich.console import Console

from harness import pareto, report
from harness.report import _html as html_module
from harness.report import _svg as _svg_module

GiB = 1024**3


def choose(rows: list[dict], study: dict) -> pareto.Choice:
    """The choice as `bench report` makes it over the rows."""
    return pareto.choose(rows, study.get("budget"), study.get("headroom", 0.1), study.get("objective", "samples"),
                         run_steps=100_000)  # a long run: #3's compile (41.5 s, about 16k steps) pays back


def render_html(rows: list[dict], study: dict) -> str:
    """The page as `bench report --format html` draws it: the choice over the rows, then the page."""
    return report.render_html(choose(rows, study), study)


def _trial(number, status, batch, precision, compile_="off", checkpointing="none", throughput=None,
           peak=None, **extra) -> dict:
    row = {
        "number": number, "status": status,
        "config": {"batch_size": batch, "accumulation": 1, "precision": precision,
                   "checkpointing": checkpointing, "compile": compile_},
        "throughput": throughput, "peak_memory": peak,
        "pareto": False, "best": False, "baseline": False, "tier": None,
        "timing": {"compile_s": 0.0 if compile_ == "off" else 41.5, "warmup_s": 3.2, "measure_s": 10.0,
                   "wall_s": 24.0, "step_s": {"median": 16 / throughput, "p10": 15 / throughput,
                                                 "p90": 17 / throughput, "cv": 0.03} if throughput else {}},
        "memory": {}, "flops": {"tflops": 88.0, "mfu": 0.28} if throughput else None,
        "tokens_per_s": {"median": throughput * 512, "p10": throughput * 500, "p90": throughput * 520}
        if throughput else None,
        "env": {"device": "NVIDIA H100 80GB HBM3"}, "error": None,
    }
    row.update(extra)
    return row


def synthetic_rows() -> list[dict]:
    """Twelve trials of a made-up sweep: every status, a front, a baseline and a best."""
    rows = [
        _trial(0, "ok", 16, "fp32", throughput=410.0, peak=int(9.1 * GiB), baseline=True),
        _trial(1, "ok", 32, "bf16-mixed", throughput=905.0, peak=int(8.2 * GiB), pareto=True),
        _trial(2, "ok", 64, "bf16-mixed", "default", throughput=1290.0, peak=int(13.9 * GiB), pareto=True,
               tier="balanced"),
        _trial(3, "ok", 128, "bf16-mixed", "default", "selective", throughput=1335.0, peak=int(17.6 * GiB),
               pareto=True, best=True, tier="aggressive",
               memory={"breakdown": {"weights": int(1.9 * GiB), "gradients": int(1.9 * GiB),
                                     "optimizer": int(3.8 * GiB), "activations": int(8.6 * GiB)},
                       "device_total": 80 * GiB, "budget": 24 * GiB}),
        _trial(4, "ok", 16, "bf16-true", throughput=760.0, peak=int(4.4 * GiB), pareto=True, tier="safe"),
        _trial(5, "ok", 64, "fp16-mixed", "max-autotune", "full", throughput=880.0, peak=int(9.5 * GiB)),
        _trial(6, "ok", 128, "bf16-mixed", "off", "selective", throughput=1100.0, peak=int(18.4 * GiB)),
        _trial(7, "oom", 256, "bf16-mixed", "default", peak=int(26.3 * GiB),
               error={"type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2.1 GiB"}),
        _trial(8, "oom", 128, "fp32", error={"type": "OutOfMemoryError", "message": "CUDA out of memory"}),
        _trial(9, "crash", 64, "fp16-mixed", "reduce-overhead",
               error={"type": "SIGSEGV", "message": "child died with signal 11"}),
        _trial(10, "diverged", 128, "fp16-mixed", throughput=1010.0, peak=int(15.0 * GiB),
               error={"type": "NonFiniteLoss", "message": "loss became nan at step 37"}),
        _trial(11, "timeout", 256, "fp32", "max-autotune",
               error={"type": "Timeout", "message": "no record after 600 s"}),
    ]
    return rows


def synthetic_study() -> dict:
    return {
        "name": "emberformer", "budget": 24 * GiB, "headroom": 0.1, "device_total": 80 * GiB,
        "created": "2026-11-03T14:07:00", "counts": {"ok": 7, "oom": 2, "crash": 1, "diverged": 1, "timeout": 1},
        "env": {"device": "NVIDIA H100 80GB HBM3", "driver": "560.35.03", "cuda": "12.6", "torch": "2.13.0",
                "python": "3.11.7", "host": "gpu-node-7", "bench": "0.1.0"},
    }


@pytest.fixture
def page() -> str:
    return render_html(synthetic_rows(), synthetic_study())


def _svg(page: str, cls: str) -> str:
    match = re.search(rf'<svg class="plot {cls}".*?</svg>', page, re.S)
    assert match, f"no {cls} plot"
    return match.group(0)


# ---- unit tests ---------------------------------------------------------------------------------

def test_user_strings_are_escaped():
    rows = synthetic_rows()
    rows[3]["config"]["precision"] = "<script>alert(1)</script>"
    rows[9]["error"]["message"] = 'boom <img src=x onerror="alert(2)">'
    study = synthetic_study() | {"name": "<script>alert('name')</script>"}
    study["env"]["host"] = "<b>host</b>"
    page = render_html(rows, study)
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;" in page
    assert "<img src=x" not in page and "<b>host</b>" not in page
    assert page.count("<script>") == 1  # only the page's own table sorter


def test_page_is_self_contained(page):
    assert "http://" not in page and "https://" not in page
    assert not re.search(r'(src|href)\s*=\s*["\']?(https?:)?//', page)
    assert "<link" not in page and "@import" not in page
    assert "<style>" in page and "<script>" in page


def test_pareto_front_is_a_staircase_through_the_front(page):
    frontier = _svg(page, "frontier")
    path = re.search(r'<path class="pareto-front" d="([^"]+)"', frontier).group(1)
    assert path.startswith("M") and "H" in path and "V" in path
    # Four front points: a start, then one horizontal + vertical step per further point, then the tail.
    assert path.count("V") == 3 and path.count("H") == 4
    assert frontier.count('class="pt pareto') == 4


def test_every_oom_is_drawn_once_as_a_cross(page):
    frontier = _svg(page, "frontier")
    assert len(re.findall(r'<g class="oom"', frontier)) == 2
    assert 'data-trial="7"' in frontier and 'data-trial="8"' in frontier


def test_oom_without_a_size_sits_at_the_budget():
    rows = [_trial(0, "ok", 8, "fp32", throughput=100.0, peak=2 * GiB),
            _trial(1, "oom", 64, "fp32")]
    study = synthetic_study() | {"budget": 6 * GiB}
    frontier = _svg(render_html(rows, study), "frontier")
    budget_x = re.search(r'<g class="limit budget"><line x1="([\d.]+)"', frontier).group(1)
    cross = re.search(r'<g class="oom".*?<path d="M([\d.]+) ', frontier, re.S).group(1)
    assert abs(float(cross) + 6 - float(budget_x)) < 0.2


def test_a_budget_far_above_every_measurement_is_named_off_the_scale():
    """A 24 GiB plan measured on a small CPU model: the points keep the axis, the budget a note."""
    rows = [_trial(0, "ok", 8, "fp32", throughput=11.0, peak=150 * 1024**2, baseline=True, best=True,
                   pareto=True, memory={"breakdown": {"weights": 2 * 1024**2, "activations": 14 * 1024**2}}),
            _trial(1, "oom", 64, "fp32")]
    page = render_html(rows, synthetic_study())
    frontier = _svg(page, "frontier")
    assert 'class="limit' not in frontier
    assert "10% headroom: 21.60 GiB · budget 24.00 GiB: off the scale →" in frontier
    assert ">160<" in frontier and ">1,000<" not in frontier  # sized to the 150 MiB point
    trials = re.search(r'<table class="trials.*?</table>', page, re.S).group(0)
    assert "peak memory (MiB)" in frontier and "peak memory (MiB)" in trials  # one unit on the page
    assert "budget 24.00 GiB: off the scale ↑" in _svg(page, "breakdown")


def test_points_budget_lines_and_labels(page):
    frontier = _svg(page, "frontier")
    assert frontier.count('<g class="pt') == 8  # 7 ok + 1 diverged; failures have no throughput
    assert 'class="limit budget"' in frontier and 'class="limit usable"' in frontier
    assert "10% headroom: 21.60 GiB" in frontier
    assert ">best #3<" in frontier and ">baseline #0<" in frontier
    assert "3.26×" in frontier  # 1335 / 410


def _labels_over_marks(frontier: str) -> list[tuple[str, str]]:
    """(label, trial) for each callout or arrow label whose box covers another trial's marker."""
    marks = {}
    for n, body in re.findall(r'<g class="pt[^"]*" data-trial="(\d+)">(.*?)</g>', frontier, re.S):
        circle = re.search(r'class="shape" cx="([\d.]+)" cy="([\d.]+)"', body)
        diamond = re.search(r'class="shape" d="M([\d.]+) ([\d.]+)L', body)  # its top corner, 8 above
        marks[n] = (float(circle[1]), float(circle[2])) if circle else (float(diamond[1]), float(diamond[2]) + 8)
    hits = []
    for x, y, anchor, text in re.findall(r'<text class="(?:callout[^"]*|arrow-label)" x="([\d.]+)" y="([\d.]+)"'
                                         r'(?: text-anchor="(\w+)")?>([^<]*)<', frontier):
        box = _svg_module._text_box(float(x), float(y), html.unescape(text), anchor or "start")
        own = re.search(r"#(\d+)$", text)
        hits += [(text, n) for n, (cx, cy) in marks.items() if (not own or own.group(1) != n)
                 and box[0] < cx + 13 and cx - 13 < box[2] and box[1] < cy + 13 and cy - 13 < box[3]]
    return hits


def test_a_label_never_covers_another_trial_s_marker(page):
    """"best = your config #0" ran over the leader beside it (a CPU sweep of examples/custom), as if #3 were yours."""
    mib = 1024**2
    near = [_trial(0, "ok", 8, "fp32", throughput=123.6, peak=110 * mib, baseline=True),
            _trial(1, "ok", 32, "fp32", throughput=128.4, peak=338 * mib),
            _trial(2, "ok", 64, "fp32", throughput=79.6, peak=497 * mib),
            _trial(3, "ok", 16, "bf16-mixed", throughput=134.4, peak=186 * mib)]
    for row in near:
        row["timing"]["step_s"]["cv"] = 0.06  # the two within each other's noise: your config kept
    frontier = _svg(render_html(near, synthetic_study() | {"budget": None}), "frontier")
    assert ">best = your config #0<" in frontier
    assert _labels_over_marks(frontier) == []
    assert _labels_over_marks(_svg(page, "frontier")) == []  # the speedup arrow's label too


def test_batch_plot_joins_only_trials_that_differ_in_batch_size(page):
    batch = _svg(page, "batch")
    assert "series-line" not in batch  # no two synthetic trials share every other knob: no line at all
    assert batch.count('<g class="dot"') == 7 and ">16<" in batch and ">128<" in batch  # power-of-two ticks
    rows = synthetic_rows() + [_trial(12, "ok", 8, "fp32", throughput=200.0, peak=int(5 * GiB)),
                               _trial(13, "ok", 32, "fp32", throughput=700.0, peak=int(15 * GiB))]
    batch = _svg(render_html(rows, synthetic_study()), "batch")
    lines = re.findall(r'<g class="series" data-family="([^"]+)"[^>]*><title>[^<]*</title><path class="series-line" d="([^"]+)"', batch)
    assert len(lines) == 1  # trials 0, 12, 13: fp32, eager, no checkpointing, accumulation 1
    family, path = lines[0]
    assert "precision=fp32" in family and "compile=off" in family and path.count("L") == 2


def test_baseline_and_best_are_painted_last_in_both_plots(page):
    for cls, mark in (("frontier", '<g class="pt'), ("batch", '<g class="dot"')):
        plot = _svg(page, cls)
        trials = re.findall(re.escape(mark) + r'[^>]*data-trial="(\d+)"', plot)
        assert trials[-2:] == ["3", "0"], (cls, trials)  # best #3, then baseline #0 on top of everything


def test_columns_have_unique_titles_with_units_and_mfu_only_with_a_peak(page):
    titles = re.findall(r"<th [^>]*>([^<]*)</th>", page)
    assert len(titles) == len(set(titles)), titles
    assert {"samples/s", "tokens/s (this run)", "peak memory (GiB)", "TFLOP/s (this run)", "MFU (this run)",
            "step time (ms, this run)", "compile time (s)", "compile"} <= set(titles)
    rows = synthetic_rows()
    for r in rows:
        if r["flops"]:
            r["flops"] = {"tflops": 0.4, "mfu": None}  # a CPU: no nominal peak, so no MFU
    cpu_titles = re.findall(r"<th [^>]*>([^<]*)</th>", render_html(rows, synthetic_study()))
    assert "TFLOP/s (this run)" in cpu_titles and "MFU (this run)" not in cpu_titles
    for r in rows:  # a small model: every peak under a GiB reads in MiB (85.1 and 95.7, not 0.08 and 0.09 GiB)
        if r["peak_memory"]:
            r["peak_memory"] = r["peak_memory"] // 128
    small = render_html(rows, synthetic_study())
    assert "peak memory (MiB)" in re.findall(r"<th [^>]*>([^<]*)</th>", small) and "72.8<" in small


def test_tiles_name_the_objective_unit(page):
    assert "1,335.0 samples/s" in page and "your config 410.0 samples/s" in page  # to the terminal's place
    assert not re.search(r"\d/s", page)  # never "182/s": every rate names what it counts
    tokens = render_html(synthetic_rows(), synthetic_study() | {"objective": "tokens"})
    assert "best tokens/s" in tokens and "683,520.0 tokens/s" in tokens  # 1335 samples/s x 512 tokens
    assert re.findall(r"<th [^>]*>([^<]*)</th>", tokens)[2] == "tokens/s"  # the objective's column first


@pytest.mark.parametrize("workload, label", [
    ({"model": "mymlp:MyMLP", "loss": "mymlp:my_loss", "batch": "mymlp:make_batch"}, "mymlp:MyMLP"),
    ({"lightning": {"model": "charlm:CharLM"}}, "charlm:CharLM"),
    ({"factory": "mypkg.models:build"}, "mypkg.models:build")])
def test_header_names_your_own_model_as_the_sweep_did(workload, label):
    """Only `factory` and `name` were known: your own model, Lightning or HF form read "the workload"."""
    rows = synthetic_rows()
    for r in rows:
        r["workload"] = workload
    assert f"measured: {label} on NVIDIA H100 80GB HBM3" in render_html(rows, synthetic_study())


def test_a_study_whose_every_trial_failed_names_what_it_swept_and_where():
    """"measured: the workload on an unrecorded device", where the sweep had said "faulty:build on cpu":
    no failed trial records the workload or the device, and the study's header holds both."""
    rows = [_trial(n, "error", 8, "fp32", error={"type": "ValueError", "message": "x"}) for n in range(3)]
    for r in rows:
        r.pop("workload", None), r.pop("env", None)
    study = {"name": "errs", "budget": None, "headroom": 0.1, "device": "cpu",
             "workload": {"factory": "faulty:build", "params": {}}}
    page = html.unescape(render_html(rows, study))
    assert "measured: faulty:build on cpu" in page
    assert "No config is best: no memory to break down." in page


def test_header_names_what_was_measured_and_warns_about_another_size(page):
    rows = synthetic_rows()
    for r in rows:
        r["workload"] = {"name": "emberformer", "preset": "cpu", "params": {"d_model": 64}}
    warning = "examples/config.yaml describes d_model 128 but preset cpu measured d_model 64"
    shown = render_html(rows, synthetic_study() | {"warning": warning})
    assert "measured: emberformer preset cpu on NVIDIA H100 80GB HBM3" in shown
    assert f'<p class="size-warning">⚠ {warning}</p>' in shown
    assert "size-warning" not in page.split("<style>")[0] + page.split("</style>")[1]


def test_breakdown_of_the_best_config(page):
    breakdown = _svg(page, "breakdown")
    parts = re.findall(r'data-part="([^"]+)"', breakdown)
    assert parts == ["weights", "gradients", "optimizer", "activations", "other"]
    assert "8.60 GiB" in breakdown and "budget 24.00 GiB" in breakdown


def test_summary_and_table(page):
    assert "3.26×" in page and "6.40 GiB" in page  # headroom left: 24 - 17.6
    assert page.count('<tr class=') == 12
    assert "loss became nan at step 37" in page
    assert "NVIDIA H100 80GB HBM3" in page and "560.35.03" in page


def test_renders_an_empty_study():
    page = render_html([], {"name": "fresh", "budget": None, "headroom": 0.0, "env": {}})
    assert "No trial measured" in page and "<svg" not in page


def test_small_cpu_sized_memory_reads_in_mib_with_round_ticks():
    """It read 0.02 … 0.1 GiB beside a table in MiB."""
    rows = [_trial(0, "ok", 8, "fp32", throughput=55.0, peak=90 * 1024**2, baseline=True, best=True,
                   pareto=True)]
    frontier = _svg(render_html(rows, {"name": "cpu", "budget": None, "headroom": 0.1}), "frontier")
    assert "peak memory (MiB)" in frontier and ">20<" in frontier and ">100<" in frontier
    assert ">0.1<" not in frontier
    assert ">best = your config #0<" in frontier


def test_renders_what_the_study_stores():
    """cli passes study user attrs (no env; workload as a dict) and rows straight from the records."""
    rows = synthetic_rows()[:3]
    rows[0]["tokens_per_s"] = 1234.0  # a bare number is read as the median
    rows[1]["env"] = {"device": "cpu", "host_memory": 16 * GiB, "device_total": 16 * GiB, "driver": None,
                      "cpu_bf16_speedup": 0.5636496711492047, "tf32": {"matmul": "ieee", "cudnn": False}}
    rows[0]["env"] = rows[2]["env"] = None
    rows.append({"number": 3, "status": "running", "throughput": None, "peak_memory": None, "error": None,
                 "config": {"batch_size": 8}, "baseline": False})
    study = {"name": "s", "workload": {"name": "tiny-lm", "size": "s"}, "memory_budget": None,
             "headroom": 0.1, "created": "2026-11-03T14:07:00", "budget": None, "device_total": 16 * GiB}
    page = render_html(rows, study)
    assert "tiny-lm · cpu · 2026-11-03T14:07:00" in page
    assert "<dt>host_memory</dt><dd>16.00 GiB</dd>" in page and "<dt>driver</dt>" not in page
    assert "<dd>0.564</dd>" in page and "<dd>matmul ieee, cudnn False</dd>" in page  # not a raw float, not a dict
    assert ">1,234.0<" in page and ">463,360.0<" in page
    assert 'class="badge st-running"' in page


def test_renders_without_successful_trials():
    rows = [_trial(0, "oom", 64, "fp32"), _trial(1, "crash", 32, "fp32", error=None)]
    page = render_html(rows, {"name": "s", "budget": None, "headroom": 0.1, "env": {}})
    assert "No configuration was measured" in page
    assert len(re.findall(r'<g class="oom"', page)) == 1


# ---- in a real browser --------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--hide-scrollbars"]


def _chromium(tmp_path: Path, *args: str) -> str:
    result = subprocess.run(
        [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def _probed(tmp_path: Path, page: str, probe: str, key: str, window: str):
    """`page` opened in headless Chromium at `window` (WIDTH,HEIGHT) with `probe` put before its end: a
    script that sets document.body.dataset.KEY to JSON, ending "</script></body>"; that JSON, read back."""
    report = tmp_path / f"{key}.html"
    report.write_text(page.replace("</body>", probe))
    dom = _chromium(tmp_path, f"--window-size={window}", "--dump-dom", report.as_uri())
    return json.loads(html.unescape(re.search(rf'data-{key}="([^"]+)"', dom).group(1)))


def _png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the raw scanlines of an 8-bit RGB/RGBA PNG, with only the stdlib."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        header = chunk if kind == b"IHDR" else header
        idat += chunk if kind == b"IDAT" else b""
        pos += 12 + length
    width, height, depth, colour_type = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and colour_type in (2, 6)
    stride = width * (3 if colour_type == 2 else 4) + 1
    raw = zlib.decompress(idat)
    return width, height, [raw[i * stride:(i + 1) * stride] for i in range(height)]


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_report_renders_in_chromium(tmp_path):
    report = tmp_path / "report.html"
    report.write_text(render_html(synthetic_rows(), synthetic_study()))
    dom = _chromium(tmp_path, "--dump-dom", report.as_uri())
    assert len(re.findall(r'<svg class="plot ', dom)) == 3
    assert len(re.findall(r'<g class="pt', dom)) == 8
    assert len(re.findall(r'<g class="oom"', dom)) == 2
    assert 'class="pareto-front"' in dom
    assert len(re.findall(r"<tr class=", dom)) == 12
    assert 'class="measured"' in dom

    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2400", report.as_uri())
    width, height, lines = _png_pixels(shot)
    assert (width, height) == (1280, 2400)
    # Not blank: scanlines (PNG filter byte included) differ, and many distinct ones exist.
    assert len(set(lines)) > height // 4


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_clicking_a_header_sorts_numerically(tmp_path):
    page = render_html(synthetic_rows(), synthetic_study())
    # Click "#" twice (ascending, then descending) the way a person would, then read the DOM back.
    click = ("<script>const th=[...document.querySelectorAll('th')].find(h=>h.textContent==='#');"
             "th.click();th.click();</script></body>")
    report = tmp_path / "sorted.html"
    report.write_text(page.replace("</body>", click))
    dom = _chromium(tmp_path, "--dump-dom", report.as_uri())
    order = [int(n) for n in re.findall(r'<tr class="[^"]*" data-trial="(\d+)"', dom)]
    assert order == sorted(order, reverse=True) and len(order) == 12


def test_device_memory_is_not_called_a_budget():
    rows = synthetic_rows()
    rows[3]["memory"]["device_total"] = 16 * GiB  # without a budget, capacity is the device the trials saw
    page = render_html(rows, {"name": "s", "headroom": 0.1})
    assert "device memory 16.00 GiB" in page
    assert "budget 16.00 GiB" not in page and "16.00 GiB budget" not in page


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_the_baseline_is_on_top_where_another_trial_overlaps_it(tmp_path):
    """The point the browser hits at the baseline's centre is the baseline, even under another trial's ring."""
    rows = synthetic_rows()
    twin = _trial(12, "ok", 16, "fp32", checkpointing="full", throughput=411.0, peak=int(9.12 * GiB))
    page = render_html(rows + [twin], synthetic_study())  # painted after the baseline in trial order
    probe = ("<script>const hits={};for(const g of document.querySelectorAll('g.pt.baseline, g.pt[data-trial=\\'12\\']')){"
             "const r=g.querySelector('.shape').getBoundingClientRect();"
             "const top=document.elementFromPoint(r.x+r.width/2,r.y+r.height/2).closest('g.pt');"
             "hits[g.dataset.trial]=top&&top.dataset.trial;}"
             "document.body.dataset.hits=JSON.stringify(hits);</script></body>")
    report = tmp_path / "overlap.html"
    report.write_text(page.replace("</body>", probe))
    dom = _chromium(tmp_path, "--window-size=1400,2400", "--dump-dom", report.as_uri())
    hits = re.search(r'data-hits="([^"]+)"', dom).group(1).replace("&quot;", '"')
    assert '"0":"0"' in hits, hits  # at the baseline's centre, the baseline is what one sees


def confirmed_rows() -> list[dict]:
    """The synthetic sweep with the confirmation runs a real sweep makes: best #3 and the baseline
    three times each; #3's median (1335) is not its first run, and a single run (#1) is noisy."""
    rows = synthetic_rows()
    rows[3]["throughput"] = 1420.0  # a lucky first run: the median of 1420, 1301, 1335 is 1335
    rows[3]["repeats"] = [{"status": "ok", "throughput": 1301.0}, {"status": "ok", "throughput": 1335.0}]
    rows[0]["repeats"] = [{"status": "ok", "throughput": 402.0}, {"status": "ok", "throughput": 418.0}]
    rows[1]["timing"]["step_s"]["cv"] = 0.8  # its windows disagree: noisy, not ranked
    rows[5]["busy"] = {"load1": 3.4, "cores": 2, "steal": 0.0, "gpu_processes": 1}
    return rows


def test_a_busy_confirmation_run_is_named_as_one_in_the_story(tmp_path):
    """The count read "busy during 2 of 12 trials: #0, #5" with #0's trial run quiet, and the worst
    load shown was never a confirmation run's."""
    rows = confirmed_rows()
    rows[0]["repeats"][1]["busy"] = {"load1": 7.5, "cores": 2, "steal": 0.0, "gpu_processes": 0}
    page = render_html(rows, synthetic_study())
    story = html.unescape(" ".join(re.sub(r"<[^>]+>", " ", re.search(r'<ul class="story">(.*?)</ul>', page, re.S).group(1)).split()))
    assert "the machine was busy during 2 of 12 trials: #0 (in confirmation), #5; at worst load 7.5 on 2 cores" in story


def test_a_confirmed_figure_shows_the_spread_of_its_runs_as_the_table_does():
    """Three runs 45% apart read as ±5% on the page: it showed only the step time's spread of the trial's
    own run, never the runs' spread (`± cv` in the table) the choice weighed."""
    rows = confirmed_rows()
    choice = choose(rows, synthetic_study())
    best = next(s for s in choice.rows if s.number == 3)
    page = render_html(rows, synthetic_study())
    cell = re.search(r'<td[^>]*>1,335\.0 <span class="minor">×3</span>(.*?)</td>', page).group(1)
    assert cell == f' <span class="minor">±{best.cv:.0%}</span>' and best.cv > 0.04  # 1420, 1301, 1335: 4.6%


def test_the_story_at_the_top_states_the_choice(tmp_path):
    page = render_html(confirmed_rows(), synthetic_study())
    story = re.sub(r"<[^>]+>", " ", re.search(r'<ul class="story">(.*?)</ul>', page, re.S).group(1))
    story = html.unescape(" ".join(story.split()))
    # the rounds side by side, 1301/402 and 1335/418, have a median (in logs) of 3.215: 3.21
    assert "trial #3 against your config (#0): 3.21× the samples/s, ± 0.03 over 2 runs each side by side: beyond the noise" in story
    assert "trial #3's 1335.0 samples/s is the median of 3 runs (its trial and 2 confirmation runs)" in story
    assert "the machine was busy during 1 of 12 trials: #5" in story
    assert "noisy" in story and "#1" in story
    assert "next: run `bench sweep` again when the machine is quiet" in story
    assert "1,335.0 samples/s" in page and "1,420" not in page  # the confirmed median, never the lucky first run


def test_a_best_that_fit_only_through_allocator_retries_is_said_in_the_story_of_every_view():
    rows = confirmed_rows()
    assert not any("memory wall" in line for line in report.story(choose(rows, synthetic_study())))
    rows[3]["memory"] = {**rows[3].get("memory", {}), "alloc_retries": 21}  # #3 is the best
    said = "trial #3 ran at the memory wall: the CUDA allocator freed its cache and retried 21 times"
    assert any(said in line for line in report.story(choose(rows, synthetic_study())))
    assert said in html.unescape(render_html(rows, synthetic_study()))


def test_no_ranked_point_lies_above_the_staircase():
    frontier = _svg(render_html(confirmed_rows(), synthetic_study()), "frontier")
    path = re.search(r'<path class="pareto-front" d="([^"]+)"', frontier).group(1)
    steps = [(float(x), float(y)) for x, y in re.findall(r"[MH]([\d.]+)(?:\s|V)([\d.]+)", path)]
    points = re.findall(r'<g class="pt([^"]*)" data-trial="(\d+)">.*?<(?:circle|path) class="shape" '
                        r'(?:cx="([\d.]+)" cy="([\d.]+)"|d="M([\d.]+) ([\d.]+))', frontier, re.S)
    assert steps and len(points) == 8
    for classes, number, cx, cy, px, py in points:
        x, y = (float(cx), float(cy)) if cx else (float(px), float(py) + 8)  # a diamond's path starts 8 above
        reach = [sy for sx, sy in steps if sx <= x + 0.01]  # the staircase's height at x (SVG y grows down)
        if " pareto" in classes:
            assert reach and min(reach) == pytest.approx(y, abs=0.11), number
        elif reach and not any(flag in classes for flag in ("noisy", "unsafe", "diverged")):
            assert y >= min(reach) - 0.11, number


def test_the_terminal_table_of_a_gpu_sized_study_shows_an_oom_without_a_peak():
    """GiB-sized peaks beside an OOM: the first H200 sweep's `bench report` crashed on exactly this."""
    buf = io.StringIO()
    table = report.table(choose(synthetic_rows(), synthetic_study()), synthetic_study(), None)
    Console(file=buf, width=1 << 12).print(table)
    assert "peak GiB" in buf.getvalue() and "17.60" in buf.getvalue()
    oom = next(line for line in buf.getvalue().splitlines() if re.match(r"[│\s]*7\s", line))
    assert "oom" in oom and "26.30" not in oom  # an OOM's peak is not a measurement of the config


def test_the_pages_table_shows_the_peaks_the_terminals_does_in_the_same_unit():
    """The terminal left an OOM's peak out ("not a measurement of the config") while the page's table showed
    it, 26.30 GiB; and the page chose GiB for its column from those peaks too: a small model's measured
    peaks of 72.8 MiB read 0.07 GiB on the page beside a CPU trial that went over its budget, MiB in the
    terminal."""
    def cells(page: str, number: int) -> list[str]:
        row = re.search(rf'<tr class="[^"]*" data-trial="{number}">(.*?)</tr>', page).group(1)
        return re.findall(r"<td[^>]*>(.*?)</td>", row)
    page = render_html(synthetic_rows(), synthetic_study())
    column = re.findall(r"<th [^>]*>([^<]*)</th>", page).index("peak memory (GiB)")
    assert cells(page, 7)[column] == "" and cells(page, 3)[column] == "17.60"
    rows = synthetic_rows()
    for r in rows:  # a small model on a CPU, whose trial 7 went over the budget after its steps (OverBudget)
        if r["peak_memory"] and r["status"] != "oom":
            r["peak_memory"] = r["peak_memory"] // 128
    buf = io.StringIO()
    Console(file=buf, width=1 << 12).print(report.table(choose(rows, synthetic_study()), synthetic_study(), None))
    small = render_html(rows, synthetic_study())
    assert "peak MiB" in buf.getvalue() and "peak memory (MiB)" in re.findall(r"<th [^>]*>([^<]*)</th>", small)
    column = re.findall(r"<th [^>]*>([^<]*)</th>", small).index("peak memory (MiB)")
    assert cells(small, 0)[column] == "72.8" and cells(small, 7)[column] == ""


@pytest.mark.parametrize("objective", ["samples", "tokens"])
def test_a_trial_over_the_budget_shows_no_rate_in_the_pages_other_rate_column(objective):
    """A CPU trial over its budget (OverBudget) is `oom` and keeps the rates it measured: the terminal and the
    objective's column show none (Record.rate: a speed the budget does not allow), but the page's other
    column, "samples/s (this run)" or "tokens/s (this run)", read the record's raw figure and showed it."""
    rows = synthetic_rows()
    rows[7].update(throughput=777.0, tokens_per_s={"median": 777.0 * 512}, error={
        "type": "OverBudget", "message": "peak 26.3 GiB over the 24.0 GiB budget"})
    page = render_html(rows, synthetic_study() | {"objective": objective})
    trial = re.search(r'<tr class="[^"]*" data-trial="7">(.*?)</tr>', page).group(1)
    assert "777" not in trial and "397,824" not in trial, trial
    other = re.search(r'<tr class="[^"]*" data-trial="1">(.*?)</tr>', page).group(1)
    assert ("463,360.0" if objective == "samples" else "905.0") in other  # a measured trial's other rate stays


def test_a_small_peak_beside_gib_sized_ones_and_a_slow_rate_do_not_read_as_zero():
    rows = synthetic_rows()
    rows[4]["peak_memory"], rows[4]["throughput"] = 3 * 2**20, 0.04  # 3 MiB read "0.00" GiB, 0.04/s "0.0"
    buf = io.StringIO()
    Console(file=buf, width=1 << 12).print(report.table(choose(rows, synthetic_study()), synthetic_study(), None))
    line = next(line for line in buf.getvalue().splitlines() if re.match(r"[│\s]*4\s", line))
    assert "0.0029" in line and "0.04" in line and "0.00 " not in line
    page = render_html(rows, synthetic_study())
    assert 'data-v="3145728">0.0029<' in page


@pytest.mark.parametrize("top, labels", [(12.32, ["0", "2.5", "5", "7.5", "10", "12.5"]),
                                         (12_320, ["0", "2,500", "5,000", "7,500", "10k", "12.5k"])])
def test_axis_ticks_of_a_2_5_step_are_labelled_as_they_are(top, labels):
    from harness.report._svg import _nice_axis, _tick_label
    assert [_tick_label(t) for t in _nice_axis(top)[1]] == labels  # were 12 and 12k at 12.5 and 12,500


def test_predictions_get_their_own_card_apart_from_the_measured_table_and_compile_is_weighed():
    rows = synthetic_rows()
    unmeasured = {"batch_size": 96, "accumulation": 1, "precision": "bf16-mixed", "checkpointing": "full",
                  "compile": "default"}
    model = {"why": "checkpointing=full lets batch 128 fit: +3% over the best without it (#2)",
             "predicted": [{"config": unmeasured, "speed": 1401.5, "speed_sd": 0.08, "peak_memory": 15.5 * GiB,
                            "fit_chance": 0.93, "beat_chance": 0.41}]}
    choice = dataclasses.replace(choose(rows, synthetic_study()), model=model)
    page = html.unescape(report.render_html(choice, synthetic_study()))
    story = page.split('<ul class="story">')[1].split("</ul>")[0]
    assert f"why best: {model['why']}" in story
    assert "compile: trial 3 spent 41.5s compiling" in story  # the terminal's payback line, in the story
    card = page.split("Predicted, not measured")[1].split("</section>")[0]
    assert "~1,401.5" in card and "×1.08" in card and "~15.50 GiB" in card and "93%" in card and "41%" in card
    assert "<b>batch_size</b> 96" in card
    trials = page.split('class="trials sortable"')[1].split("</table>")[0]
    assert "1,402" not in trials and trials.count("<tr ") == len(rows)  # never a row of the measured table
    from harness.report import _terminal  # the terminal's line: chances, not "beats best 41%" (read as +41%)
    said = " ".join(" ".join(_terminal.model_lines(choice)).split())
    assert "93% chance it fits, 41% chance it beats best" in said, said
    kept = dataclasses.replace(choice, best=choice.baseline)  # a tie keeps your config: the chance is against the leader
    assert kept.kept and kept.leader is not kept.baseline
    leader = f"the leader (#{kept.leader.number})"
    assert f"41% chance it beats {leader}" in " ".join(" ".join(_terminal.model_lines(kept)).split())
    assert f"chance it beats {leader}" in html.unescape(report.render_html(kept, synthetic_study()))


def test_no_predictions_no_card():
    page = render_html(synthetic_rows(), synthetic_study())
    assert "Predicted, not measured" not in page


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_a_long_environment_string_wraps_instead_of_widening_a_narrow_page(tmp_path):
    """An audit's page on a phone-wide window: a CPU name with its flags widened the Environment card's
    grid past the window, and the whole page scrolled sideways (only the trials table is meant to)."""
    study = synthetic_study()
    study["env"]["cpu"] = "Intel(R)_Xeon(R)_Platinum_8480+_flags_avx512f,avx512dq,avx512cd,avx512bw,avx512vl,amx_tile,amx_bf16"
    probe = ("<script>const w=window.innerWidth;const wide=[...document.querySelectorAll('main *')]"
             ".filter(e=>e.getBoundingClientRect().right>w+1&&!e.closest('.table-wrap, .plot-wrap')).map(e=>e.tagName);"
             "document.body.dataset.wide=JSON.stringify([w,document.documentElement.scrollWidth,wide]);</script></body>")
    width, scrolled, wide = _probed(tmp_path, render_html(synthetic_rows(), study), probe, "wide", "400,2400")
    assert scrolled == width and wide == [], (width, scrolled, wide)


def test_the_batch_plot_draws_a_noisy_trial_hollow_and_off_its_familys_line():
    """The frontier plot drew a noisy trial hollow (not ranked) and the batch plot drew it filled, on its
    family's line, as if its figure were a point of that curve."""
    rows = synthetic_rows() + [_trial(12, "ok", 8, "fp32", throughput=200.0, peak=int(5 * GiB)),
                               _trial(13, "ok", 32, "fp32", throughput=900.0, peak=int(15 * GiB))]
    rows[-1]["timing"]["step_s"]["cv"] = 0.8  # its windows disagree: noisy
    batch = _svg(render_html(rows, synthetic_study()), "batch")
    assert re.search(r'<g class="dot hollow" data-trial="13">', batch)
    assert not re.search(r'<g class="dot hollow" data-trial="(0|12)">', batch)
    (path,) = re.findall(r'<path class="series-line" d="([^"]+)"', batch)
    assert path.count("L") == 1  # trials 0 and 12 only: fp32, eager, no checkpointing, accumulation 1
    assert "hollow: noisy or unsafe (not ranked)" in render_html(rows, synthetic_study())


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_the_limit_lines_labels_keep_clear_of_the_callouts(tmp_path):
    """A second audit's page: "10% headroom: 27.9 MiB", written down its line from the top, ran under
    "baseline #0" and the speedup arrow's "0.51× ± 0.02" (your config just over the headroom line).
    Measured in the browser: no limit label shares a pixel with a callout or the arrow's label."""
    MiB = 2**20
    rows = [_trial(0, "ok", 16, "fp32", throughput=2273.1, peak=int(29.4 * MiB), baseline=True),
            _trial(1, "ok", 4, "fp32", throughput=1303.7, peak=int(25.5 * MiB))]
    study = {"name": "m-head", "budget": 31 * MiB, "headroom": 0.1, "env": {}}
    probe = ("<script>const box=e=>e.getBoundingClientRect();"
             "const hit=(a,b)=>a.left<b.right&&b.left<a.right&&a.top<b.bottom&&b.top<a.bottom;"
             "const limits=[...document.querySelectorAll('svg.frontier .limit text')].map(box);"
             "const labels=[...document.querySelectorAll('svg.frontier .callout, svg.frontier .arrow-label')].map(box);"
             "document.body.dataset.hits=JSON.stringify([limits.length,labels.length,"
             "limits.flatMap(l=>labels.filter(c=>hit(l,c))).length]);</script></body>")
    limits, labels, hits = _probed(tmp_path, render_html(rows, study), probe, "hits", "1280,2400")
    assert (limits, labels, hits) == (2, 3, 0)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_the_limit_lines_labels_are_not_struck_through_by_the_staircase_or_an_oom(tmp_path):
    """The staircase runs on to the right edge at the best's height, so a limit line right of the best
    had its label, written down from the top, struck through on every such page; and a label moved to
    the floor sat on an OOM's cross there. Measured in the browser: no point of a limit label's box is
    on the front's stroke, and no label's box meets a cross."""
    probe = ("<script>const svg=document.querySelector('svg.frontier');const inv=svg.getScreenCTM().inverse();"
             "const front=svg.querySelector('.pareto-front');const hit=(a,b)=>a.left<b.right&&b.left<a.right&&"
             "a.top<b.bottom&&b.top<a.bottom;const crosses=[...svg.querySelectorAll('.oom path')].map(e=>e.getBoundingClientRect());"
             "const struck=[...svg.querySelectorAll('.limit text')].map(t=>{const r=t.getBoundingClientRect();let n=0;"
             "for(let y=r.top;y<=r.bottom;y+=0.5)for(let j=0;j<=8;j++){const p=new DOMPoint(r.left+r.width*j/8,y)"
             ".matrixTransform(inv);if(front.isPointInStroke(p))n++;}return [n,crosses.filter(c=>hit(r,c)).length];});"
             "document.body.dataset.struck=JSON.stringify(struck);</script></body>")
    struck = _probed(tmp_path, render_html(synthetic_rows(), synthetic_study()), probe, "struck", "1280,2400")
    assert struck == [[0, 0], [0, 0]], struck  # the headroom's label and the budget's


def test_every_tooltip_names_the_objectives_unit_and_an_oom_has_no_rate():
    """A tokens/s study's batch plot said "660,480.0 samples/s" on hover (its tooltips were always
    samples/s), and every OOM's tooltip read "- samples/s, peak 26.30 GiB" in both plots."""
    page = render_html(synthetic_rows(), synthetic_study() | {"objective": "tokens"})
    for cls in ("frontier", "batch"):
        titles = [html.unescape(t) for t in re.findall(r"<title>(.*?)</title>", _svg(page, cls), re.S)]
        assert titles and not any("samples/s" in t for t in titles), (cls, titles)
        assert any("660,480.0 tokens/s" in t for t in titles), (cls, titles)
        ooms = [t for t in titles if " oom: " in t]
        assert len(ooms) == 2 and not any("- " in t or "peak" in t for t in ooms), (cls, ooms)
    assert "#7 oom: out of memory at 26.30 GiB" in html.unescape(_svg(page, "frontier"))


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_a_long_study_name_and_config_value_wrap_instead_of_widening_a_narrow_page(tmp_path):
    """On a phone-wide window a study name with no spaces ("emberformer_h100_bf16_compile_sweep_v2") ran
    off the header's right edge, and a factory param's path ran out of the best config's chips in the
    hero and the tier cards: the whole page scrolled sideways."""
    rows = synthetic_rows()
    rows[3]["config"]["data_path"] = "/datasets/emberformer/shards/imagenet_train_shard_manifest_v3_deduplicated.jsonl"
    study = synthetic_study() | {"name": "emberformer_h100_bf16_compile_sweep_v2"}
    probe = ("<script>const w=window.innerWidth;const wide=[...document.querySelectorAll('main *')]"
             ".filter(e=>e.getBoundingClientRect().right>w+1&&!e.closest('.table-wrap, .plot-wrap')).map(e=>e.className||e.tagName);"
             "document.body.dataset.wide=JSON.stringify([w,document.documentElement.scrollWidth,[...new Set(wide)]]);"
             "</script></body>")
    width, scrolled, wide = _probed(tmp_path, render_html(rows, study), probe, "wide", "400,2400")
    assert scrolled == width and wide == [], (width, scrolled, wide)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_on_a_narrow_window_plots_keep_readable_labels_and_chips_stay_whole(tmp_path):
    """At 400 px the plots shrank through their viewBox until a tick label was 4 px high, and the predicted
    configs' chips broke mid-word ("batc h_si ze 4"). Measured in the browser: every tick label at least
    8 px high (its box scrolls sideways instead), every chip one line."""
    rows = synthetic_rows()
    unmeasured = {"batch_size": 96, "accumulation": 1, "precision": "bf16-mixed", "checkpointing": "full",
                  "compile": "default"}
    model = {"predicted": [{"config": unmeasured, "speed": 1401.5, "speed_sd": 0.08, "peak_memory": 15.5 * GiB,
                            "fit_chance": 0.93, "beat_chance": 0.41}]}
    choice = dataclasses.replace(choose(rows, synthetic_study()), model=model)
    probe = ("<script>const ticks=[...document.querySelectorAll('svg.plot .tick')].map(t=>t.getBoundingClientRect().height);"
             "const chips=[...document.querySelectorAll('.predicted .kv')].map(c=>c.getClientRects().length===1"
             "&&c.getBoundingClientRect().height<2*parseFloat(getComputedStyle(c).lineHeight||16));"
             "document.body.dataset.narrow=JSON.stringify([Math.min(...ticks),ticks.length,chips]);</script></body>")
    smallest, ticks, chips = _probed(tmp_path, report.render_html(choice, synthetic_study()), probe, "narrow", "400,2400")
    assert ticks > 10 and smallest >= 8, (smallest, ticks)
    assert len(chips) == len(unmeasured) and all(chips), chips


def test_a_skipped_trial_says_why_in_the_table_as_the_terminal_does():
    """The terminal says "skipped #12 ...: <reason> (inferred from trial 11); not measured"; the page's
    row for it had a bare "skipped" badge and an empty notes cell."""
    rows = synthetic_rows() + [_trial(12, "skipped", 512, "fp32", "max-autotune", error=None,
                                      skip={"reason": "a smaller batch of its family ran out of memory", "from": [11]})]
    page = render_html(rows, synthetic_study())
    row = re.search(r'<tr class="" data-trial="12">.*?</tr>', page, re.S).group(0)
    assert "a smaller batch of its family ran out of memory (inferred from trial 11); not measured" in html.unescape(row)


def test_many_ooms_at_one_spot_stay_on_the_floor_and_are_counted():
    """Thirty OOMs without a recorded size sit at the budget, stacked 16 px apart: the column of crosses
    climbed past 1,500 samples/s and out of the plot, read as measurements on the way, and struck
    through the budget's label; the batch plot's stack at one batch size climbed the same way."""
    rows = synthetic_rows() + [_trial(12 + i, "oom", 512, "bf16-mixed",
                                      error={"type": "OutOfMemoryError", "message": "CUDA out of memory"})
                               for i in range(30)]
    page = render_html(rows, synthetic_study())
    for cls, height, half in (("frontier", 440, 6), ("batch", 360, 4.5)):
        svg = _svg(page, cls)
        bottom, top = height - 52, 22
        ys = [float(y) + half for y in re.findall(r'<g class="oom[^"]*"[^>]*>(?:<title>.*?</title>)<path d="M-?[\d.]+ (-?[\d.]+)L',
                                                      svg, re.S)]
        assert len(ys) == 32, (cls, len(ys))
        assert all(bottom - (bottom - top) / 4 <= y <= bottom for y in ys), (cls, min(ys))
    assert ">31 OOMs<" in _svg(page, "frontier") and ">30 OOMs<" in _svg(page, "batch")
    assert "OOMs<" not in _svg(render_html(synthetic_rows(), synthetic_study()), "frontier")  # a few: countable as they are


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="headless browser test needs `chromium` on PATH")
def test_the_tables_header_stays_in_view_down_a_long_table(tmp_path):
    """The header is sticky in the CSS, but its table sat in a wrapper that scrolls sideways, which
    made the wrapper the sticky box: 150 rows down, the columns had no titles in view."""
    rows = [_trial(n, "ok", 8 * (1 + n % 8), "fp32", throughput=100.0 + n, peak=int((2 + n % 8) * GiB),
                   baseline=n == 0) for n in range(150)]
    probe = ("<script>addEventListener('load',()=>{const t=document.querySelector('table.trials');"
             "const row=t.tBodies[0].rows[120];row.scrollIntoView({block:'center'});"
             "const th=t.querySelector('th').getBoundingClientRect(),r=row.getBoundingClientRect();"
             "document.body.dataset.seen=JSON.stringify([th.top>=-1&&th.bottom<=r.top,"
             "document.documentElement.scrollWidth===innerWidth]);});</script></body>")
    header_in_view, no_sideways = _probed(tmp_path, render_html(rows, synthetic_study()), probe, "seen", "1280,900")
    assert header_in_view and no_sideways


def test_the_frontier_legend_names_only_colours_its_marks_use():
    """Every OOM's cross is red whatever its precision, yet the legend listed a colour for each OOM's
    precision: a study where only OOMs ran had a legend of fp32 and bf16-mixed dots for no dot at all."""
    rows = [_trial(0, "oom", 64, "fp32", peak=int(30 * GiB), baseline=True), _trial(1, "oom", 32, "bf16-mixed")]
    frontier = render_html(rows, synthetic_study()).split('<svg class="plot frontier"', 1)[1].split("</section>", 1)[0]
    legend = re.search(r'<div class="legend">(.*?)</div>', frontier, re.S).group(1)
    assert "out of memory" in legend and "fp32" not in legend and "bf16-mixed" not in legend, legend


def test_a_long_story_keeps_the_figures_near_the_top():
    """150 trials, one story line per compile that does not pay back: the tiles with the figures began
    3,800 px down the page, under 157 lines."""
    rows = synthetic_rows() + [_trial(n, "ok", 16 + n, "fp32", "default", throughput=300.0 + n, peak=int(2 * GiB),
                                      timing={"compile_s": 900.0, "first_step_s": 1.0,
                                              "step_s": {"median": 0.05, "cv": 0.01}})
                               for n in range(12, 40)]
    story = re.search(r'<ul class="story">(.*?)</ul><div class="stats">', render_html(rows, synthetic_study()), re.S)
    assert story, "the figures come right after the story"
    shown, folded = story.group(1).split("<details", 1)
    assert shown.count("<li>") <= html_module.STORY_LINES < story.group(1).count("<li>")
    assert re.search(r"<summary>\d+ more lines?</summary>", folded)


def test_tiers_that_name_one_trial_share_a_card(page):
    """Three identical cards (safe, balanced, aggressive: one trial) where the terminal could say it once."""
    assert page.count('<div class="tier">') == 1 and '<div class="label">safe · balanced · aggressive · #3</div>' in page
    rows = [_trial(0, "ok", 16, "fp32", throughput=410.0, peak=int(2 * GiB), baseline=True),
            _trial(1, "ok", 32, "fp32", throughput=800.0, peak=int(17 * GiB)),
            _trial(2, "ok", 64, "fp32", throughput=900.0, peak=int(22 * GiB))]  # within 5% of 24 GiB only
    two = render_html(rows, synthetic_study())
    labels = re.findall(r'<div class="tier"><div class="label">([^<]*)</div>', two)
    assert labels == ["safe · balanced · #1", "aggressive · #2"], labels
