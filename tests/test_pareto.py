"""Choosing best: the front, budget and headroom, noise-aware ties, tiers."""
import csv
import io
import json
import statistics

import pytest

from harness import pareto, report

GiB = 1024**3


def row(n, tput, peak_gib, cv=0.005, status="ok", **extra):
    return {"number": n, "status": status, "throughput": tput, "peak_memory": int(peak_gib * GiB),
            "timing": {"step_s": {"cv": cv}}, "config": {"batch_size": n}, **extra}


def test_front_drops_dominated_and_failed_configs():
    rows = [row(0, 100, 4), row(1, 200, 6), row(2, 150, 8), row(3, 0, 0, status="oom"), row(4, 300, 2, status="diverged")]
    front = pareto.pareto_front(pareto.measured(rows))
    assert [r["number"] for r in front] == [0, 1]


def test_best_leaves_the_requested_headroom_of_the_budget():
    rows = [row(0, 100, 4), row(1, 200, 8), row(2, 300, 9.5)]
    choice = pareto.choose(rows, budget=10 * GiB, headroom=0.1)
    assert choice.best.number == 1  # 9.5 GiB would leave only 5%
    assert choice.best.peak <= 10 * GiB * 0.9
    assert [s.best for s in choice.rows] == [False, True, False]
    assert "best" not in rows[1]  # the rows given are never changed


def test_a_difference_within_measured_noise_is_a_tie_won_by_less_memory():
    rows = [row(0, 1000, 4, cv=0.03), row(1, 1040, 7, cv=0.03)]
    assert pareto.choose(rows, None, 0.1).best.number == 0
    rows = [row(0, 1000, 4, cv=0.001), row(1, 1100, 7, cv=0.001)]
    assert pareto.choose(rows, None, 0.1).best.number == 1


def test_tiers_pick_under_stricter_headroom():
    rows = [row(0, 100, 5), row(1, 200, 8), row(2, 300, 9), row(3, 400, 9.8)]
    tiers = pareto.choose(rows, budget=10 * GiB, headroom=0.1).tiers
    assert tiers["safe"].number == 0        # <= 75%
    assert tiers["balanced"].number == 1    # <= 85%
    assert tiers["aggressive"].number == 2  # <= 95%


def test_smaller_card_budget_from_the_same_measurements():
    choice = pareto.choose([row(0, 100, 4), row(1, 200, 8), row(2, 300, 20)], None, 0.1)
    assert choice.row_for("best", 10 * GiB).number == 1
    assert choice.under(4 * GiB).best is None


def test_a_smaller_card_s_pick_follows_the_same_rules_as_best():
    """`bench apply --budget` once picked from the Pareto front alone: a config whose loss rose, which
    the report marks unsafe, and a tie that should have kept the user's config."""
    base = row(0, 100, 2, baseline=True, loss={"first": 2.0, "last": 1.9})
    rising = row(1, 150, 3, loss={"first": 2.0, "last": 3.0})
    steady = row(2, 120, 2.5, loss={"first": 2.0, "last": 1.9})
    choice = pareto.choose([base, rising, steady], None, 0.1)
    assert choice.best.number == 2 and choice.standing(1).unsafe
    assert choice.row_for("best", 8 * GiB).number == 2
    tied = row(3, 101, 2.2, cv=0.02, loss={"first": 2.0, "last": 1.9})
    assert pareto.choose([base, tied], None, 0.1).row_for("best", 8 * GiB).number == 0


def test_a_tie_with_a_config_that_leaves_no_headroom_does_not_keep_it_and_says_so():
    base = row(0, 100, 9.5, cv=0.01, baseline=True)  # 9.5 GiB of 10 leaves 5%, under the 10% asked
    lead = row(1, 101, 4, cv=0.01)
    choice = pareto.choose([base, lead], 10 * GiB, 0.1)
    assert choice.versus.tie and not choice.kept and choice.best.number == 1
    assert ("trial 1 ties with your config within the noise, but your config peaks at 9.50 GiB and leaves "
            "less than the 10% headroom of the 10.00 GiB budget: trial 1 is best") in choice.why
    from harness.report import _terminal
    said = " ".join(_terminal.story(choice))
    assert "your config stays" not in said and "`bench apply best` writes trial #1" in said


