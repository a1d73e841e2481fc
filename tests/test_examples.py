"""Every shipped sweep spec validates (each scenario too) and runs one real trial on CPU through the CLI."""
import json

import pytest
from click.testing import CliRunner

from harness import apply, spec as specs
from harness.cli import main
from tests.conftest import ROOT

SPECS = sorted((ROOT / "sweeps").glob("*.yaml"))


def test_every_built_in_workload_ships_a_spec():
    from harness.workloads import WORKLOADS
    assert {p.stem for p in SPECS} >= set(WORKLOADS)


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_and_its_scenarios_validate_and_read_their_target(path):
    spec = specs.load(path)
    for name in (None, *spec.scenarios):
        loaded = specs.load(path, name)
        assert loaded.space_size() >= 2
        assert loaded.apply is not None and loaded.apply.file.exists(), loaded.apply
        current = apply.read_current(loaded.apply)
        assert "batch_size" in current, f"{path.name} {name}: the example config must hold the batch size"


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_spec_runs_one_trial_on_cpu(path):
    result = CliRunner().invoke(main, ["trial", str(path), "--preset", "tiny", "--device", "cpu", "--timeout", "120s"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)  # stdout is the JSON; notes go to stderr
    assert record["status"] == "ok", record.get("error")
    assert record["throughput"] > 0 and record["peak_memory"] > 0
