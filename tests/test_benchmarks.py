"""The device suite and the peer comparison, run end to end on CPU with tiny presets (real trials)."""
import json
import signal
import subprocess
import sys

import pytest

from conftest import ROOT

BENCHMARKS = ROOT / "benchmarks"
SECTIONS = ("gpu-marked tests", "one trial per workload preset", "repeatability", "short trial peak vs",
            "emberformer sweep under 24 GiB", "memory wall")


@pytest.fixture
def suite_module(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import gpu_suite
    return gpu_suite


def run_script(*args, timeout=400):
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def test_gpu_suite_quick_on_cpu_writes_every_check_with_measured_numbers(tmp_path):
    # A generous slot: the suite ends when its checks do (~2 min on a quiet 2-core machine).
    done = run_script(BENCHMARKS / "gpu_suite.py", "--device", "cpu", "--quick", "--out", tmp_path, "--minutes", 10,
                      timeout=700)
    assert done.returncode == 0, done.stderr[-2000:]
    md = (tmp_path / "gpu-suite.md").read_text()
    for title in SECTIONS:
        assert title in md, title
    env = json.loads((tmp_path / "gpu-suite.json").read_text())["env"]
    assert "error" not in env and env["torch"] and env["device"], env  # the header is read, not None
    assert f"torch {env['torch']}," in md and f"device **{env['device']}**" in md
    checks = {c["title"].split(":")[0].split(" (")[0]: c
              for c in json.loads((tmp_path / "gpu-suite.json").read_text())["checks"]}
    # On a quiet machine every check is done; on a loaded one a check may run out of its share of the
    # slot, which the suite must say. A crash is never acceptable. Numbers are asserted where measured.
    time_out = ("stopped (time): partial", "not run (time)")
    # a sweep whose every run the load spoiled has no best, and says so (it raised "measured no config" once)
    busy = checks["emberformer sweep under 24 GiB vs the guide's advice"]["status"].startswith("no answer (busy machine)")
    assert all(c["status"] == "done" or c["status"] in time_out or busy and "sweep" in t for t, c in checks.items()), \
        [(t, c["status"]) for t, c in checks.items()]
    done_ = {t for t, c in checks.items() if c["status"] == "done"}
    tests = checks["gpu-marked tests"]["data"]
    assert tests["failed"] == tests["error"] == 0 and tests["skipped"] >= 1  # no GPU here: all skipped
    for row in checks["one trial per workload preset"]["rows"]:
        assert row[3] in ("ok", "timeout") and (row[3] != "ok" or float(row[4]) > 0 and float(row[5]) > 0), row
    if "one trial per workload preset" in done_:
        assert len(checks["one trial per workload preset"]["rows"]) == 5
    if "repeatability" in done_:
        rep = checks["repeatability"]["data"]
        assert rep["ok"] == 5 and rep["throughput_cv"] > 0 and rep["peak_cv"] >= 0
    if "short trial peak vs a 200-step run" in done_:
        peak = checks["short trial peak vs a 200-step run"]
        assert peak["rows"][1][1] == 200 and abs(peak["data"]["across_processes"]) < 0.5
    if "emberformer sweep under 24 GiB vs the guide's advice" in done_:
        sweep = checks["emberformer sweep under 24 GiB vs the guide's advice"]["data"]
        assert sweep["best"]["throughput"] > 0 and sweep["guide"] > 0 and sweep["confirmed"] > 0
    if "memory wall" in done_:
        wall = checks["memory wall"]["data"]
        assert wall["results"] == {"just under": "ok", "just over": "oom"} and wall["held"]

def test_gpu_suite_lists_checks_without_time_as_not_run_and_still_writes(suite_module, tmp_path):
    assert suite_module.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--minutes", "0.01"]) == 0
    md = (tmp_path / "gpu-suite.md").read_text()
    assert md.count("**not run (time)**") == len(suite_module.CHECKS)


def test_gpu_suite_records_a_crashing_check_and_runs_the_rest(suite_module, tmp_path, monkeypatch):
    def crashes(s, sec):
        raise ValueError("boom")

    def fine(s, sec):
        sec.headers, sec.rows = ["x"], [[1]]

    monkeypatch.setattr(suite_module, "CHECKS", [("crashes", crashes, 0.5), ("works", fine, 0.5)])
    suite_module.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--minutes", "1"])
    md = (tmp_path / "gpu-suite.md").read_text()
    assert "**failed: ValueError: boom**" in md and "| 1 |" in md
    data = json.loads((tmp_path / "gpu-suite.json").read_text())
    assert "Traceback" in data["checks"][0]["data"]["traceback"]


def test_gpu_suite_skip_leaves_the_named_checks_out_and_gives_their_time_to_the_rest(suite_module, tmp_path,
                                                                                    monkeypatch):
    ran = {}

    def check(s, sec):
        ran[sec.title] = s.left()

    monkeypatch.setattr(suite_module, "CHECKS", [("pytest tests", check, 0.5), ("a trial", check, 0.5)])
    suite_module.main(["--device", "cpu", "--quick", "--out", str(tmp_path), "--minutes", "1", "--skip", "pytest"])
    assert list(ran) == ["a trial"] and ran["a trial"] > 50  # the whole minute, not half of it
    assert "pytest tests" not in (tmp_path / "gpu-suite.md").read_text()


def test_vs_peers_measures_every_answer_with_bench_trial_or_says_why_it_failed(tmp_path):
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    out = tmp_path / "rows.json"
    done = run_script(BENCHMARKS / "vs_peers.py", "--workload", "emberformer", "--device", "cpu", "--preset", "tiny",
                      "--budget", "160MiB", "--quick", "--trials", 3, "--sweep-timeout", 120, "--runs", 2, "--json", out)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())
    tools = [r["tool"] for r in rows]
    assert tools[0].startswith("lightning") and tools[1].startswith("accelerate")
    assert tools[2].startswith("guide: emberformer guide") and tools[3].startswith("bench sweep")
    for r in rows:
        if r["status"].startswith("failed: "):
            assert len(r["status"]) > len("failed: ") + 5 and r["answer"] is None  # an honest reason
            continue
        assert r["status"] in ("ok", "oom", "diverged"), r
        assert r["answer"]["batch_size"] >= 1
        if r["status"] == "ok":
            assert r["throughput"] > 0 and r["peak_memory"] > 0 and r["ratio"] > 0
            assert 1 <= len(r["runs"]) <= 2 and min(r["runs"]) <= r["throughput"] <= max(r["runs"])  # a median of runs
    assert rows[3]["status"] == "ok" and rows[3]["ratio"] == 1.0 and len(rows[3]["runs"]) == 2
    assert "| tool | answer (knobs) |" in done.stdout
    # minutes of work say where they are, on stderr (an H200 run killed at 144 s had printed nothing)
    assert "vs_peers: bench sweep: up to 3 trials" in done.stderr and "round 2 of 2" in done.stderr
    assert "vs_peers:" not in done.stdout