def test_without_a_budget_capacity_is_the_measured_device_total():
    rows = [row(0, 100, 4, memory={"device_total": 10 * GiB}), row(1, 200, 9.6, memory={"device_total": 10 * GiB})]
    choice = pareto.choose(rows, None, 0.1)
    assert choice.capacity == 10 * GiB and choice.best.number == 0


def test_a_budget_above_the_device_is_capped_at_what_the_device_has():
    """A 1 TiB budget on a 10 GiB device made the headroom, the tiers and `% mem` read against 1 TiB: a 9.6 GiB
    peak was best with "99% headroom left" on a card it all but filled."""
    rows = [row(0, 100, 4, memory={"device_total": 10 * GiB}), row(1, 200, 9.6, memory={"device_total": 10 * GiB})]
    choice = pareto.choose(rows, 1024 * GiB, 0.1)
    assert choice.capacity == 10 * GiB and choice.capacity_label == "device memory" and choice.best.number == 0
    under = pareto.choose(rows, 8 * GiB, 0.1)
    assert under.capacity == 8 * GiB and under.capacity_label == "budget"


def test_even_a_very_noisy_trial_never_ties_with_one_twice_as_fast():
    rows = [row(0, 100, 2, cv=0.45), row(1, 200, 6, cv=0.4)]
    assert pareto.choose(rows, None, 0.1).best.number == 1


def test_a_trial_whose_windows_disagree_is_noisy_and_never_ranked():
    rows = [row(0, 100, 2, cv=0.02), row(1, 300, 3, cv=0.9)]  # a CV of 90%: a loaded machine, not a config
    choice = pareto.choose(rows, None, 0.1)
    assert choice.best.number == 0 and choice.standing(1).noisy and not choice.standing(1).pareto
    assert any("noisy" in line and "#1" in line for line in choice.why)


def test_a_tokens_objective_compares_contexts_fairly():
    short = row(0, 200, 4, tokens_per_s={"median": 200 * 512})
    long = row(1, 120, 5, tokens_per_s={"median": 120 * 1024})
    assert pareto.choose([short, long], None, 0.1).best.number == 0
    assert pareto.choose([short, long], None, 0.1, objective="tokens").best.number == 1


def test_a_confirmed_leader_beaten_once_by_an_unconfirmed_run_is_still_best_not_the_baseline():
    # the quickstart of 2026-11-23: #4's confirmed median (139) fell below #9's single run (149), whose
    # smaller peak then "dominated" it, and only the baseline was left confirmed on the front
    base = row(0, 105.2, 0.09, cv=0.014, baseline=True, repeats=[{"status": "ok", "throughput": t} for t in (132.1, 96.8)])
    lead = row(4, 167.5, 0.30, cv=0.11, repeats=[{"status": "ok", "throughput": t} for t in (130.1, 138.6)])
    single = row(9, 149.4, 0.12, cv=0.065)
    choice = pareto.choose([base, lead, single], 24 * GiB, 0.1)
    assert choice.leader.number == 4 and choice.leader.speed == 138.6
    # 1.32x, but the side-by-side ratios spread by 0.31: a tie with the baseline, whose config stays
    assert choice.versus.tie and choice.best is choice.baseline and choice.kept
    # and the report says why #9's faster single run is not the leader
    assert choice.passed_over.number == 9
    assert ("trial 9 measured 7.8% faster than trial 4 (149.4 samples/s, its trial's run) but is not chosen: "
            "trial 4 was confirmed by repeated runs and it was not") in " ".join(choice.why)


