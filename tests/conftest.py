"""Shared fixtures: tiny real specs in a temp folder, the test-only fault workload, a GPU marker."""
import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from harness import pareto

ROOT = Path(__file__).resolve().parents[1]
FAULTY_DIR = ROOT / "tests" / "workloads"
# A pristine copy of examples/emberformer/config.yaml: the README's quickstart rewrites the working
# tree's copy (`bench apply best`), and the tests must not depend on whether a user ran it.
EMBERFORMER_CONFIG = ROOT / "tests" / "data" / "projects" / "emberformer-config.yaml"

# The suite must pass on a machine others are using: a sweep here never waits for quiet, nor measures again what load spoiled (it still
# looks, and says so); tests/test_busy.py sets the wait where it tests it.
os.environ.setdefault("BENCH_QUIET_WAIT", "0")

# Each pytest-xdist worker is a machine of its own: its own cores (its trials inherit them, so one
# worker's trials never take CPU time from the other's, whose windows would then disagree), and its own
# temp folder, where bench keeps its per-device trial lock and its trial folders, which tests look for
# (a killed trial's folder, the weights a trial never touched). Once per worker: test modules import
# this file again as tests.conftest. The folder is readable by all, as /tmp is: a test's PostgreSQL
# server runs as the postgres user in a folder under it.
if (worker := os.environ.get("PYTEST_XDIST_WORKER")) and "BENCH_TESTS_TMPDIR" not in os.environ:
    cores, workers = sorted(os.sched_getaffinity(0)), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if len(cores) >= workers:
        os.environ["BENCH_TESTS_ALL_CORES"] = ",".join(map(str, cores))  # for tests/fixture all_cores
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % workers::workers])
    os.environ["TMPDIR"] = os.environ["BENCH_TESTS_TMPDIR"] = tempfile.tempdir = \
        tempfile.mkdtemp(prefix=f"bench-tests-{worker}-")
    os.chmod(tempfile.tempdir, 0o755)
    atexit.register(shutil.rmtree, tempfile.tempdir, ignore_errors=True)

# Fast measurement: real steps, but only as many as the harness needs to produce its figures.
# What `bench apply best` says when a busy machine left every trial noisy (a loaded CI box can): one line, exit 2
NOISE_REFUSAL = pareto.BUSY_NOISE
FAST_TRIAL = {"timeout": "60s", "stall": "20s", "warmup_steps": 1, "window": 0.05, "min_windows": 2,
              "max_windows": 3, "max_seconds": 1}


def gpu_count() -> int:
    try:
        import pynvml
        pynvml.nvmlInit()
        return pynvml.nvmlDeviceGetCount()
    except Exception:
        return 0


def has_cuda() -> bool:
    return gpu_count() > 0


def tree_state(folder: Path) -> dict:
    """path -> (size, mtime) of every file under folder: enough to see a test write there."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="session", autouse=True)
def working_tree_untouched():
    """Tests run in temp copies: the working tree's examples/ and results/ are the user's, never the suite's."""
    before = {name: tree_state(ROOT / name) for name in ("examples", "results")}
    yield
    for name, state in before.items():
        assert tree_state(ROOT / name) == state, f"a test wrote into the working tree's {name}/"


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: two workers (one per core on a 1-core box), none where a GPU is: each worker's temp folder
    holds its own device lock, so two workers' trials would share the card and each count the other's memory."""
    return 0 if has_cuda() else min(2, len(os.sched_getaffinity(0)))


def pytest_collection_modifyitems(config, items):
    if has_cuda():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none visible through NVML)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def all_cores():
    """Every core, for a module whose trials run several processes (one core each): a worker's own cores
    are too few, so these share the other worker's while they run."""
    mine = os.sched_getaffinity(0)
    if every := os.environ.get("BENCH_TESTS_ALL_CORES"):
        os.sched_setaffinity(0, {int(core) for core in every.split(",")})
    yield
    os.sched_setaffinity(0, mine)


@pytest.fixture
def faulty_path(monkeypatch):
    """Make the test-only `faulty` workload importable here and in trial children."""
    monkeypatch.syspath_prepend(str(FAULTY_DIR))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(FAULTY_DIR), os.environ.get("PYTHONPATH")])))
    return FAULTY_DIR


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A user's project: the emberformer example config and a tiny sweep spec that applies to it."""
    (tmp_path / "examples").mkdir()
    shutil.copy(EMBERFORMER_CONFIG, tmp_path / "examples" / "config.yaml")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write_spec(folder: Path, name: str = "tiny", **overrides) -> Path:
    """A sweep spec for the tiny emberformer preset; keyword args replace top-level sections."""
    spec = {
        "study": name,
        "workload": {"name": "emberformer", "preset": "tiny"},
        "search": {"batch_size": [4, 8], "precision": ["fp32", "bf16-mixed"], "checkpointing": ["none", "full"]},
        "trials": 3,
        "trial": dict(FAST_TRIAL),
        "apply": {"file": "examples/config.yaml", "preset": "lightning",
                  "keys": {"batch_size": "data_loader.batch_size",
                           "checkpointing": {"key": "model.activation_checkpointing",
                                             "values": {"none": False, "full": True}},
                           "compile": {"key": "model.compile", "values": {"off": False, "default": True}}}},
    }
    spec.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def faulty_spec(folder: Path, name: str, faults: list, **overrides) -> Path:
    spec = {
        "study": name,
        "workload": {"factory": "faulty:build", "params": {"fault": "none", "at_step": 3}},
        "search": {"batch_size": [8], "fault": faults},
        "trials": len(faults),
        "sampler": "random",
        "trial": dict(FAST_TRIAL),
    }
    spec.update(overrides)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path
