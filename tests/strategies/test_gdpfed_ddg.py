"""GDPFed+ with ``secure-aggregation = "secagg+ddg"``: each group one discrete Gaussian secure sum.

A real in-process run (the ClientApp's secure-sum mod, the exact sampler, the strategy): every
member charges its group's run once by KLS's curve at the sum's parameters amplified by Poisson
sampling (the ledger step :class:`privacy.poisson_rdp.DDGPoissonStep`), σ_m is calibrated so that
each client spends at most its budget, and the server's recomputation matches. Checked against the
bound written out apart (tests/privacy/test_poisson_rdp.py) at parameters rebuilt here from the plan.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from flwr.app import Message, MetricRecord, RecordDict

from client.app import app as client_app
from client.ledger_store import STATE_KEY
from privacy.distributed_discrete_gaussian import ddg_parameters
from privacy.ledger import PrivacyLedger
from privacy.poisson_rdp import DDGPoissonStep
from privet.inprocess import InProcessGrid, simulation_node_configs
from protocol import keys
from server.app import run_experiment
from strategies.secagg_config import DEFAULT_BETA
from tests.privacy.test_poisson_rdp import reference_ddg_poisson_epsilon

CLIENTS, ROUNDS, BITS, DIM = 30, 3, 16, 7850  # logreg on Fashion-MNIST


def _run(run_config_factory: Any, hook: Any = None, **overrides: Any) -> tuple[dict[str, Any], InProcessGrid,
                                                                              dict[str, Any]]:
    cfg = run_config_factory(**{"strategy": "gdpfed-plus", "num-clients": CLIENTS, "budget-distribution": "groups",
                                "num-server-rounds": ROUNDS, "max-examples-per-client": 32, "batch-size": 8,
                                "local-epochs": 1, "gdpfed.q": 0.3, "gdpfed.sample-rates": "0.2, 0.3, 0.4",
                                "secure-aggregation": "secagg+ddg",
                                "accountant": "rdp", "secagg.bits": BITS, **overrides})
    grid = InProcessGrid(client_app, simulation_node_configs(CLIENTS), cfg, reply_hook=hook)
    return run_experiment(grid, cfg, run_id=1), grid, cfg


@pytest.mark.slow
def test_gdpfed_plus_runs_with_discrete_gaussian_group_sums_within_every_budget(run_config_factory):
    summary, grid, cfg = _run(run_config_factory)
    assert summary["rounds_completed"] == ROUNDS and not summary["failed_rounds"]
    assert summary["group_dp"]["aggregation"].startswith("secure aggregation")
    plan = summary["group_dp"]["plan"]
    rows = [json.loads(line) for line in (Path(cfg["out-dir"]) / "rounds.jsonl").read_text().splitlines()[1:]]
    for row in rows:  # one released discrete Gaussian sum per group, with all r_m members
        sums = row["secure_sums"]
        assert [s["survivors"] for s in sums] == [r for r in plan["counts"] if r > 0]
        assert all(s["released"] and s["mode"] == "secagg+ddg" for s in sums)
    # each group's step, rebuilt from the plan as the sum builds it, recomputed apart
    steps, references = [], []
    for sigma, r, q, eps in zip(plan["sigmas"], plan["counts"], plan["sample_rates"], plan["epsilons"],
                                strict=True):
        params = ddg_parameters(clip=cfg["clip"], dim=DIM, bits=BITS, noise_multiplier=sigma, noise_shares=r,
                                max_members=r, beta=DEFAULT_BETA)
        step = DDGPoissonStep(float(params.local_sigma_sq), params.norm_bound_sq, params.padded_dim, r, r, q, ROUNDS)
        reference = reference_ddg_poisson_epsilon(step, cfg["delta"])
        # calibrated: within the group's budget, and not far below it (the search's 1e-3 in sigma)
        assert 0.97 * eps < reference <= eps * (1 + 1e-9)
        steps.append(step)
        references.append(reference)
    joined = 0
    for c in summary["clients"]:
        assert c["within_budget"]
        if not c["epsilon_spent"]:
            continue
        joined += 1
        assert c["epsilon_spent"] in [pytest.approx(x, rel=1e-9) for x in references]
        assert c["epsilon_server_recomputed_this_run"] == pytest.approx(c["epsilon_spent"], rel=1e-9)
    assert joined >= 6
    # the report's sentence comes from the mechanism of each client's last accepted round (server/results.py):
    # every client that released names its group's discrete Gaussian share, sampled in the last round or not
    for c in summary["clients"]:
        if c["epsilon_spent"]:
            assert "Poisson sampling" in c["guarantee"] and "discrete Gaussian" in c["guarantee"], c
    for ctx in grid.contexts.values():
        if STATE_KEY not in ctx.state:
            continue
        ledger = PrivacyLedger.from_json(str(ctx.state[STATE_KEY]["json"]))
        if not ledger.curves:
            continue
        (charged,) = ledger.curves  # the group's whole run, charged once however often it was sampled
        assert charged in steps and not ledger.history
        assert ledger.spent() <= ledger.epsilon_budget


@pytest.mark.slow
def test_a_claim_below_the_servers_recomputation_is_refused(run_config_factory):
    """The server recomputes the curve step from the sum it set up; a member claiming less ε is dropped."""
    def hook(node: int, request: Message, reply: Message) -> Message:
        cfg = request.content[keys.CONFIG] if keys.CONFIG in request.content.config_records else {}
        if request.metadata.message_type != "train" or reply.has_error() or keys.METRICS not in \
                reply.content.metric_records or cfg.get(keys.GROUP_INDEX) != 3 or cfg.get(keys.SERVER_ROUND) != 1:
            return reply
        metrics = dict(reply.content[keys.METRICS])
        metrics[keys.EPSILON_SPENT] = float(metrics[keys.EPSILON_SPENT]) * 0.9
        content = RecordDict({**dict(reply.content.array_records), **dict(reply.content.config_records),
                              keys.METRICS: MetricRecord(metrics)})
        return Message(content, reply_to=request)

    summary, _, _ = _run(run_config_factory, hook=hook, **{"num-server-rounds": 1})
    rejected = [c for c in summary["clients"] if c["rejections"]]
    assert rejected and len(rejected) == summary["group_dp"]["plan"]["counts"][2]
    for c in rejected:
        assert all("below the" in r["reason"] and "imply" in r["reason"] for r in c["rejections"])