def test_a_tie_says_the_band_it_was_judged_by():
    """The quickstart of 2026-11-24 22:47: compiled 128 x 2 ran 81.2, 82.5, 87.4 against your config's
    63.7, 76.9, 64.1, and the report said "1.29x ± 0.15 ... a tie: within the noise", which reads as a
    clear win. The ratios of the runs side by side (1.07, 1.36) spread by 0.21, and a win must clear twice that."""
    base = row(0, 63.7, 0.09, cv=0.07, baseline=True, repeats=[{"status": "ok", "throughput": t} for t in (76.9, 64.1)])
    lead = row(4, 81.2, 0.63, cv=0.05, repeats=[{"status": "ok", "throughput": t} for t in (82.5, 87.4)])
    v = pareto.choose([base, lead], 24 * GiB, 0.1).versus
    assert v.tie and v.bound == 2 * v.spread and abs(v.ratio - 1) <= v.bound
    assert "a tie: within the noise (1× ± 0.41, twice the spread of the paired runs)" in v.text("samples/s")
    # the ratio is the paired rounds' (1.07, 1.36: median 1.21 in logs), as its band is; a ratio's spread has no unit
    assert v.text("samples/s").startswith("1.21× the samples/s, ± 0.21 over 2 runs each side by side")
    one_run = row(5, 81.2, 0.63, cv=0.05)  # no paired runs: its own noise is the band
    v = pareto.choose([row(0, 79.0, 0.09, cv=0.03, baseline=True), one_run], 24 * GiB, 0.1).versus
    assert v.tie and "the runs' own noise" in v.text("samples/s")
    # a busy machine: the paired ratios (0.9, 9.4, 1.2) spread by 4.8; "within the noise (1× ± 9.66)" read as a band
    wild = row(6, 90.0, 0.63, cv=0.05, repeats=[{"status": "ok", "throughput": t} for t in (720.0, 77.0)])
    v = pareto.choose([base, wild], 24 * GiB, 0.1).versus
    assert v.tie and v.bound > 1
    assert v.text("samples/s").endswith("a tie: runs side by side disagree too much to tell (their ratios spread "
                                        f"± {v.spread:.2f}); more rounds side by side, with the machine kept quiet, would tell")
    # nor is the ratio printed with that spread as its error bar ("4.87× ± 5.46 ... a tie", a reviewer's sweep),
    # nor the ratio at all: rounds of 4.04 and 26.4 made a "15.21×" headline no measurement supports
    assert v.text("samples/s").startswith("?× the samples/s (2 runs each side by side) — a tie")
    assert v.figure() == "?×" and v.text("samples/s").count("±") == 1 and f"{v.ratio:.2f}" not in v.text("samples/s")
    assert pareto.choose([base, lead], 24 * GiB, 0.1).versus.figure() == "1.21× ± 0.21"


