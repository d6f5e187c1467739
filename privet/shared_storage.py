"""Whether a simulation's ``ledger-dir`` is one storage on every node of a Ray cluster.

A simulated client keeps its privacy ledger in ``<ledger-dir>/client-<partition>.json``
(:mod:`client.profile`, :mod:`client.ledger_store`), read and written by whichever Ray actor
serves its message, on whichever node that actor lives. Where ``ledger-dir`` is a folder of
each machine's own disk, a client served on two nodes keeps two ledgers, each holding only the
rounds served there: every figure it declares and every budget check it makes is then short of
what it spent (issue #41: 17 of 20 clients over their budgets after two runs, the report
saying none was). So before a run on a cluster starts, :func:`ledger_dir_refusal` checks the
property itself, from every node:

1. the driver (``privet run``, on a node of the cluster) writes a probe file with a fresh
   random token into ``ledger-dir``;
2. on every alive node with CPUs (where Flower may place ClientApp actors), a zero-CPU Ray
   task pinned to that node (``NodeAffinitySchedulingStrategy(soft=False)``) reads the file
   and, if it holds the token, writes an answer file next to it;
3. the driver reads every answer file, then removes the probe files.

The folder is one storage only if every node read the token and the driver read every
answer: a folder of a node's own disk holds no such token (not even a stale one: the token is
new), and a node that cannot write there fails step 2. The check runs in a child process (a
Ray driver of its own, :data:`PROBE_TIMEOUT_S`), so that ``privet run`` never initialises Ray.

What it cannot see: a node that joins the cluster after the check (Flower sizes its pool from
the nodes alive at the start, so such a node gets actors only if it joins in the seconds
between the check and the pool's creation), and storage that stops being shared during a run.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

#: Seconds the whole check may take (connecting, one task per node, the answers).
PROBE_TIMEOUT_S = 120.0
#: Name of the driver's probe file (``.<token>`` appended); answers add ``.<node id>``.
PROBE_PREFIX = ".privet-storage-probe"


def ledger_dir_refusal(address: str, ledger_dir: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a run on the Ray cluster at ``address`` must not use ``ledger_dir`` (None: it may).

    ``""`` (no ``ledger-dir``: ledgers live in Flower's node state on the driver, for one run)
    needs no check. Prints one line when the folder was found shared.

    Returns
    -------
    str | None
        One line naming ``ledger-dir``, the node that does not share it and what to do.
    """
    if not ledger_dir:
        return None
    if not os.path.isabs(ledger_dir):
        return (f"ledger-dir={ledger_dir!r} is a relative path; on a Ray cluster it must be an absolute path that "
                "every node mounts at the same place (each node would resolve it in its own working directory)")
    folder = Path(ledger_dir)
    created = not folder.exists()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"ledger-dir={ledger_dir}: cannot create it on this machine ({exc.strerror})"
    try:
        result = probe(address, folder, timeout)
    finally:
        if created and not any(folder.iterdir()):
            folder.rmdir()
    if "error" in result:
        return (f"ledger-dir={ledger_dir} could not be checked on every node of the Ray cluster at {address} "
                f"({result['error']}); run without ledger-dir, or fix the cluster and retry")
    bad = [n for n in result["nodes"] if not (n["read"] and n["answered"])]
    if bad:
        node = bad[0]
        why = (node.get("error") or ("does not see the probe file" if not node["read"] else
                                     "saw the probe file but its answer is not visible here"))
        return (f"ledger-dir={ledger_dir} is not the same storage on every Ray node: node {node['ip']} {why} written "
                f"from {result['driver_ip']} ({len(bad)} of {len(result['nodes'])} nodes), so each client's privacy "
                "ledger would be split between the nodes that serve it; put ledger-dir on storage that every node "
                "mounts at this path (e.g. NFS), or leave it unset (budgets then last one run)")
    print(f"privet: ledger-dir {ledger_dir} is one storage on all {len(result['nodes'])} nodes of the Ray cluster "
          "(probe file written here, read and answered from each node)", flush=True)
    return None


def probe(address: str, folder: Path, timeout: float = PROBE_TIMEOUT_S) -> dict[str, Any]:
    """Run :func:`_probe_in_cluster` in a child process; its JSON result, or ``{"error": ...}``."""
    cmd = [sys.executable, "-m", "privet.shared_storage", address, str(folder)]
    env = {**os.environ, "RAY_ADDRESS": address}
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        _remove_probes(folder)
        return {"error": f"no answer within {timeout:.0f} s"}
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        _remove_probes(folder)
        last = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
        return {"error": last[:300]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _remove_probes(folder: Path) -> None:
    for path in folder.glob(f"{PROBE_PREFIX}.*"):
        path.unlink(missing_ok=True)


def _answer(folder: str, name: str, token: str, node_id: str) -> dict[str, Any]:
    """On one node: does ``folder/name`` hold ``token``? If so, answer in ``folder/name.<node_id>``."""
    path = Path(folder) / name
    try:
        read = path.read_text() == token
    except OSError:
        read = False
    answered = False
    error = ""
    if read:
        try:
            (Path(folder) / f"{name}.{node_id}").write_text(token)
            answered = True
        except OSError as exc:
            error = f"cannot write there ({exc.strerror})"
    return {"read": read, "written": answered, "error": error}


def _probe_in_cluster(address: str, folder: Path) -> dict[str, Any]:
    """Steps 1-3 of the module docstring, as a Ray driver connected to ``address``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False, configure_logging=False)
    try:
        token = secrets.token_hex(16)
        name = f"{PROBE_PREFIX}.{token[:12]}"
        (folder / name).write_text(token)
        here = ray.get_runtime_context().get_node_id()
        nodes = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0]
        answer = ray.remote(num_cpus=0, max_retries=0)(_answer)
        refs = [answer.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(str(folder), name, token, n["NodeID"]) for n in nodes]
        results = ray.get(refs)
        report = []
        for node, res in zip(nodes, results, strict=True):
            reply = folder / f"{name}.{node['NodeID']}"
            answered = res["written"] and reply.exists() and reply.read_text() == token
            report.append({"ip": node["NodeManagerAddress"], "node_id": node["NodeID"], "read": res["read"],
                           "answered": answered, "error": res["error"]})
        driver_ip = next((n["NodeManagerAddress"] for n in nodes if n["NodeID"] == here), "this machine")
        return {"driver_ip": driver_ip, "nodes": report}
    finally:
        _remove_probes(folder)
        ray.shutdown()


if __name__ == "__main__":
    print(json.dumps(_probe_in_cluster(sys.argv[1], Path(sys.argv[2]))), flush=True)
