"""A model of one training problem, fit from its measured trials: peak memory and throughput of every config.

One optimizer step of a config with micro-batch b and accumulation a costs

    step_s = a * (O + t * b * (1 + k * b)) + U          throughput = a * b / step_s
    peak   = W + A * b (+ G when a > 1: the gradients stay alive across micro-batches)

O is the fixed cost of a micro-step (kernel launches, Python: what makes small batches slow on a
GPU), t the time per sample, U the optimizer step that accumulation amortises, k how much a sample
slows as the batch outgrows the caches (a CPU's throughput can fall past some batch; on a GPU k is
near 0), W the static memory
(weights, gradients, optimizer state), A the activation memory per sample. Every knob value acts
multiplicatively on O, t, W and A, and the same factor holds in every family (bf16 speeds up every
config by about the same factor; checkpointing cuts activations by about the same factor
everywhere), so log O = o0 + sum of its knob values' effects, and likewise for t, W and A.

The fit is maximum a posteriori: log-space residuals of the measured throughputs and peaks, a
Gaussian prior on every effect (the device's usual effects, `PRIORS`, else none), and an OOM as a
one-sided residual (its peak was above the limit). Its Laplace approximation (the inverse
Gauss-Newton Hessian) gives each prediction a standard deviation, so a family never measured gets
a wide one and a well-measured family a narrow one. numpy only: no torch, no Optuna.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from harness import pareto

SPEED_SIGMA = 0.04
"""Log-space spread of a measured throughput around the model: 3% noise plus what the model misses."""
PEAK_SIGMA = 0.05
EFFECT_TAU = 0.7
"""Prior spread of a knob value's effect (log): a factor of 2 either way is unsurprising."""
MEASURED_TAU = 0.3
"""Prior spread of an effect measured on the machine itself (a layer's bf16 speed-up on the CPU): a
workload's own mix of operations moves it by about a third either way (0.56-0.93x fp32 on one host
whose layer measured 0.6-0.7x); where the layer runs bf16 faster, the spread around no change."""
RECOMPUTE_TAU = 0.15
"""Prior spread of checkpointing's cost per sample on a CPU: it recomputes the forward in the backward,
about a third of a step, so 1.1-1.5x and never faster (every CPU landscape: 1.07-1.67x, one 2.1x). Left
at EFFECT_TAU, a family never measured looked as likely to cost nothing, and the search tried it early."""
INTERCEPT_TAU = 3.0
COUNTED_TAU = 0.5
"""Prior spread of G around the counted gradient bytes: the allocator's rounding and a step's
temporaries on top of them, not a different order of magnitude."""
REFERENCE = {"precision": "fp32", "checkpointing": "none", "compile": "off"}
"""The value a knob's effects are measured against (others: the first value in sorted order)."""

L = math.log
PRIORS = {  # (knob, value): {term: log factor}; terms O, t, W, A. Folklore made explicit, tested by the fit.
    "cuda": {("precision", "bf16-mixed"): {"t": L(1 / 2.5), "A": L(0.6)},
             ("precision", "fp16-mixed"): {"t": L(1 / 2.5), "A": L(0.6)},
             ("precision", "bf16-true"): {"t": L(1 / 2.8), "A": L(0.5), "W": L(0.5)},
             ("precision", "tf32"): {"t": L(1 / 1.6)},
             ("checkpointing", "full"): {"t": L(1.3), "A": L(1 / 5)},
             ("compile", "*"): {"O": L(0.4), "t": L(0.9), "A": L(0.85)}},
    "cpu": {("precision", "fp16-mixed"): {"t": L(10.0)},  # no fast fp16 kernels on a CPU
            ("checkpointing", "full"): {"t": L(1.3), "A": L(1 / 3), "tau": {"t": RECOMPUTE_TAU}},
            ("compile", "*"): {"O": L(0.5), "t": L(0.9)}},
    # a CPU without bf16 instructions (its trials' env.cpu_bf16 is False): autocast converts in software;
    # the quickstart's emberformer ran bf16-mixed 5x slower than fp32 on an AVX2-only EPYC
    "cpu without bf16": {("precision", "bf16-mixed"): {"t": L(5.0)}, ("precision", "bf16-true"): {"t": L(5.0)}},
}
STRUCTURAL = ("batch_size", "accumulation")
OVERHEAD_SAMPLES = {"cuda": 8.0, "cpu": 4.0}
"""Prior centre of O (and of U, the optimizer step), in samples' worth of time at the best throughput
seen: a GPU launches kernels for a micro-step whatever its batch; a CPU's fixed cost is smaller (the
recorded CPU landscapes' smallest batch runs at 0.65-0.82 of their fastest config)."""
CACHE_K = {"cuda": 1e-4, "cpu": 1e-3}
"""Prior centre of k (its prior spread lets the data say 10x either way and more): on a GPU a sample
slows by 1% at batch 100; a CPU's caches are smaller, 10% at batch 100 (all seven recorded CPU
landscapes, five workloads, are fastest between batch 8 and 64)."""


