"""``flwr run .`` as the README writes it trains a round's clients in parallel (issue 40, item 3).

Flower 1.39's simulation gives every ClientApp actor ``client-resources-num-cpus`` CPUs, 2 by
default: on a 2-core machine that is one actor, and a round's clients train one after another.
The README's command sets ``client-resources-num-cpus=1`` (what ``privet run`` uses). The check is
structural, not a timing: the clients of one round must be served by more than one ClientApp actor
(Ray prefixes every actor's log line with its pid), and all of them must train.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from privet.flower_sim import stop_local_superlink
from tests.privet.test_flwr_run_native import newest_run, user_shell

pytestmark = pytest.mark.slow

#: The README's command, at a smaller size (the federation flags are the README's).
README_FEDERATION = "num-supernodes={n} client-resources-num-cpus=1"
CLIENT_LINE = re.compile(r"\(ClientAppActor pid=(\d+)\).*?client (\S+) round (\d+) mode=")


def actors_per_round(log: str) -> dict[int, dict[str, str]]:
    """round -> {client id: pid of the actor that trained it}, from the streamed log."""
    rounds: dict[int, dict[str, str]] = {}
    for line in re.sub(r"\x1b\[[0-9;]*m", "", log).splitlines():
        if m := CLIENT_LINE.search(line):
            rounds.setdefault(int(m.group(3)), {})[m.group(2)] = m.group(1)
    return rounds


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="one CPU: Ray can run only one actor at a time")
def test_the_readme_command_trains_a_rounds_clients_on_several_actors(tmp_path):
    home, out, n = tmp_path / "home", tmp_path / "results", 4
    run_config = f"num-clients={n} num-server-rounds=2 max-examples-per-client=600 out-dir='{out}'"
    try:
        # RAY_DEDUP_LOGS=0: Ray would fold the clients' similar lines into one (and one pid)
        done = user_shell(f'RAY_DEDUP_LOGS=0 flwr run . --run-config "{run_config}" '
                          f'--federation-config "{README_FEDERATION.format(n=n)}" --stream', home)
        status = newest_run(home)
    finally:
        stop_local_superlink(home)
    log = done.stdout + done.stderr
    assert status["status"] == "finished:completed", f"{status}\n{log[-3000:]}"
    rounds = actors_per_round(log)
    assert sorted(rounds) == [1, 2], log[-3000:]
    for clients in rounds.values():
        assert sorted(clients) == [str(i) for i in range(n)]  # every client trained in every round
    assert max(len(set(clients.values())) for clients in rounds.values()) >= 2, rounds
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
