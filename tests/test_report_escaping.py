"""What the user named is shown as written: rich markup in a knob value or a study name is text, and
`report --format json` is strict JSON (a diverged trial's non-finite loss is null, not a bare NaN)."""
from __future__ import annotations

import json

from click.testing import CliRunner

from harness.cli import main
from tests.conftest import faulty_spec


def strict(text: str):
    def refuse(constant):
        raise ValueError(f"bare {constant} in JSON")
    return json.loads(text, parse_constant=refuse)


def test_markup_in_names_and_values_is_text_and_json_is_strict(faulty_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = faulty_spec(tmp_path, "a[bold]b", ["none", "[/x]", "inf"], sampler="grid")
    runner = CliRunner()
    swept = runner.invoke(main, ["sweep", str(path), "--device", "cpu"], catch_exceptions=False)
    assert swept.exit_code == 0, swept.output
    assert "bench sweep a[bold]b:" in swept.stdout
    table = runner.invoke(main, ["report", "a[bold]b"], catch_exceptions=False)
    assert table.exit_code == 0, table.output  # before: rich.errors.MarkupError on `[/x]`
    assert "study a[bold]b:" in table.stdout and "[/x]" in table.stdout
    rows = strict(runner.invoke(main, ["report", "a[bold]b", "--format", "json"]).stdout)
    assert {r["config"]["fault"]: r["status"] for r in rows} == {"none": "ok", "[/x]": "ok", "inf": "diverged"}
