"""How a trial reads in the HTML report, shared by the page (`_html`) and its plots
(`_svg`): escaping, rates rounded for people, configs in the order people think about
them. Every string that came from the user goes through `esc`.
"""
from __future__ import annotations

import html

from harness.knobs import rank

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
    return sorted(config.items(), key=lambda kv: (rank(kv[0]), kv[0]))