def test_one_disturbed_round_of_four_does_not_make_the_band():
    """The quickstart walk of 2026-11-26: your config ran 168.6, 123.0 and 171.6 on a noisy host, and the
    leader's two rounds with it (1.59, 1.08) spread so wide that a 1.30x leader tied. Four rounds with one
    disturbed (1.59 among 1.08-1.12) are judged on the other three, as the median of the runs is."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    base = row(0, 168.6, 1, cv=0.02, baseline=True, repeats=[ok(123.0), ok(171.6), ok(170.0), ok(172.0)])
    lead = row(1, 190.7, 1, cv=0.02, repeats=[ok(195.0), ok(185.0), ok(190.0), ok(190.0)])
    v = pareto.choose([base, lead], 24 * GiB, 0.1).versus
    assert v.paired == 4 and v.ratio == pytest.approx((190 / 172 * 190 / 170) ** 0.5)  # the middle two, in logs
    assert v.spread < 0.05 and not v.tie and pareto.choose([base, lead], 24 * GiB, 0.1).best.number == 1
    two = row(0, 168.6, 1, cv=0.02, baseline=True, repeats=[ok(123.0), ok(171.6)])
    v = pareto.choose([two, row(1, 190.7, 1, cv=0.02, repeats=[ok(195.0), ok(185.0)])], 24 * GiB, 0.1).versus
    assert v.tie and v.spread == pytest.approx(statistics.stdev([195 / 123, 185 / 171.6]))  # two rounds: no majority


def test_a_leader_whose_every_run_side_by_side_beat_yours_is_no_tie_however_wide_the_ratios_spread():
    """The quickstart walk of 2026-12-01: the leader ran 175.6, 164.5, 180.9, 166.2 side by side with your
    config's 143.6, 152.1, 112.0, 113.9 on a quiet machine. Your config's own noise spread the ratios
    (1.22, 1.08, 1.62, 1.46) by ± 0.28, so a 1.34x leader faster in every round was "?×, a tie" and your
    config stayed. Were the two alike, one side or the other would take all four top places 1 time in 35."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    base = row(0, 102.1, 0.09, cv=0.07, baseline=True, repeats=[ok(t) for t in (143.6, 152.1, 112.0, 113.9)])
    lead = row(1, 158.0, 0.51, cv=0.07, repeats=[ok(t) for t in (175.6, 164.5, 180.9, 166.2)])
    choice = pareto.choose([base, lead], 24 * GiB, 0.1)
    v = choice.versus
    assert v.spread == pytest.approx(0.28, abs=0.01) and 2 * v.spread > v.ratio - 1  # the old band held it
    assert not v.tie and choice.best.number == 1 and not choice.kept and v.figure() == "1.34× ± 0.28"
    assert v.text("samples/s").endswith("beyond the noise: its slowest run side by side (164.5) beat your config's "
                                        "fastest (152.1)")
    from harness.report import _terminal
    assert "beyond the noise: its slowest run side by side (164.5)" in " ".join(_terminal.story(choice))
    from harness.report import _html
    assert _html._speedup(choice) == ("1.34× ± 0.28", "trial #1 vs #0, 4 runs each side by side; beyond the noise: "
                                      "its slowest run side by side (164.5) beat your config's fastest (152.1)")
    # one run of yours among the leader's: the rounds overlap, and the band decides as before
    overlap = row(0, 102.1, 0.09, cv=0.07, baseline=True, repeats=[ok(t) for t in (143.6, 170.0, 112.0, 113.9)])
    assert pareto.choose([overlap, lead], 24 * GiB, 0.1).kept
    # three rounds apart are too few: 1 time in 10 by chance
    three = pareto.choose([row(0, 102.1, 0.09, cv=0.07, baseline=True, repeats=[ok(t) for t in (143.6, 112.0, 152.1)]),
                           row(1, 158.0, 0.51, cv=0.07, repeats=[ok(t) for t in (175.6, 180.9, 164.5)])], 24 * GiB, 0.1)
    assert three.versus.apart is None and three.kept
    # and the other way: a config slower in every round is slower, not a tie
    slow = pareto.versus(row(2, 70.0, 0.1, cv=0.07, repeats=[ok(t) for t in (95.0, 70.0, 45.0, 70.0)]),
                         row(0, 100.0, 0.1, cv=0.07, baseline=True, repeats=[ok(t) for t in (100.0, 101.0, 100.0, 100.0)]))
    assert slow.apart == (95.0, 100.0) and not slow.tie and 2 * slow.spread > 1 - slow.ratio
    assert slow.apart_words() == "its fastest run side by side (95.0) lost to your config's slowest (100.0)"
    # a sure win over a tied leader says "beyond the noise" once (a reviewer's sweep said it twice)
    sure = pareto.choose([row(0, 100.0, 1, cv=0.02, baseline=True, repeats=[ok(t) for t in (100, 150, 100, 150)]),
                          row(1, 300.0, 1, cv=0.02, repeats=[ok(t) for t in (160, 160, 95, 95)]),
                          row(2, 151.0, 1, cv=0.02, repeats=[ok(151.0)] * 4)], 24 * GiB, 0.1)
    assert sure.sure_over_tie and sure.best.number == 2
    assert [w.count("beyond the noise") for w in sure.why if "trial 2 is best" in w] == [1]


