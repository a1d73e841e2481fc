"""Crafted or mangled journal records: one line naming journal.log:LINE, never a traceback, nothing changed.

A whole line (newline-terminated JSON) that is not a record Optuna and bench can replay is damage,
wherever it sits: `bench report` and `bench sweep` both refuse it and leave the file as it was.
"""
from __future__ import annotations

import json

import pytest

from tests.test_store import bench, journal, lines, one_trial, study  # noqa: F401 (fixtures)

CRAFTED = {
    "unknown op code": {"op_code": 99, "worker_id": "w"},
    "no trial id": {"op_code": 8, "worker_id": "w", "user_attr": {"x": 1}},
    "repeats of the wrong type": {"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {"repeats": "oops"}},
    "a record that is not a mapping": {"op_code": 8, "worker_id": "w", "trial_id": 0, "user_attr": {"record": [1]}},
    "a throughput that is not a number": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                                          "user_attr": {"record": {"status": "ok", "throughput": "fast"}}},
    "a peak that is not a number": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                                    "user_attr": {"record": {"status": "ok", "peak_memory": [1]}}},
    "a confirmation record's figure that is not a number": {
        "op_code": 2, "worker_id": "w", "study_id": 0,
        "user_attr": {"confirm:0:0": {"state": "done", "run": {"status": "ok", "peak_memory": "big"}}}},
    "a confirmation run's figure that is not a number": {
        "op_code": 2, "worker_id": "w", "study_id": 0,
        "user_attr": {"repeats": {"0": [{"status": "ok", "throughput": {"median": "fast"}}]}}},
    "a throughput of 1e308 (it overflowed the noise's arithmetic)": {
        "op_code": 8, "worker_id": "w", "trial_id": 0, "user_attr": {"record": {"status": "ok", "throughput": 1e308}}},
    "a negative throughput": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                              "user_attr": {"record": {"status": "ok", "throughput": -5}}},
    "a confirmation run's infinite throughput": {
        "op_code": 2, "worker_id": "w", "study_id": 0,
        "user_attr": {"confirm:0:0": {"state": "done", "run": {"status": "ok", "throughput": float("inf")}}}},
    "superseded trials that are not numbers": {"op_code": 2, "worker_id": "w", "study_id": 0,
                                               "user_attr": {"superseded": ["3"]}},
    # the study's header, hand-edited: tracebacks in the report and apply, far from the line
    **{f"a header's {name} of {value!r}": {"op_code": 2, "worker_id": "w", "study_id": 0, "user_attr": {name: value}}
       for name, value in [("memory_budget", "24GiB"), ("headroom", "x"), ("spec_relative", 5), ("objective", "tokens2"),
                           ("model", {"predicted": "x"}), ("model", [1, 2]),
                           ("model", {"predicted": [{"config": {}, "speed": "fast"}]})]},
    # a hand-edited config: `bench apply` divided by it, took a log of it, or wrote it into the user's file
    **{f"a config's batch_size of {v!r}": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                                           "user_attr": {"config": {"batch_size": v, "precision": "fp32"}}}
       for v in ("abc", None, -4, 1e30, 10**20)},
    "a workload knob's null": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                               "user_attr": {"config": {"batch_size": 8, "seq_len": None}}},
    "a workload knob's 1e30": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                               "user_attr": {"record": {"status": "ok", "config": {"batch_size": 8, "seq_len": 1e30}}}},
    # the report's busy story read these and failed with a KeyError
    "a busy verdict without its figures": {"op_code": 8, "worker_id": "w", "trial_id": 0,
                                           "user_attr": {"record": {"status": "ok", "busy": {"load1": 3}}}},
    "a confirmation run's busy verdict that is a word": {
        "op_code": 2, "worker_id": "w", "study_id": 0,
        "user_attr": {"confirm:0:0": {"state": "done", "run": {"status": "ok", "busy": "yes"}}}},
    "a record's config precision that is no precision": {
        "op_code": 8, "worker_id": "w", "trial_id": 0,
        "user_attr": {"record": {"status": "ok", "config": {"batch_size": 8, "precision": "fp64"}}}},
}
RAW = {"a peak that is NaN": '{"op_code": 8, "worker_id": "w", "trial_id": 0, '
                             '"user_attr": {"record": {"status": "ok", "peak_memory": NaN}}}'}


def deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


@pytest.mark.parametrize("case", [*CRAFTED, *RAW, "100 000-deep JSON"])
def test_a_crafted_journal_record_is_refused_by_file_and_line(study, case):  # noqa: F811 (fixture)
    path = journal(study)
    line = (json.dumps(CRAFTED[case]).encode() if case in CRAFTED else RAW[case].encode() if case in RAW
            else deep(100_000))
    records = path.read_bytes().count(b"\n")
    crafted = path.read_bytes() + line + b"\n"
    path.write_bytes(crafted)
    for args in (("report", "store"), ("sweep", "store.yaml", "--device", "cpu")):
        result = bench(study, *args)
        assert result.returncode == 2, result.stderr
        [said] = lines(result.stderr)
        assert f"journal.log:{records + 1}:" in said and "Traceback" not in said, said
        assert "not a number" in said or "not a number" not in case
        if any(word in case for word in ("1e308", "negative", "infinite", "NaN")):
            assert "not a measurement" in said, said
    assert path.read_bytes() == crafted  # nothing repaired or cut behind the user's back
