"""How a trial reads in the HTML report, shared by the page (harness.report_html) and its plots
(harness.report_svg): escaping, rates rounded for people, configs in the order people think about
them. Every string that came from the user goes through `esc`.
"""
from __future__ import annotations

import html

# Config keys shown first (chips, table columns, tooltips), in the order people think about them.
KNOB_ORDER = ("batch_size", "accumulation", "precision", "checkpointing", "compile")


def esc(value: object) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def rate(value: float | None) -> str:
    """Three significant digits or so, whatever the magnitude: 12,345 / 123 / 12.3 / 1.23 / 0.0123."""
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.1f}" if value >= 10 else f"{value:.2f}"
    return f"{value:.3g}"


def ordered(config: dict) -> list[tuple[str, object]]:
    return sorted(config.items(), key=lambda kv: (knob_rank(kv[0]), kv[0]))


def knob_rank(key: str) -> int:
    return KNOB_ORDER.index(key) if key in KNOB_ORDER else len(KNOB_ORDER)
