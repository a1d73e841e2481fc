"""How a trial reads in the HTML report, shared by the page (`_html`) and its plots
(`_svg`): escaping, rates spelt as the terminal spells them, configs in the order people think about
them. Every string that came from the user goes through `esc`.
"""
from __future__ import annotations

import html

from harness.knobs import rank
from harness.units import fixed


def esc(value: object) -> str:
    """Escape anything for HTML text or a quoted attribute."""
    return html.escape(str(value), quote=True)


def rate(value: float | None) -> str:
    """A speed to the place the terminal, the story and `bench apply` print it (104.7, not 105), its
    thousands grouped for the eye (683,520.0)."""
    if value is None:
        return "-"
    return f"{value:,.1f}" if abs(value) >= 1 else fixed(value, 1)


def ordered(config: dict) -> list[tuple[str, object]]:
    return sorted(config.items(), key=lambda kv: (rank(kv[0]), kv[0]))