def knob_levels(space: list[dict]) -> list[tuple]:
    """The (knob, value) indicators of the model: every value of a varying knob but its reference."""
    values: dict[str, set] = {}
    for config in space:
        for k, v in config.items():
            if k not in STRUCTURAL:
                values.setdefault(k, set()).add(v)
    levels = []
    for k in sorted(values):
        vals = sorted(values[k], key=repr)
        if len(vals) < 2:
            continue
        ref = REFERENCE.get(k, vals[0]) if REFERENCE.get(k) in vals else vals[0]
        levels += [(k, v) for v in vals if v != ref]
    return levels


def priors(device: str, rows: list[dict]) -> dict:
    """The device's usual effects (`PRIORS`), with what its trials measured of it: on a CPU, how much
    faster bf16 autocast runs a layer there (env.cpu_bf16_speedup), else whether it has bf16
    instructions at all (env.cpu_bf16). A layer that runs bf16 slower says a step will too; one that
    runs it faster says only that a step may gain, and by how much it does not: the casts and the ops
    autocast leaves in fp32 take some or all of it back. Decided on the emberformer space on an EPYC
    (layer 1.37x and 2.21x, steps 0.90x and 0.99x fp32); a U-Net and the gpt stand-in recorded there
    after it ran 1.35x and 1.37x, about one MEASURED_TAU above no change. So the model starts at no
    change, give or take MEASURED_TAU, and the first bf16 trial says."""
    if device.startswith("cuda"):
        return PRIORS["cuda"]
    speedups = [r["env"]["cpu_bf16_speedup"] for r in rows if (r.get("env") or {}).get("cpu_bf16_speedup")]
    if speedups:
        per_sample = {"t": -math.log(min(float(np.median(speedups)), 1.0)), "tau": {"t": MEASURED_TAU}}
        return {**PRIORS["cpu"], ("precision", "bf16-mixed"): per_sample, ("precision", "bf16-true"): per_sample}
    if any((r.get("env") or {}).get("cpu_bf16") is False for r in rows):
        return {**PRIORS["cpu"], **PRIORS["cpu without bf16"]}
    return PRIORS["cpu"]


def prior_effect(level: tuple, table: dict) -> dict:
    knob, value = level
    return table.get((knob, value)) or (table.get((knob, "*")) if value != REFERENCE.get(knob) else None) or {}


def prior_mean(level: tuple, term: str, table: dict) -> float:
    return prior_effect(level, table).get(term, 0.0)


def prior_tau(level: tuple, term: str, table: dict) -> float:
    return prior_effect(level, table).get("tau", {}).get(term, EFFECT_TAU)


@dataclass
class Fit:
    """A fitted model: log-space means and standard deviations for any configs, `predict`."""

    levels: list
    speed: "Part"
    peak: "Part"

    def predict(self, configs: list[dict]) -> dict:
        """Per config: mu/sd of log throughput and of log peak (numpy arrays in `configs` order)."""
        X = design(configs, self.levels)
        b, a = structural(configs)
        mu_s, grad_s = speed_terms(self.speed.theta, X, b, a)
        mu_p, grad_p = peak_terms(self.peak.theta, X, b, a)
        sd_s = np.sqrt(np.einsum("ij,jk,ik->i", grad_s, self.speed.cov, grad_s) + (SPEED_SIGMA / 2) ** 2)
        sd_p = np.sqrt(np.einsum("ij,jk,ik->i", grad_p, self.peak.cov, grad_p) + (PEAK_SIGMA / 2) ** 2)
        return {"speed": mu_s, "speed_sd": sd_s, "peak": mu_p, "peak_sd": sd_p}

    def effects(self) -> dict:
        """Each knob value's fitted factor on O, t, W, A (1.0: no effect), for explanations."""
        m = len(self.levels) + 1
        out = {}
        for i, level in enumerate(self.levels, start=1):
            out[level] = {"O": math.exp(self.speed.theta[i]), "t": math.exp(self.speed.theta[m + i]),
                          "W": math.exp(self.peak.theta[i]), "A": math.exp(self.peak.theta[m + i])}
        return out