def test_the_trials_own_runs_made_minutes_apart_do_not_widen_the_side_by_side_spread():
    """An attacker's sweep on a busy machine: 82, 317, 318 samples/s against your config's 66, 80, 80
    was called a tie at 3.96x, its spread (±1.57) counting the trials' own runs (82/66), which were
    not made side by side. The two rounds that were agree (3.96, 3.97)."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    base = row(0, 66.0, 1, cv=0.3, baseline=True, repeats=[ok(80.0), ok(80.0)])
    lead = row(1, 82.0, 2, cv=0.3, repeats=[ok(317.0), ok(318.0)])
    choice = pareto.choose([base, lead], 24 * GiB, 0.1)
    v = choice.versus
    # the ratio is the paired rounds' median, not the medians' ratio (317 / 80), which took in the 82 made apart
    assert v.ratio == pytest.approx((317 / 80 * 318 / 80) ** 0.5) and v.paired == 2
    assert v.spread == pytest.approx(0.0088, abs=1e-4)
    assert not v.tie and choice.best.number == 1 and not choice.kept


def test_a_pairs_ratio_is_the_same_read_from_either_side():
    """With two rounds side by side the median of the ratios was their mean, which is not reciprocal: one
    pair read 0.236x one way and 13.8x the other (rounds at 1.8x and 25.8x), so "why best" and the JSON's
    vs_baseline disagreed. Taken in logs (a geometric middle), a over b is 1 / (b over a)."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    a = row(0, 100.0, 1, cv=0.01, repeats=[ok(180.0), ok(258.0)])
    b = row(1, 100.0, 1, cv=0.01, repeats=[ok(100.0), ok(10.0)])
    assert pareto.versus(a, b).ratio * pareto.versus(b, a).ratio == pytest.approx(1.0)
    assert pareto.versus(a, b).ratio == pytest.approx((1.8 * 25.8) ** 0.5)
    three = row(2, 100.0, 1, cv=0.01, repeats=[ok(120.0), ok(130.0), ok(110.0)])
    base = row(3, 100.0, 1, cv=0.01, repeats=[ok(100.0)] * 3)
    assert pareto.versus(three, base).ratio == pytest.approx(1.2)  # an odd count's median is its middle round


def test_a_tie_goes_to_less_memory_only_where_memory_is_scarce():
    roomy = [row(0, 155.7, 0.23, cv=0.06), row(1, 172.7, 0.28, cv=0.06)]  # the quickstart: 24 GiB budget
    assert pareto.choose(roomy, 24 * GiB, 0.1).best.number == 1
    tight = [row(0, 155.7, 17, cv=0.06), row(1, 172.7, 20, cv=0.06)]  # 20 GiB of 24 leaves under 25%
    assert pareto.choose(tight, 24 * GiB, 0.1).best.number == 0


def losses(first, last, scatter=None):
    return {"status": "ok", "config": {"batch_size": 8}, "throughput": 1.0, "peak_memory": 1,
            "loss": {"first": first, "last": last, **({"scatter": scatter} if scatter is not None else {})}}


def test_a_loss_that_rose_within_its_step_to_step_scatter_is_not_unsafe():
    # recorded on the naics embedder's CPU preset: the baseline (batch 4, 27 steps) fell 22%; batch 16
    # (11 steps, 2.2% scatter) rose 1.9% and batch 32 rose 0.1%: chance, and the fastest configs
    base = losses(3.136, 2.438)
    assert pareto.worse_loss(losses(4.113, 4.190, scatter=0.092), base) is None
    assert pareto.worse_loss(losses(4.775, 4.782), base) is None
    # the same batch-16 rise with a small scatter is more than chance
    assert "beyond chance (1.0%" in pareto.worse_loss(losses(4.113, 4.190, scatter=0.004), base)


def test_a_loss_that_rose_beyond_its_scatter_is_unsafe_unless_the_baseline_rose_as_much():
    rising = losses(4.0, 5.0, scatter=0.1)  # +25% against 3 x 2.5% by chance
    why = pareto.worse_loss(rising, losses(4.0, 3.0))
    assert why.startswith("its loss rose 4 → 5 (+25.0%), beyond chance (7.5%")
    assert pareto.worse_loss(rising, losses(4.0, 4.8)) is None  # the user's own config rose 20%
    assert "over the baseline's own rise of +10.0%" in pareto.worse_loss(rising, losses(4.0, 4.4))
    assert "(1.0%: no step-to-step scatter recorded)" in pareto.worse_loss(losses(4.0, 5.0), None)


def confirmed_row(n, tput, peak_gib, **extra):
    """Confirmed: its run and two more, 3% either side (a noise of about 6%)."""
    return row(n, tput, peak_gib, cv=0.01, repeats=[{"status": "ok", "throughput": tput * f} for f in (0.97, 1.03)], **extra)


