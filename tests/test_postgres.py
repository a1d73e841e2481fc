"""One study on a real PostgreSQL, swept by workers on different hosts (UTS namespaces, own hostnames).

No config runs twice across hosts (the database holds the claim lock), a killed host's trial is
found by Optuna's RDB heartbeat and run again by another host, and a worker writes nothing under
its current folder. CI starts PostgreSQL and sets BENCH_TEST_PG_URL (.ci/run).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import yaml

from harness.study import CONFIRM_ROUNDS, WIDE_TIE_ROUNDS
from tests.conftest import FAST_TRIAL
from tests.test_interrupt import env_for, hanging_trial, wait_until_gone, write_gated

URL = os.environ.get("BENCH_TEST_PG_URL")


def can_be_another_host() -> bool:
    """Root with unshare(1) in a machine that allows UTS namespaces (some containers forbid them)."""
    return (os.geteuid() == 0 and shutil.which("unshare") is not None
            and subprocess.run(["unshare", "--uts", "true"], capture_output=True).returncode == 0)


pytestmark = [
    pytest.mark.skipif(not URL, reason="BENCH_TEST_PG_URL is not set: no PostgreSQL to test against "
                                       "(.ci/run starts one; e.g. postgresql+psycopg2://bench:bench@localhost/bench_test)"),
    pytest.mark.skipif(not can_be_another_host(),
                       reason="workers as other hosts need root, unshare(1) and a machine allowing UTS namespaces"),
]
HEARTBEAT_S = 1
SPACE = {"batch_size": [4, 8, 16], "width": [16, 32]}


def on_host(host: str, folder: Path, code_dir: Path, *args: str) -> subprocess.Popen:
    """`bench ARGS` as a worker on `host`: its own hostname, its own empty current folder."""
    folder.mkdir(parents=True, exist_ok=True)
    command = " ".join(f"'{a}'" for a in args)
    script = f'hostname {host} && exec "{sys.executable}" -c "from harness.cli import main; main()" {command}'
    env = dict(env_for(code_dir), BENCH_HEARTBEAT_S=str(HEARTBEAT_S))
    return subprocess.Popen(["unshare", "--uts", "sh", "-c", script], cwd=folder, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def report(folder: Path, study: str) -> list[dict]:
    result = subprocess.run([sys.executable, "-c", "from harness.cli import main; main()", "report", study,
                             "--storage", URL, "--format", "json"], cwd=folder, env=env_for(folder),
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def done(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, out, err


def test_three_hosts_share_one_study_and_never_run_a_config_twice(tmp_path):
    study = f"hosts-{uuid.uuid4().hex[:8]}"
    spec = {"study": study, "workload": {"factory": "faulty:build", "params": {"fault": "none", "width": 16}},
            "search": SPACE, "trials": 6, "sampler": "tpe", "trial": dict(FAST_TRIAL)}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    hosts = ["host-a", "host-b", "host-c"]
    # --trials 6, not the default auto: auto may stop early (busy-machine figures are noise), and this
    # test is about six configs spread over three hosts, each measured once
    workers = [on_host(h, tmp_path / h, tmp_path, "sweep", str(tmp_path / "spec.yaml"), "--device", "cpu",
                       "--storage", URL, "--trials", "6") for h in hosts]
    ended = [done(w) for w in workers]
    for rc, out, err in ended:
        assert rc == 0, err
        assert "Traceback" not in err
        assert "Warning" not in err  # Optuna's heartbeat UserWarning: bench beats through ask/tell on purpose
    rows = report(tmp_path, study)
    configs = [(r["config"]["batch_size"], r["config"]["width"]) for r in rows]
    logs = "\n".join(f"--- {h}\n{out}{err}" for h, (_, out, err) in zip(hosts, ended))
    assert sorted(configs) == sorted((b, w) for b in SPACE["batch_size"] for w in SPACE["width"]), logs  # each once
    assert all(r["status"] == "ok" and r["throughput"] > 0 for r in rows)
    assert sum(out.count("    → ") for _, out, _ in ended) == 6  # trials really run, summed over hosts
    for h in hosts:
        assert list((tmp_path / h).iterdir()) == [], f"{h} wrote under its current folder"


def test_a_killed_hosts_trial_is_found_by_heartbeat_and_run_again_elsewhere(tmp_path):
    study = f"killed-{uuid.uuid4().hex[:8]}"
    gate = write_gated(tmp_path, ["none", "hang"], study)
    args = ("sweep", str(tmp_path / "stop.yaml"), "--device", "cpu", "--storage", URL)
    doomed = on_host("host-b", tmp_path / "b", tmp_path, *args)
    try:
        pgid = os.getpgid(hanging_trial(doomed).pid)
    finally:
        doomed.kill()
        doomed.communicate(timeout=30)
    assert wait_until_gone(pgid) == []
    assert [r["status"] for r in report(tmp_path, study) if r["config"]["fault"] == "hang"] == ["running"]
    gate.unlink()
    time.sleep(3 * HEARTBEAT_S + 1)  # past the grace period: host-b's trial has stopped beating
    rc, out, err = done(on_host("host-a", tmp_path / "a", tmp_path, *args))
    assert rc == 0, err
    rows = report(tmp_path, study)
    assert Counter((r["config"]["fault"], r["status"]) for r in rows) == {
        ("none", "ok"): 1, ("hang", "interrupted"): 1, ("hang", "ok"): 1}
    assert list((tmp_path / "a").iterdir()) == []


def test_one_of_two_hosts_runs_the_whole_confirmation(tmp_path):
    """Two hosts reaching the confirmation together (resuming a sweep killed as its confirmation began).
    Before, each host ran the whole confirmation and the study kept one host's runs (last writer wins);
    then they split it, so a config's runs were not side by side with your config's on one device."""
    study = f"confirm-{uuid.uuid4().hex[:8]}"
    spec = {"study": study, "workload": {"factory": "faulty:build",
                                         "params": {"fault": "none", "width": 16, "steady_ms": 20}},  # never noisy
            "search": {"batch_size": [2, 256]}, "trials": 2, "sampler": "grid",
            # windows of 0.25 s, not 0.05: on a loaded 2-core CI machine one sweep never reached its confirmation,
            # most likely a 0.05 s window's trial read `noisy` (CV over 50%), which is no candidate to confirm
            "trial": {**FAST_TRIAL, "window": 0.25, "max_seconds": 2}}
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    args = ("sweep", str(tmp_path / "spec.yaml"), "--device", "cpu", "--storage", URL)
    first = on_host("host-a", tmp_path / "first", tmp_path, *args)
    said = []
    try:
        for line in first.stdout:  # up to the first "confirming:" line
            said.append(line)
            if line.startswith("confirming:"):
                break
    finally:
        first.kill()
        _, err = first.communicate(timeout=30)
    assert said and said[-1].startswith("confirming:"), "".join(said) + err[-2000:]  # killed as its confirmation began
    time.sleep(2)
    workers = [on_host(h, tmp_path / h, tmp_path, *args) for h in ("host-a", "host-b")]
    ended = [done(w) for w in workers]
    for rc, out, err in ended:
        assert rc == 0, err
    rows = {r["config"]["batch_size"]: r for r in report(tmp_path, study)}
    rounds = len(rows[2]["repeats"])  # a busy host may make a wide tie, settled by more rounds (Sweep.settle_wide_tie)
    assert rounds in (CONFIRM_ROUNDS, CONFIRM_ROUNDS + WIDE_TIE_ROUNDS) and len(rows[256]["repeats"]) == rounds
    assert sorted(len(re.findall(r"#\d+ confirmation run \d+ of", out)) for _, out, _ in ended) == [0, 2 * rounds]


def test_workers_started_at_once_on_a_new_database_all_open_it(tmp_path):
    """Six workers opening a database that has no tables yet: Optuna creates its schema in each, and
    PostgreSQL's CREATE TABLE races on its catalog (UniqueViolation on pg_type_typname_nsp_index), so
    on a fresh database all but one used to fail to open it. A new schema stands in for a new database."""
    import sqlalchemy

    schema = f"fresh_{uuid.uuid4().hex[:8]}"
    engine = sqlalchemy.create_engine(URL)
    with engine.begin() as connection:
        connection.execute(sqlalchemy.text(f"CREATE SCHEMA {schema}"))
    url = sqlalchemy.make_url(URL).update_query_dict({"options": f"-csearch_path={schema}"})
    code = "import sys; from harness import storage; storage.open_database(sys.argv[1], heartbeat=False)"
    workers = []
    try:
        workers = [subprocess.Popen([sys.executable, "-c", code, url.render_as_string(hide_password=False)],
                                    env=env_for(tmp_path), text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                   for _ in range(6)]
        ended = [w.communicate(timeout=120) for w in workers]
        assert [w.returncode for w in workers] == [0] * 6, [err[-400:] for _, err in ended]
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
        with engine.begin() as connection:
            connection.execute(sqlalchemy.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()
