"""`bench report`: what a study measured, for people and for pipelines.

Every view shows the one harness.pareto.Choice it is handed (`annotate` computes it from the study's
records): the same best, speedup, tie and marks in the terminal, the HTML page, JSON and CSV.

Inside, one module per view, each importing only the ones before it:
`_format` (escaping, rates, knob order) -> `_time` (where a sweep's time went) -> `_terminal` (the
rich table and summary, the story's sentences, JSON, CSV, the pandas rows) -> `_svg` (the page's
plots) -> `_html` (the self-contained page).
"""
from __future__ import annotations

from harness.report._html import render_html
from harness.report._terminal import (annotate, cut_short, describe, flat, headline, model_lines, next_step, spoiled, stayed_noisy,
                                      story, summary, table, to_csv, to_json)
from harness.report._time import duration, trial_phases

__all__ = ["annotate", "cut_short", "describe", "duration", "flat", "headline", "model_lines", "next_step", "render_html", "spoiled", "stayed_noisy", "story",
           "summary", "table", "to_csv", "to_json", "trial_phases"]