@dataclass
class Part:
    theta: np.ndarray
    cov: np.ndarray


def design(configs: list[dict], levels: list) -> np.ndarray:
    """Intercept column, then one 0/1 column per knob value."""
    X = np.zeros((len(configs), len(levels) + 1))
    X[:, 0] = 1.0
    for j, (k, v) in enumerate(levels, start=1):
        X[:, j] = [1.0 if c.get(k) == v else 0.0 for c in configs]
    return X


def structural(configs: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    return (np.array([float(c["batch_size"]) for c in configs]),
            np.array([float(c.get("accumulation", 1)) for c in configs]))


def speed_terms(theta, X, b, a):
    """log throughput and its gradient in theta = [o (m), t (m), u, k]."""
    m = X.shape[1]
    O, t, U, k = np.exp(X @ theta[:m]), np.exp(X @ theta[m:2 * m]), math.exp(theta[2 * m]), math.exp(theta[2 * m + 1])
    per_sample = t * b * (1 + k * b)
    step = a * (O + per_sample) + U
    mu = np.log(a * b) - np.log(step)
    grad = np.hstack([-(a * O / step)[:, None] * X, -(a * per_sample / step)[:, None] * X, -(U / step)[:, None],
                      -(a * t * k * b * b / step)[:, None]])
    return mu, grad


def peak_terms(theta, X, b, a):
    """log peak and its gradient in theta = [w (m), act (m), g]."""
    m = X.shape[1]
    W, A, G = np.exp(X @ theta[:m]), np.exp(X @ theta[m:2 * m]), math.exp(theta[2 * m])
    held = (a > 1).astype(float)
    peak = W + A * b + held * G
    grad = np.hstack([(W / peak)[:, None] * X, (A * b / peak)[:, None] * X, (held * G / peak)[:, None]])
    return np.log(peak), grad


def fit(rows: list[dict], space: list[dict], device: str, objective: str, limit: float | None) -> Fit:
    """Fit both parts to `rows` (ok/diverged rows: speed and peak; oom rows: peak above `limit`)."""
    levels = knob_levels(space + [r["config"] for r in rows])
    ran = [r for r in rows if r.get("status") in ("ok", "diverged") and r.get("peak_memory")]
    spd = [r for r in ran if pareto.speed(r, objective)]
    ooms = [r for r in rows if r.get("status") == "oom"] if limit else []

    y = np.log([pareto.speed(r, objective) for r in spd]) if spd else np.zeros(0)
    p = np.log([float(r["peak_memory"]) for r in ran]) if ran else np.zeros(0)
    # Intercept priors centred on the data's scale (wide), so the fit starts near the answer.
    top = float(np.exp(y.max())) if len(y) else 1.0
    t0 = -math.log(top)                      # per-sample time at the best throughput seen
    kind = "cuda" if device.startswith("cuda") else "cpu"
    o0 = t0 + math.log(OVERHEAD_SAMPLES[kind])
    w0, a0 = static_and_activation_prior(ran, limit)
    table = priors(device, rows)
    speed_mu = np.concatenate([[o0], [prior_mean(lv, "O", table) for lv in levels],
                               [t0], [prior_mean(lv, "t", table) for lv in levels], [o0], [math.log(CACHE_K[kind])]])
    g0, g_tau = held_gradients_prior(ran, w0)
    peak_mu = np.concatenate([[w0], [prior_mean(lv, "W", table) for lv in levels],
                              [a0], [prior_mean(lv, "A", table) for lv in levels], [g0]])
    speed_tau = np.concatenate([[INTERCEPT_TAU], [prior_tau(lv, "O", table) for lv in levels],
                                [INTERCEPT_TAU], [prior_tau(lv, "t", table) for lv in levels], [INTERCEPT_TAU] * 2])
    peak_tau = np.concatenate([[INTERCEPT_TAU], [prior_tau(lv, "W", table) for lv in levels],
                               [INTERCEPT_TAU], [prior_tau(lv, "A", table) for lv in levels], [g_tau]])

    speed = solve(lambda th: residuals_speed(th, spd, levels, y), speed_mu, speed_tau)
    peak = solve(lambda th: residuals_peak(th, ran, ooms, levels, p, limit), peak_mu, peak_tau)
    return Fit(levels, speed, peak)


def held_gradients_prior(ran: list[dict], w0: float) -> tuple[float, float]:
    """Where G sits and how far the data may move it: at the gradient bytes the trials counted
    (memory.breakdown), else a quarter of the static prior, loosely. Without the count, a few trials
    with accumulation and one small one without could pass their activations off as held gradients
    (an H200 sweep fitted 8 GiB of them for a model with 40 MiB of gradients)."""
    counted = [float(r["memory"]["breakdown"]["gradients"]) for r in ran
               if ((r.get("memory") or {}).get("breakdown") or {}).get("gradients")]
    if counted:
        return math.log(float(np.median(counted))), COUNTED_TAU
    return w0 - math.log(4), INTERCEPT_TAU


def static_and_activation_prior(ran: list[dict], limit: float | None) -> tuple[float, float]:
    """Where the memory intercepts' priors sit: from the trials' measured activation tensors where
    they were measured (memory.breakdown), else half of the largest peak each; with no peak at all,
    a third of the limit static and another third at batch 16."""
    if not ran:
        big = (limit or 2.0 ** 30) / 3
        return math.log(big), math.log(big / 16)
    top = max(ran, key=lambda r: float(r["peak_memory"]))
    measured = [r for r in ran if ((r.get("memory") or {}).get("breakdown") or {}).get("activations")]
    if measured:
        top = max(measured, key=lambda r: float(r["peak_memory"]))
        peak, activations = float(top["peak_memory"]), float(top["memory"]["breakdown"]["activations"])
        return math.log(max(peak - activations, peak / 10)), math.log(activations / top["config"]["batch_size"])
    return math.log(float(top["peak_memory"]) / 2), math.log(float(top["peak_memory"]) / 2 / top["config"]["batch_size"])


def residuals_speed(theta, rows, levels, y):
    if not rows:
        return np.zeros(0), np.zeros((0, len(theta)))
    X, (b, a) = design([r["config"] for r in rows], levels), structural([r["config"] for r in rows])
    mu, grad = speed_terms(theta, X, b, a)
    return (mu - y) / SPEED_SIGMA, grad / SPEED_SIGMA


def residuals_peak(theta, ran, ooms, levels, p, limit):
    res, jac = [np.zeros(0)], [np.zeros((0, len(theta)))]
    if ran:
        X, (b, a) = design([r["config"] for r in ran], levels), structural([r["config"] for r in ran])
        mu, grad = peak_terms(theta, X, b, a)
        res.append((mu - p) / PEAK_SIGMA)
        jac.append(grad / PEAK_SIGMA)
    if ooms:  # censored: only a prediction under the limit is wrong, by how far it is under
        X, (b, a) = design([r["config"] for r in ooms], levels), structural([r["config"] for r in ooms])
        mu, grad = peak_terms(theta, X, b, a)
        under = mu < math.log(limit)
        res.append(np.where(under, (mu - math.log(limit)) / PEAK_SIGMA, 0.0))
        jac.append(grad * (under / PEAK_SIGMA)[:, None])
    return np.concatenate(res), np.vstack(jac)


def solve(residuals, mu: np.ndarray, tau: np.ndarray, iterations: int = 40) -> Part:
    """Levenberg-Marquardt on the data residuals plus the prior's ((theta - mu) / tau)."""
    theta, damping = mu.copy(), 1e-3

    def loss_and_parts(th):
        r, J = residuals(th)
        r = np.concatenate([r, (th - mu) / tau])
        J = np.vstack([J, np.diag(1 / tau)])
        return float(r @ r), r, J

    loss, r, J = loss_and_parts(theta)
    for _ in range(iterations):
        H = J.T @ J
        step = np.linalg.solve(H + damping * np.diag(np.diag(H)), -J.T @ r)
        new_loss, new_r, new_J = loss_and_parts(theta + step)
        if new_loss < loss:
            theta, loss, r, J, damping = theta + step, new_loss, new_r, new_J, damping / 3
            if np.abs(step).max() < 1e-6:
                break
        else:
            damping *= 10
            if damping > 1e8:
                break
    return Part(theta, np.linalg.inv(J.T @ J))
