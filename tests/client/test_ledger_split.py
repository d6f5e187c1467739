"""A client never charges a ledger file that lacks what its run already recorded (client/ledger_split.py).

The real ClientApp trains round 1 with ``ledger-dir`` set; round 2 of the same run (the same
Context, as Flower's simulation hands it to whichever Ray actor serves the message) then finds
the file as another machine's disk would hold it: absent (a node-local folder it never wrote),
or an older copy. Either way it refuses, and charges nothing; with the file intact it trains.
"""

from __future__ import annotations

import shutil

from client.app import app as client_app
from privacy.ledger import PrivacyLedger
from tests.system.test_threat_model import _context, _global_arrays, _message


def _cfg(run_config_factory, tmp_path) -> dict:  # noqa: ANN001
    return run_config_factory(budget_distribution="constant", epsilon=50.0, noise_multiplier=1.0,
                              ledger_dir=str(tmp_path / "ledgers"), num_clients=3)


def test_round_2_on_a_machine_without_the_ledger_file_is_refused(run_config_factory, tmp_path):
    cfg = _cfg(run_config_factory, tmp_path)
    arrays, context = _global_arrays(cfg), _context(cfg)
    assert not client_app(_message(cfg, arrays, server_round=1), context).has_error()
    path = tmp_path / "ledgers" / "client-0.json"
    shutil.move(path, tmp_path / "node-a.json")  # the next machine's folder holds no file
    reply = client_app(_message(cfg, arrays, server_round=2), context)
    assert reply.has_error() and reply.error.reason.startswith("config-error: ledger-split:"), reply.error.reason
    assert "holds 0 release(s) of run 7, but this run has recorded 1" in reply.error.reason
    assert not path.exists(), "nothing was charged on the other machine's copy"


def test_an_older_copy_of_the_ledger_is_refused_and_the_file_of_record_is_not(run_config_factory, tmp_path):
    cfg = _cfg(run_config_factory, tmp_path)
    arrays, context = _global_arrays(cfg), _context(cfg)
    path = tmp_path / "ledgers" / "client-0.json"
    assert not client_app(_message(cfg, arrays, server_round=1), context).has_error()
    after_1 = path.read_text()
    assert not client_app(_message(cfg, arrays, server_round=2), context).has_error()  # the file of record: trains
    after_2 = path.read_text()
    assert PrivacyLedger.from_json(after_2).releases_in_run(7) == 2
    path.write_text(after_1)  # a copy as of round 1 (a machine that served round 1 only)
    reply = client_app(_message(cfg, arrays, server_round=3), context)
    assert reply.has_error() and "ledger-split" in reply.error.reason, reply.error.reason
    assert path.read_text() == after_1, "the stale copy was not charged"
    # a new run (a new Context: nothing recorded yet) starts from the file, whatever it holds
    fresh = _context(cfg)
    assert not client_app(_message(cfg, arrays, server_round=1), fresh).has_error()