def test_a_tie_lost_on_memory_is_said_as_one_even_when_a_third_config_made_memory_scarce():
    # all confirmed: 105 at 3 GiB and 103 at 8 GiB of 10 tie with 100 at 1 GiB; the 8 GiB one makes
    # memory scarce, so the lightest wins, and the faster 3 GiB one lost a tie, not a confirmation
    rows = [confirmed_row(1, 105.0, 3), confirmed_row(2, 100.0, 1), confirmed_row(3, 103.0, 8)]
    choice = pareto.choose(rows, 10 * GiB, 0.1)
    assert choice.leader.number == 2 and choice.passed_over.number == 1
    said = " ".join(choice.why)
    assert ("trial 1 measured 5.0% faster than trial 2 (105.0 samples/s, median of 3 runs) but is not chosen: "
            "it ties with trial 2") in said and "tied config peaks over 75% of the 10,240 MiB budget" in said
    assert "confirmed by repeated runs" not in said


def test_your_config_kept_as_best_is_never_said_to_be_not_chosen():
    # your config (105, 8 GiB of 10) ties with a lighter 100 at 1 GiB: that one leads on memory, then
    # ties with yours, so yours stays best; no line may call it "not chosen"
    base = confirmed_row(0, 105.0, 8, baseline=True)
    choice = pareto.choose([base, confirmed_row(1, 100.0, 1)], 10 * GiB, 0.1)
    assert choice.best.number == 0 and choice.leader.number == 1
    assert choice.passed_over is None and "not chosen" not in " ".join(choice.why)


def test_a_failed_confirmation_run_pairs_nothing_and_is_not_counted_in_the_figure():
    """A confirmation run that failed shifted the pairing (run 3 of one config against run 2 of the
    other), and a trial with one ok confirmation run was labelled "median of 2 runs" while its figure
    was the trial's own run."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    base = row(0, 100, 2, baseline=True, repeats=[ok(80), ok(100)])
    lead = row(1, 150, 3, repeats=[{"status": "oom", "throughput": None}, ok(120)])
    assert pareto.side_by_side(lead, base) == [pytest.approx(1.2)]  # round 1 paired nothing (not 120/80)
    v = pareto.versus(lead, base)
    assert v.spread is None and v.paired == 1 and "(one run each side by side, too few for a spread)" in v.text("samples/s")
    half = row(2, 150, 3, repeats=[ok(110), {"status": "crash", "throughput": None}])
    choice = pareto.choose([row(0, 100, 2, baseline=True), half], None, 0.1)
    assert choice.standing(2).speed == 150 and choice.standing(2).runs == 1


def test_runs_pair_by_their_round_not_their_place_in_the_list():
    """Runs were paired by their place in each config's list: where one config's round 0 is missing (freed
    to run again after a busy run, and the resume stopped before it), its round 1 met the other's round 0."""
    run = lambda t, k: {"status": "ok", "throughput": t, "round": k}  # noqa: E731
    base = row(0, 100, 2, baseline=True, repeats=[run(100, 1), run(50, 0)])
    lead = row(1, 200, 2, repeats=[run(50, 0), run(210, 1)])
    assert sorted(pareto.side_by_side(lead, base)) == [1.0, 2.1]
    assert pareto.side_by_side(lead, row(0, 100, 2, baseline=True, repeats=[run(100, 1)])) == [2.1]


def test_a_noisy_first_run_confirmed_by_steady_runs_is_ranked_again():
    """examples/lightning on a loaded machine: your config's first run was noisy (windows 124% CV), its
    two confirmation runs agreed with it (1816.9, 1798.4, 1825.3), and it was still left out of the
    choice, so `bench apply best` wrote a config measured at 0.56x yours."""
    ok = lambda t: {"status": "ok", "throughput": t}  # noqa: E731
    base = row(0, 1816.9, 0.2, cv=1.242, baseline=True, repeats=[ok(1798.4), ok(1825.3)])
    lead = row(3, 1023.7, 0.2, cv=0.02, repeats=[ok(1010.0), ok(1050.0)])
    assert pareto.noisy(row(0, 1816.9, 0.2, cv=1.242)) and not pareto.noisy(base)
    choice = pareto.choose([base, lead], None, 0.1)
    assert choice.best.number == 0 and choice.best.record.baseline


