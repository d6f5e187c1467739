"""A ledger file that lacks what this run already recorded is not the client's ledger: refuse.

A client's durable ledger is one file (``ledger-path``, or ``<ledger-dir>/client-<partition>.json``
in simulation); the node state (``context.state``) holds the same ledger as of the last message
of this run (:mod:`client.ledger_store` writes both). Flower keeps a simulated client's state in
the simulation process and hands it to whichever Ray actor serves the next message, on whichever
node; a deployed SuperNode keeps it in its own memory. So when the file holds *fewer* releases of
this run than the state, the file read here is not the one this run has been writing: another
node's copy of a folder that is not shared (issue #41), a file restored or replaced during the
run. Charging it would compose the client's ε over part of its history only; the message is
refused instead (``config-error``: a rejection the server logs with this reason).

``privet run`` checks a ``ledger-dir`` on every node of a Ray cluster before a run
(:mod:`privet.shared_storage`); this is the client's own check, for every message, wherever the
run came from (``flwr run .`` included). It sees a split from the second release of a run on: a
split across runs (a later run starting from a node's stale copy) is for the start-up check.
"""

from __future__ import annotations

from privacy.ledger import PrivacyLedger

#: Prefix of the refusal's reason.
LEDGER_SPLIT = "ledger-split"


def refuse_split(from_file: PrivacyLedger, this_run: PrivacyLedger, path: str, run_id: int) -> None:
    """Raise if the file's ledger lacks releases of run ``run_id`` that the run's state recorded.

    Parameters
    ----------
    from_file : PrivacyLedger
        The ledger read from ``path``.
    this_run : PrivacyLedger
        The ledger in the node state, as stored after this run's last message.

    Raises
    ------
    ValueError
        ``ledger-split: ...`` naming the file and both counts.
    """
    recorded, on_file = this_run.releases_in_run(run_id), from_file.releases_in_run(run_id)
    if on_file < recorded:
        raise ValueError(
            f"{LEDGER_SPLIT}: the privacy ledger {path} holds {on_file} release(s) of run {run_id}, but this run "
            f"has recorded {recorded}: it is not the file this run has been writing (a ledger folder that is not "
            "the same storage on every machine serving this client?); refusing rather than charging a partial "
            "history")