@pytest.fixture
def peers_module(monkeypatch):
    pytest.importorskip("lightning")
    pytest.importorskip("accelerate")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import vs_peers
    return vs_peers


def peer_job(vs_peers, peer_oom: str) -> dict:
    from _common import load_spec
    from harness import spec as specs
    spec = load_spec(ROOT / "sweeps" / "emberformer.yaml", "tiny", 160 * 2**20)
    return {**spec.job("cpu", specs.trial_config(spec, vs_peers.PEER_DEFAULTS)), "start": 128, "peer_oom": peer_oom}


def test_a_peer_searches_under_the_wall_a_bench_trial_sets_so_accelerate_answers_where_bench_fits(peers_module):
    # The wall sits above the OpenMP pool's thread stacks, as in bench's trial (harness.footprint); set
    # before the pool started, the stacks counted against the peer and accelerate crashed at 160 MiB
    # where bench's own trials fit batch 256.
    answer = peers_module.ask_peer("accelerate", peer_job(peers_module, "own"), timeout_s=120)
    assert "error" not in answer, answer
    assert answer["config"]["batch_size"] >= 64 and answer["tried"][0] == 128
    assert "OOM check" not in answer["tool"]


@pytest.mark.parametrize("peer", ["lightning", "accelerate"])
def test_peer_oom_bench_gives_a_peer_bench_s_oom_check_and_says_so(peers_module, peer):
    answer = peers_module.ask_peer(peer, peer_job(peers_module, "bench"), timeout_s=120)
    if answer.get("signal") in (signal.SIGSEGV, signal.SIGBUS):
        # an allocation past the wall that a library never checked (1 ask in 4 full runs, Lightning at batch
        # 256): no check in Python could see it, and the table says so rather than "child died (exit -11)"
        assert answer["error"].startswith(f"crashed by {signal.Signals(answer['signal']).name} under the memory "
                                          "wall") and "last said: " in answer["error"], answer
        return
    assert "error" not in answer, answer  # oneDNN's "could not create a primitive" no longer ends its search
    assert answer["config"]["batch_size"] >= 1 and answer["tool"].endswith("(OOM check: its own and bench's)")


def test_a_peer_that_segfaults_is_said_to_have_crashed_at_the_wall_with_its_last_line(peers_module):
    proc = subprocess.run([sys.executable, "-c", "import os, signal, sys; print('Batch size 128 succeeded, trying "
                           "batch size 256', file=sys.stderr, flush=True); os.kill(os.getpid(), signal.SIGSEGV)"],
                          capture_output=True, text=True)
    assert peers_module.died(proc) == ("crashed by SIGSEGV under the memory wall (an allocation no check sees); "
                                       "last said: Batch size 128 succeeded, trying batch size 256")
    proc = subprocess.run([sys.executable, "-c", "raise SystemExit(3)"], capture_output=True, text=True)
    assert peers_module.died(proc) == "child died (exit 3): no output"


@pytest.mark.parametrize("peer", ["lightning", "accelerate"])
def test_the_widened_check_is_the_one_the_peer_s_search_calls(peers_module, peer):
    """Where the peer's search looks its OOM check up, oneDNN's failure at the wall now counts, and a
    plain error still does not (the widening is bench's check on top of the peer's, not "everything")."""
    module, name = peers_module.oom_check(peer)
    own = getattr(module, name)
    wall_error = RuntimeError("could not create a primitive descriptor for a convolution forward propagation")
    assert not own(wall_error)  # why the peers crash there on their own
    try:
        peers_module.widen_oom_check(peer)
        assert peers_module.recognised(peer, wall_error)
        assert not peers_module.recognised(peer, RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    finally:
        setattr(module, name, own)


def test_overhead_measures_fresh_and_warm_interleaved_and_ends_with_json():
    done = run_script(BENCHMARKS / "overhead.py", "--runs", 2, "--device", "cpu", "--preset", "tiny", "--quick",
                      "--json", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["start"] == "warm" and summary["fresh"]["median_s"] > 0 and summary["median_s"] > 0
    assert len(summary["overheads_s"]) == len(summary["fresh"]["overheads_s"]) == 2
    assert summary["server_start_s"] > 0 and len(summary["load_avg_before"]) == 3
    assert done.stdout.count("| fresh |") == 2 and done.stdout.count("| warm |") == 2