def test_where_no_eager_config_fits_a_slower_compiled_one_lost_on_speed_not_on_an_unknown_payback():
    def compiled(n, tput, peak, batch, mode="default", **extra):
        return {**row(n, tput, peak, **extra), "config": {"batch_size": batch, "compile": mode},
                "timing": {"step_s": {"cv": 0.005, "median": 0.1}, "compile_s": 30.0, "first_step_s": 30.0}}
    rows = [compiled(0, 100, 9.8, 8, "off", baseline=True), compiled(1, 300, 6, 8), compiled(2, 200, 5, 4)]
    choice = pareto.choose(rows, 10 * GiB, 0.1)
    assert choice.best.number == 1 and 2 in choice.candidates
    assert not any("pays back is unknown" in line for line in choice.why)  # #1, best, has no better claim
    rows[0]["peak_memory"] = 2 * GiB  # eager fits: a compile must pay back, and #2's record lacks its compile time
    del rows[2]["timing"]["compile_s"]
    assert "compiled, but its compile or step time was not recorded, so whether the compile pays back is unknown: " \
           "not chosen: #2" in pareto.choose(rows, 10 * GiB, 0.1).why


def test_a_leader_whose_confirmation_is_half_done_is_not_outranked_by_your_config_confirmed_first():
    """A B B A: once your config's second run is recorded it has three runs and the leader two. A `kill -9`
    then (or `bench report` from a second terminal) named your config best over a leader 15x faster."""
    run = lambda t, k: {"status": "ok", "throughput": t, "round": k}  # noqa: E731
    base = row(0, 185.0, 0.1, baseline=True, repeats=[run(186.0, 0), run(185.5, 1)])
    lead = row(6, 2839.0, 0.2, repeats=[run(2831.0, 0)])
    choice = pareto.choose([base, lead], 24 * GiB, 0.1)
    assert choice.best.number == 6 and choice.passed_over is None
    # a leader whose confirmation run failed has not confirmed, and the report says which run failed
    failed = row(6, 2839.0, 0.2, repeats=[run(2831.0, 0), {"status": "crash", "throughput": None, "round": 1}])
    choice = pareto.choose([base, failed], 24 * GiB, 0.1)
    assert choice.best.number == 0 and choice.passed_over.number == 6
    assert "its confirmation run 2 ended crash" in " ".join(choice.why)


def test_json_and_csv_say_where_the_terminal_prints_no_ratio():
    """The terminal and the page print "?×" where rounds side by side disagree too much for any ratio
    (4.04 and 26.4 made a "15.21×"); JSON and CSV carried that 15.21 with nothing saying it means nothing."""
    base = row(0, 63.7, 0.09, cv=0.07, baseline=True, repeats=[{"status": "ok", "throughput": t} for t in (76.9, 64.1)])
    wild = row(6, 90.0, 0.63, cv=0.05, repeats=[{"status": "ok", "throughput": t} for t in (720.0, 77.0)])
    steady = row(4, 81.2, 0.63, cv=0.05, repeats=[{"status": "ok", "throughput": t} for t in (82.5, 87.4)])
    for other, untellable in ((wild, True), (steady, False)):
        choice = report.annotate([base, other], {"memory_budget": 24 * GiB, "headroom": 0.1})
        assert choice.versus.untellable is untellable
        versus = next(r for r in json.loads(report.to_json(choice)) if r["number"] == other["number"])["vs_baseline"]
        assert versus["untellable"] is untellable
        line = next(r for r in csv.DictReader(io.StringIO(report.to_csv(choice))) if r["number"] == str(other["number"]))
        assert line["vs_baseline_untellable"] == str(untellable)


