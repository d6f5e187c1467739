"""``privet audit --runtime flower`` (issue 37): canary clients inside a real run of the configured strategy.

The slow tests run the real ServerApp logic (:func:`server.app.run_experiment`) and the real ClientApp
on the in-process grid, every message through Flower's wire format, with a few hundred canary nodes
beside the config's three real clients: the honest ``update`` mechanism must not be flagged while its
attack sees the canaries (a positive lower bound, so that a dead attack cannot pass), and two broken
ones must be flagged through the run: noise at half σ (a test-only replacement of the mechanism the
client round builds) and ``noise-source = seeded`` with the server replaying the seed. The charge is
the canaries' ledgers', set against an independent accountant (Google's dp-accounting) and against
what the server recorded in the run's summary.json.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from client.work import canary_direction, canary_update
from privacy.mechanisms import WholeUpdate
from privet.audit_flower import audit_flower
from privet.cli import main
from privet.run_config import CliError
from protocol import keys
from protocol.train_config import TrainConfig

#: update mode, three real clients on a logistic regression, one round, every client's ε = 6.
SMALL = ["dp-mode=update", "num-server-rounds=1", "budget-distribution=constant", "epsilon=6.0", "num-clients=3",
         "max-examples-per-client=256", "model=logreg", "batch-size=32", "learning-rate=0.1", "momentum=0.0",
         "min-train-clients=1"]


def _dp_accounting_epsilon(history, delta):
    """ε of a history of whole releases (q = 1) under replace-one, by dp-accounting's PLD (not privet's)."""
    import dp_accounting
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import pld_privacy_accountant

    acct = pld_privacy_accountant.PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    for sigma, q, steps in history:
        event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        acct.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return acct.get_epsilon(delta)


# --------------------------------------------------------------------------- the canary node (fast)
def test_a_node_without_canary_keys_trains():
    assert canary_update({keys.NODE_PARTITION_ID: 0}, [np.zeros(3, dtype=np.float32)]) is None


def test_a_canary_update_is_its_sign_times_its_norm_along_the_seeds_direction():
    received = [np.zeros((4, 3), dtype=np.float32), np.zeros(5, dtype=np.float32)]
    node = {keys.NODE_AUDIT_CANARY_SEED: 7, keys.NODE_AUDIT_CANARY_SIGN: -1, keys.NODE_AUDIT_CANARY_NORM: 2.5}
    update = canary_update(node, received)
    assert update is not None and [u.shape for u in update] == [(4, 3), (5,)]
    assert [u.dtype for u in update] == [np.float32, np.float32]
    u = np.concatenate([d.ravel() for d in canary_direction(7, [(4, 3), (5,)])])
    flat = np.concatenate([x.ravel() for x in update]).astype(np.float64)
    assert np.linalg.norm(u) == pytest.approx(1.0)
    np.testing.assert_allclose(flat, -2.5 * u, rtol=1e-6)
    other = np.concatenate([d.ravel() for d in canary_direction(8, [(4, 3), (5,)])])
    assert abs(other @ u) < 0.9  # another seed, another direction


@pytest.mark.parametrize(("key", "value"), [(keys.NODE_AUDIT_CANARY_SEED, -1), (keys.NODE_AUDIT_CANARY_SEED, "x"),
                                            (keys.NODE_AUDIT_CANARY_SIGN, 0), (keys.NODE_AUDIT_CANARY_SIGN, True),
                                            (keys.NODE_AUDIT_CANARY_NORM, 0.0),
                                            (keys.NODE_AUDIT_CANARY_NORM, math.inf)])
def test_a_bad_canary_key_is_named(key, value):
    node = {keys.NODE_AUDIT_CANARY_SEED: 1, keys.NODE_AUDIT_CANARY_SIGN: 1, keys.NODE_AUDIT_CANARY_NORM: 2.0,
            key: value}
    with pytest.raises(ValueError, match=f"'{key}'"):
        canary_update(node, [np.zeros(2, dtype=np.float32)])


@pytest.mark.parametrize(("sets", "names"), [(["dp-mode=dpsgd"], "dpsgd"),
                                             (["dp-mode=update", "secure-aggregation=secagg+",
                                               "noise-multiplier=4.0", "noise-shares=4"], "secure-aggregation")])
def test_a_mechanism_not_audited_in_a_real_run_is_refused_in_one_line(sets, names):
    with pytest.raises(CliError, match=names) as err:
        audit_flower(None, sets, canaries=10)
    assert "\n" not in str(err.value)


def test_only_the_node_config_makes_a_client_a_canary(run_config_factory):
    """The threat model: the server may deviate, so canary keys it sends in the train config change nothing;
    the same keys in the node's own config make the round's work the canary update S·B·u."""
    from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from client.model_task import ModelTask, load_local_data
    from client.profile import resolve_profile
    from client.work import CanaryWork, ModelWork
    from protocol.run_settings import RunSettings
    from server.config import RunConfig
    from server.registry import train_config
    from tasks.models import build_model, get_weights

    cfg = run_config_factory(dp_mode="update")
    canary = {keys.NODE_AUDIT_CANARY_SEED: 5, keys.NODE_AUDIT_CANARY_SIGN: 1, keys.NODE_AUDIT_CANARY_NORM: 2.0}
    node = {keys.NODE_PARTITION_ID: 0, keys.NODE_NUM_PARTITIONS: 3}
    profile = resolve_profile(node, cfg)
    data, classes = load_local_data(profile, RunSettings.of(cfg))
    weights = get_weights(build_model("logreg", input_shape=tuple(data.x.shape[1:]), num_classes=classes))
    record = train_config(RunConfig.from_flower(cfg))
    record[keys.SERVER_ROUND] = 1
    sent = ConfigRecord({**record, **canary})  # a server that tries to make this client a canary
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    msg = Message(RecordDict({keys.ARRAYS: ArrayRecord(weights), keys.CONFIG: sent}), dst_node_id=1,
                  message_type="train")
    train = TrainConfig.decode(sent)

    def work(node_config):
        context = Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(), run_config=cfg)
        return ModelTask(msg, context, resolve_profile(node_config, cfg), train).work(seed=1)

    assert isinstance(work(node), ModelWork)
    own = work({**node, **canary})
    assert isinstance(own, CanaryWork)
    u = np.concatenate([d.ravel() for d in canary_direction(5, [w.shape for w in weights])])
    np.testing.assert_allclose(np.concatenate([x.ravel() for x in own.update]), 2.0 * u, rtol=1e-6, atol=1e-9)


def test_the_command_line_refuses_an_unsupported_mechanism_with_status_2(capsys):
    rc = main(["audit", "--runtime", "flower", "--set", "dp-mode=dpsgd", "--canaries", "10"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("privet")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("privet: error: --runtime flower") and "dpsgd" in err[0]


# --------------------------------------------------------------------------- real runs (slow)
@pytest.mark.slow
def test_honest_update_mode_in_a_real_run_sees_its_canaries_and_is_not_flagged(tmp_path):
    """Two rounds, 400 canaries: not flagged, a positive white-box bound, and the charge the ledgers record."""
    out = tmp_path / "audit"
    report = audit_flower(None, [*SMALL, "num-server-rounds=2"], out=out, canaries=400, seed=11)
    views = {a.view: a for a in report.audits}
    assert set(views) == {"upload", "final-model"} and not report.flagged, report.lines()
    upload = views["upload"].result
    assert 0.5 < upload.lower_bound <= upload.charged_epsilon, upload.line()
    assert upload.releases == 2 * 400 and views["upload"].releases_per_canary == 2
    # the charge: every canary's ledger, the client's own calibration to its budget over T = 2 rounds
    (sigma, rate, steps), = upload.history
    assert (rate, steps) == (1.0, 2) and sigma == pytest.approx(views["upload"].noise_multiplier)
    assert all(e == pytest.approx(upload.charged_epsilon, rel=1e-12) for e in report.ledger_epsilons)
    assert upload.charged_epsilon == pytest.approx(6.0, rel=1e-3) and upload.charged_epsilon <= 6.0 * (1 + 1e-9)
    assert upload.charged_epsilon == pytest.approx(_dp_accounting_epsilon(upload.history, upload.delta), rel=1e-5)
    # what the server recorded of each canary (its replies) agrees with the canaries' ledgers
    summary = json.loads((out / "summary.json").read_text())
    canaries = [c for c in summary["clients"] if str(c["client_id"]).startswith("canary-")]
    assert len(canaries) == 400
    assert all(c["epsilon_spent"] == pytest.approx(upload.charged_epsilon, rel=1e-9) for c in canaries)
    record = json.loads((out / "audit.json").read_text())
    assert record["runtime"] == "flower" and not record["flagged"]
    assert [a["view"] for a in record["audits"]] == ["upload", "final-model"]
    # the run's own summary, report and page carry the audit's figures
    section = summary["audit"]
    assert not section["flagged"] and section["settings"]["runtime"] == "flower"
    assert [m["line"] for m in section["mechanisms"]] == [a["line"] for a in record["audits"]]
    assert "Empirical privacy audit" in (out / "privacy_report.md").read_text()
    assert "Empirical privacy audit" in (out / "report.html").read_text()


class HalfSigma(WholeUpdate):
    """Test-only: adds noise at half the σ it reports and charges."""

    def privatize(self, received, trained, release, noise):
        return super().privatize(received, trained, replace(release, noise_multiplier=release.noise_multiplier / 2),
                                 noise)


@pytest.mark.slow
def test_noise_at_half_sigma_is_flagged_through_the_real_run(monkeypatch):
    """Every client round (canaries' included) runs a WholeUpdate that adds half the σ it charges."""
    real = TrainConfig.mechanism

    def broken(self, **kwargs):
        mechanism = real(self, **kwargs)
        assert type(mechanism) is WholeUpdate
        return HalfSigma(mechanism.clip, mechanism.noise_multiplier, mechanism.calibration,
                         noise_shares=mechanism.noise_shares)

    monkeypatch.setattr(TrainConfig, "mechanism", broken)
    report = audit_flower(None, SMALL, canaries=500, seed=12)
    upload = {a.view: a for a in report.audits}["upload"]
    assert upload.flagged, upload.line()
    assert upload.line().startswith("FLAGGED update (upload):")
    assert upload.result.charged_epsilon == pytest.approx(6.0, rel=1e-3)  # the charge is the honest one


@pytest.mark.slow
def test_seeded_noise_with_the_server_knowing_the_seed_is_flagged_with_exit_status_1(tmp_path, capsys):
    """noise-source = seeded: the server regenerates each client's noise from the run seed and removes it, from
    each canary's upload (white-box) and from the released model's FedAvg means (black-box): both views flag."""
    out = tmp_path / "audit"
    sets = [arg for s in [*SMALL, "noise-source=seeded"] for arg in ("--set", s)]
    rc = main(["audit", *sets, "--runtime", "flower", "--canaries", "300", "--seed", "13", "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("privet")]
    record = json.loads((out / "audit.json").read_text())
    views = {a["view"]: a for a in record["audits"]}
    assert rc == 1 and views["upload"]["flagged"] and views["upload"]["noise_source"] == "seeded"
    assert views["final-model"]["flagged"], views["final-model"]["line"]
    assert err == [f"privet: audit: {views[v]['line']}" for v in ("upload", "final-model")]
    assert err[1].startswith("privet: audit: FLAGGED update (final-model):")
