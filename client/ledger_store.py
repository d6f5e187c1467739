"""Where a client's privacy ledger lives between messages, rounds, runs and restarts.

Two stores, one truth: the node's ``context.state`` (survives rounds of one run, also in
deployment where each message runs in a fresh process) and, when the operator sets
``ledger-path`` in the node config (or a simulation sets ``ledger-dir``), a JSON file
written atomically (survives restarts and later runs: a budget is for the client's data,
not for one run). When both exist the file wins, since it is the durable record.

One writer per ledger file: :func:`ledger_lock` holds an exclusive OS lock (``flock`` on a
sibling ``.lock`` file) around load → plan → train → charge → save, so two runs served by
the same node serialise and neither can release a model its ledger did not record.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from flwr.app import ConfigRecord, Context

from client.ledger_split import refuse_split
from client.profile import ClientProfile
from privacy.ledger import PrivacyLedger

STATE_KEY = "privet.ledger"
_JSON = "json"

#: How long a message waits for another run to release the node's ledger before refusing.
LOCK_TIMEOUT_S = 120.0

log = logging.getLogger("privet.client")


class LedgerBusy(RuntimeError):
    """Another process held the ledger for longer than :data:`LOCK_TIMEOUT_S`."""


@contextmanager
def ledger_lock(profile: ClientProfile, timeout: float = LOCK_TIMEOUT_S) -> Iterator[None]:
    """Hold the exclusive lock of the client's ledger file (a no-op without a file).

    Raises
    ------
    LedgerBusy
        If the lock is not free within ``timeout`` seconds.
    """
    if not profile.ledger_path:
        yield
        return
    lock_path = Path(profile.ledger_path).with_name(Path(profile.ledger_path).name + ".lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise LedgerBusy(
                        f"privacy ledger {profile.ledger_path} is in use by another run on this node "
                        f"for more than {timeout:.0f}s; try again when it has finished"
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def load_ledger(profile: ClientProfile, context: Context, accountant: str) -> PrivacyLedger:
    """The client's ledger: the durable file if configured, else the node state, else new."""
    if profile.ledger_path:
        ledger = PrivacyLedger.load_or_create(
            profile.ledger_path,
            epsilon_budget=profile.epsilon_budget,
            delta=profile.delta,
            accountant=accountant,
        )
        if STATE_KEY in context.state:  # this run's record: the file must hold it (client/ledger_split.py)
            refuse_split(ledger, PrivacyLedger.from_json(str(context.state[STATE_KEY][_JSON])),
                         profile.ledger_path, int(context.run_id))
        return ledger
    if not profile.simulated:
        log.warning("client %s has no 'ledger-path' in its node config: its privacy budget is kept only "
                    "for this run and starts again at zero in the next one", profile.client_id)
    if STATE_KEY in context.state:
        record = context.state[STATE_KEY]
        assert isinstance(record, ConfigRecord)  # only this module writes the key
        return PrivacyLedger.from_json(str(record[_JSON]))
    return PrivacyLedger.load_or_create(
        None, epsilon_budget=profile.epsilon_budget, delta=profile.delta, accountant=accountant
    )


def store_ledger(ledger: PrivacyLedger, profile: ClientProfile, context: Context) -> None:
    """Persist the ledger in the node state and, if configured, atomically on disk."""
    context.state[STATE_KEY] = ConfigRecord({_JSON: ledger.to_json()})
    if profile.ledger_path:
        ledger.save(profile.ledger_path)