def test_a_config_is_judged_to_fit_on_the_highest_peak_of_its_runs():
    """An audit's quickstart: best peaked at 188.3 MiB in its trial's run and at 197.6 and 194.0 MiB in its
    two confirmation runs; under a 215 MiB budget (193.5 MiB usable) it was still chosen, on the first."""
    MiB = 2**20
    base = row(0, 100.0, 150 / 1024, baseline=True,
               repeats=[{"status": "ok", "throughput": t, "peak_memory": 150 * MiB, "round": k}
                        for k, t in ((1, 101.0), (2, 99.0))])
    fast = row(2, 160.0, 188.3 / 1024,
               repeats=[{"status": "ok", "throughput": t, "peak_memory": int(p * MiB), "round": k}
                        for k, t, p in ((1, 159.0, 197.6), (2, 161.0, 194.0))])
    choice = report.annotate([base, fast], {"memory_budget": 215 * MiB, "headroom": 0.1})
    assert choice.best.number == 0  # 197.6 MiB is over the 193.5 MiB line, whatever its first run said
    standing = next(s for s in choice.rows if s.number == 2)
    assert standing.peak == int(197.6 * MiB)
    line = next(r for r in json.loads(report.to_json(choice)) if r["number"] == 2)
    assert line["peak_memory"] == int(188.3 * MiB) and line["peak"] == int(197.6 * MiB)
    cells = next(r for r in csv.DictReader(io.StringIO(report.to_csv(choice))) if r["number"] == "2")
    assert int(cells["peak"]) == int(197.6 * MiB)
    # with room for every run it is best again, judged on the same figure
    assert report.annotate([base, fast], {"memory_budget": 240 * MiB, "headroom": 0.1}).best.number == 2


def test_a_compile_that_is_never_faster_is_not_weighed_against_the_run_length():
    """It read "trial 1 (compile) is not faster than eager beyond the noise; the run is an assumed run of
    10,000 steps (...): not chosen": no run is long enough for a compile that saves nothing."""
    def trial(n, tput, mode):
        return {**row(n, tput, 1), "config": {"batch_size": 8, "compile": mode},
                "timing": {"step_s": {"cv": 0.005, "median": 0.1}, "compile_s": 30.0, "first_step_s": 0.5}}
    never = pareto.choose([trial(0, 100, "off"), trial(1, 99, "default")], None, 0.1)
    assert "trial 1 (compile) is not faster than eager beyond the noise: not chosen" in never.why, never.why
    slow = pareto.choose([trial(0, 100, "off"), trial(1, 110, "default")], None, 0.1, run_steps=100,
                         run_source="100 steps, the target's")
    assert "trial 1 (compile) pays back only after 2,950 steps; the run is 100 steps, the target's: not chosen" \
        in slow.why, slow.why


def test_a_compile_s_payback_counts_the_samples_one_step_trains_not_its_confirmed_speed_times_its_own_step():
    """Time saved per compiled step is (samples a step trains) x (1/eager speed - 1/compiled speed). A step
    trains batch x accumulation samples (100 here); the trial's own step time (1.0 s, its own run at 100
    samples/s) times its confirmed median (150 samples/s) made it 150, so a compile of 30 s paid back after
    118 steps instead of 177 and was chosen for a run of 150 steps it does not pay back in."""
    def trial(n, tput, step, mode, **extra):
        return {**row(n, tput, 1), "config": {"batch_size": 100, "compile": mode},
                "timing": {"step_s": {"cv": 0.005, "median": step}, "compile_s": 30.0 if mode != "off" else 0.0,
                           "first_step_s": 0.5}, **extra}
    eager = trial(0, 120.0, 100 / 120, "off")
    compiled = trial(1, 100.0, 1.0, "default",
                     repeats=[{"status": "ok", "throughput": 150.0, "round": 1}, {"status": "ok", "throughput": 150.0, "round": 2}])
    (pay,) = pareto.paybacks([eager, compiled], run_steps=150)
    assert pay.saved_s_per_step == pytest.approx(100 * (1 / 120 - 1 / 150))
    assert pay.break_even_steps == pytest.approx(29.5 / (100 * (1 / 120 - 1 / 150)))
    assert not pay.pays


def test_the_report_json_carries_a_factorys_unread_params():
    """The sweep said `widht` was never read; `bench report --format json` dropped the record's list of them."""
    base = {**row(0, 100.0, 0.1, baseline=True), "unread_params": ["widht"]}
    rows = json.loads(report.to_json(report.annotate([base, row(1, 120.0, 0.1)], {"memory_budget": 2**30})))
    assert [r.get("unread_params") for r in rows] == [["widht"], None]
