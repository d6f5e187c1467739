"""The scale benchmark's two-node row: the same work on a Ray cluster of one node and of two.

``bench_scale.py``'s Ray simulation work (N clients of 10 examples, ``sampled`` per round, ``cnn2``,
DP-SGD batch 10, the same ``--set`` keys: ``bench_scale.run_sets``) run by ``privet run`` joining an
existing Ray cluster (``RAY_ADDRESS``, docs/ray-cluster.md), built in network namespaces on this
host by ``tests/ray_netns.py``:

- **one node**: a Ray head with 2 CPUs (2 ClientApp actors), the worker machine off;
- **two nodes**: a head with 1 CPU and a worker node with 1 CPU (2 actors, one per node), the worker
  seeing only its own ``/tmp`` (so not the app folder Flower installed on the head);

with ``ledger-dir`` on storage both nodes see (a folder outside the head's private ``/tmp`` part),
as the doc requires, in both. The two are alternated within the run, a fresh cluster each time.
Both "nodes" are processes of this one machine, on the same cores: the two-node row measures what
spreading the clients over two Ray nodes costs (transfers, remote scheduling), not extra compute.

Per run, from the run's ``rounds.jsonl`` and the namespaces (sampled every 0.1 s, charged to the
moment each round's line appears):

- **per round**: the mean wall time of rounds 2..R (round 1 holds the budget handshake);
- **CPU per round, per node**: user + system seconds over rounds 2..R of each node's process trees
  (``benchmarks/proc_tree.py``): the head is its ``ray start`` tree (GCS, raylet, its workers) plus the
  ``privet run`` tree (SuperLink, ``flwr-simulation``: the Ray driver and the ServerApp), the worker is
  its ``ray start`` tree (raylet, its workers);
- **between nodes**: bytes through the veth pair joining the namespaces (the head's ``eth0``
  counters, both directions: every byte Ray moved between the nodes, objects and control);
- **where the time goes**: Ray's own task events, read from the GCS after the run (the
  state timestamps of every ``ClientAppActor.run`` task: created, submitted to the actor, its
  arguments fetched, running, finished; the actors' creation tasks), against the round
  boundaries. Per round, the wall time splits into *before* (the server, from the previous
  round's line to its first client task: sampling, building messages), the *client phase* (first
  task created to last task finished) and *after* (last task finished to the round's line:
  collecting the last reply, aggregation (the round's ``aggregation_seconds``), evaluation on
  10,000 test images). Within the client phase, summed over the round's tasks (actor-seconds): to
  the actor (created until its arguments are on the actor's node and it starts: Ray's
  ``SUBMITTED_TO_WORKER`` and ``PENDING_ACTOR_TASK_ARGS_FETCH``), running (the ClientApp's code:
  loading the model, DP-SGD, the reply), and idle (actors x phase minus both: an actor waiting for
  Flower's pool to hand it the next message, which includes pulling the previous reply to the driver).

The task events come from Ray's GCS through ``ray._private.state`` (Ray 2.55.1's private API; this
venv has no Ray dashboard, so no public state API).

Usage (root, for ``ip netns``; about 4 minutes per run at N = 200 on the shared 2-core machine)::

    nice -n 10 python benchmarks/bench_scale_two_node.py --n 200 --sampled 20 --rounds 3 --reps 2
    python benchmarks/bench_scale_two_node.py --render benchmarks/results/scale_two_node.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_scale import run_sets  # noqa: E402
from proc_tree import tree_cpu_seconds  # noqa: E402
from records import machine, write  # noqa: E402

from tests.deploy_support import netns_unavailable, ns_prefix  # noqa: E402
from tests.ray_netns import HEAD_ADDR, RAY_ADDRESS, WORKER_ADDR, RayNetnsCluster, ray_cluster  # noqa: E402

#: variant -> (head CPUs, worker CPUs): 2 ClientApp actors in both
VARIANTS = {"one node": (2, 0), "two nodes": (1, 1)}
ACTORS = 2
#: CPU groups: the ``privet run`` tree (SuperLink, flwr-simulation: the ServerApp and the Ray driver),
#: the head's ``ray start`` tree (GCS, raylet, its ClientApp actors), the worker's ``ray start`` tree
GROUPS = ("server", "head", "worker")
PHASES = ("before", "phase", "after")


def veth_bytes(pid: int) -> int:
    """Bytes received + sent on ``eth0`` of the network namespace of ``pid`` (/proc/PID/net/dev)."""
    for line in Path(f"/proc/{pid}/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "eth0":
            fields = counters.split()
            return int(fields[0]) + int(fields[8])
    return 0


@dataclass
class NodeWatch:
    """Samples, every ``interval`` s, each group's CPU seconds (the sum over its process trees) and
    the veth bytes; at each new line of ``marks``, records the wall-clock time and those figures."""

    roots: dict[str, int]  # group -> root of its process tree
    net_pid: int  # a process in the head's namespace
    marks: Path
    interval: float = 0.1
    mark_times: list[float] = field(default_factory=list)  # time.time()
    mark_cpu: list[dict[str, float]] = field(default_factory=list)
    mark_bytes: list[int] = field(default_factory=list)
    series: list[tuple[float, dict[str, float]]] = field(default_factory=list)  # every sample

    def cpu_at(self, when: float) -> dict[str, float]:
        """Each group's CPU seconds at the last sample at or before ``when``."""
        i = bisect.bisect_right([t for t, _ in self.series], when)
        return self.series[max(i - 1, 0)][1]

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._last_cpu: dict[str, float] = dict.fromkeys(self.roots, 0.0)
        self._last_bytes = 0

    def __enter__(self) -> NodeWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        seen = 0
        while not self._stop.is_set():
            now = time.time()
            for group, root in self.roots.items():
                # a tree that is gone reads 0: keep the last figure (CPU seconds only grow)
                self._last_cpu[group] = max(self._last_cpu[group], tree_cpu_seconds(root))
            self.series.append((now, dict(self._last_cpu)))
            try:
                self._last_bytes = veth_bytes(self.net_pid)
            except OSError:
                pass
            try:
                lines = self.marks.read_bytes().count(b"\n")
            except OSError:
                lines = 0
            while seen < lines:
                self.mark_times.append(now)
                self.mark_cpu.append(dict(self._last_cpu))
                self.mark_bytes.append(self._last_bytes)
                seen += 1
            self._stop.wait(self.interval)


def dump_task_events() -> None:
    """In a driver of the cluster: print as JSON every task's state timestamps (seconds since the
    epoch), node, type and name, and the nodes (id -> address), from the GCS's task events."""
    import logging

    import ray
    from ray._private.state import state
    from ray.core.generated import common_pb2, gcs_pb2

    ray.init(address=RAY_ADDRESS, logging_level=logging.ERROR, log_to_driver=False)
    time.sleep(2.0)  # task events reach the GCS every second
    tasks: dict[str, dict[str, Any]] = {}
    for raw in state._connect_and_get_accessor().get_task_events():
        ev = gcs_pb2.TaskEvents.FromString(raw)  # type: ignore[attr-defined]
        t = tasks.setdefault(f"{ev.task_id.hex()}:{ev.attempt_number}", {"ts": {}})
        if ev.HasField("task_info"):
            t["type"] = common_pb2.TaskType.Name(ev.task_info.type)  # type: ignore[attr-defined]
            t["name"] = ev.task_info.func_or_class_name
            t["actor"] = ev.task_info.actor_id.hex()
        if ev.HasField("state_updates"):
            su = ev.state_updates
            status = common_pb2.TaskStatus  # type: ignore[attr-defined]
            t["ts"].update({status.Name(k): v / 1e9 for k, v in su.state_ts_ns.items()})
            if su.node_id:
                t["node"] = su.node_id.hex()
    nodes = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    print(json.dumps({"nodes": nodes, "tasks": list(tasks.values())}))


def task_events(cluster: RayNetnsCluster) -> list[dict[str, Any]]:
    """The cluster's ClientApp tasks (actor creations and ``run`` calls), each with its node's address."""
    out = subprocess.run([*ns_prefix(cluster.head_ns), sys.executable, __file__, "--task-events"], env=cluster.env,
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"reading Ray's task events failed:\n{out.stderr[-3000:]}")
    data = json.loads(out.stdout.strip().splitlines()[-1])
    mine = [t for t in data["tasks"] if t.get("name", "").startswith("ClientAppActor") and "FINISHED" in t["ts"]]
    # an actor's creation task carries no node in its events: the node of the actor's calls
    actor_node = {t["actor"]: t["node"] for t in mine if t.get("node")}
    return [{**t, "node": data["nodes"].get(t.get("node") or actor_node.get(t.get("actor", ""), ""), "?")}
            for t in mine]


def _started(ts: dict[str, float]) -> float:
    """When a task started running (Ray may fold a short task's RUNNING into the next report)."""
    for state in ("RUNNING", "PENDING_ACTOR_TASK_ORDERING_OR_CONCURRENCY", "SUBMITTED_TO_WORKER"):
        if state in ts:
            return ts[state]
    return ts["FINISHED"]


def breakdown(tasks: list[dict[str, Any]], watch: NodeWatch, rows: list[dict], rounds: int) -> dict[str, float]:
    """Where each round's wall time and CPU go (module docstring), mean over rounds 2..R;
    ``watch.mark_times[k]``: when round k's line appeared (``[0]``: the initial evaluation's)."""
    marks = watch.mark_times
    runs = [t for t in tasks if t["type"] == "ACTOR_TASK"]
    parts: dict[str, list[float]] = {k: [] for k in (
        "before_s", "phase_s", "after_s", "aggregation_s", "to_actor_s", "running_s", "idle_s", "tasks",
        "tasks_on_worker", *(f"cpu_{phase}_{g}_s" for phase in PHASES for g in GROUPS))}
    for k in range(2, rounds + 1):
        start, end = marks[k - 1], marks[k]
        mine = [t for t in runs if start <= t["ts"]["PENDING_ARGS_AVAIL"] < end]
        if not mine:
            continue
        first = min(t["ts"]["PENDING_ARGS_AVAIL"] for t in mine)
        last = max(t["ts"]["FINISHED"] for t in mine)
        to_actor = sum(_started(t["ts"]) - t["ts"]["PENDING_ARGS_AVAIL"] for t in mine)
        running = sum(t["ts"]["FINISHED"] - _started(t["ts"]) for t in mine)
        parts["before_s"].append(first - start)
        parts["phase_s"].append(last - first)
        parts["after_s"].append(end - last)
        parts["aggregation_s"].append(next(r["aggregation_seconds"] for r in rows if r["round"] == k))
        parts["to_actor_s"].append(to_actor)
        parts["running_s"].append(running)
        parts["idle_s"].append(ACTORS * (last - first) - to_actor - running)
        parts["tasks"].append(len(mine))
        parts["tasks_on_worker"].append(sum(t["node"] == WORKER_ADDR for t in mine))
        at = [watch.cpu_at(x) for x in (start, first, last, end)]
        for i, phase in enumerate(PHASES):
            for g in GROUPS:
                parts[f"cpu_{phase}_{g}_s"].append(at[i + 1].get(g, 0.0) - at[i].get(g, 0.0))
    out = {k: statistics.fmean(v) if v else float("nan") for k, v in parts.items()}
    creations = [t for t in tasks if t["type"] == "ACTOR_CREATION_TASK"]
    for node, tag in ((HEAD_ADDR, "head"), (WORKER_ADDR, "worker")):
        took = [t["ts"]["FINISHED"] - min(t["ts"].values()) for t in creations if t["node"] == node]
        out[f"actor_start_{tag}_s"] = max(took) if took else float("nan")
    return out


def run_once(variant: str, n: int, sampled: int, rounds: int, work: Path) -> dict[str, Any]:
    """One ``privet run`` on a fresh cluster of this variant; its figures (module docstring)."""
    head_cpus, worker_cpus = VARIANTS[variant]
    tag = variant.replace(" ", "-")
    run_dir = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=work))
    ledgers = run_dir / "ledgers"  # outside the head's private /tmp part: one storage for both nodes
    sets = {**run_sets(n, sampled, rounds), "ledger-dir": str(ledgers)}
    out = run_dir / "r"
    with ray_cluster(run_dir / "logs", head_cpus=head_cpus, worker_cpus=worker_cpus) as cluster:
        assert cluster.head_proc is not None
        started = time.perf_counter()
        run, log = cluster.start_run(sets, out, "privet-run")
        roots = {"server": run.pid, "head": cluster.head_proc.pid}
        if cluster.worker_proc is not None:
            roots["worker"] = cluster.worker_proc.pid
        with NodeWatch(roots, cluster.head_proc.pid, out / "rounds.jsonl") as watch:
            code = run.wait(timeout=3600)
        wall = time.perf_counter() - started
        if code != 0:
            raise RuntimeError(f"{variant}: privet run exited {code}\n{log.read_text(errors='replace')[-4000:]}")
        tasks = task_events(cluster)
    rows = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["round"] >= 1]
    if any(r["dropped"] or r["rejected"] or len(r["accepted"]) != sampled for r in rows):
        raise RuntimeError(f"{variant}: a round lost clients: {[(r['dropped'], r['rejected']) for r in rows]}")
    elapsed = [r["elapsed_seconds"] for r in rows]
    per_round = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
    cpu = watch.mark_cpu
    span = rounds - 1
    result: dict[str, Any] = {
        "variant": variant, "n": n, "sampled": sampled, "wall_s": wall,
        "handshake_s": rows[0].get("handshake_seconds", float("nan")),
        "per_round_s": statistics.fmean(per_round),
        **{f"cpu_{g}_s": (cpu[rounds].get(g, 0.0) - cpu[1].get(g, 0.0)) / span for g in GROUPS},
        "net_mb": (watch.mark_bytes[rounds] - watch.mark_bytes[1]) / span / 1e6,
        "net_run_mb": watch.mark_bytes[-1] / 1e6,
        "model_mb": (rows[-1]["bytes_down"] + rows[-1]["bytes_up"]) / 1e6,
        **breakdown(tasks, watch, rows, rounds),
    }
    result["cpu_s"] = sum(result[f"cpu_{g}_s"] for g in GROUPS)
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def _cell(values: list[float], fmt: str) -> str:
    values = [v for v in values if v == v]  # not NaN
    if not values:
        return "-"
    mid = statistics.median(values)
    if len(values) == 1:
        return format(mid, fmt)
    return f"{format(mid, fmt)} [{format(min(values), fmt)}-{format(max(values), fmt)}]"


def render(record: dict) -> str:
    """The tables of a record: cost per variant, where a round's wall time goes, where its CPU goes."""
    runs = record["runs"]  # per repetition, one result per variant, in VARIANTS order
    reps = len(runs)
    per = {v: [rep[i] for rep in runs] for i, v in enumerate(VARIANTS)}

    def cells(rs: list[dict], key: str, fmt: str) -> str:
        return _cell([r[key] for r in rs], fmt)

    lines = [
        "# The same work on one Ray node and on two",
        "",
        f"`python benchmarks/bench_scale_two_node.py --n {record['n']} --sampled {record['sampled']} --rounds "
        f"{record['rounds']} --reps {reps}` on {record['date']}, {record['cpus']} CPUs, load average "
        f"{record['load_start']:.1f} at the start and {record['load_end']:.1f} at the end. `privet run` joins a Ray "
        f"cluster in network namespaces on this machine (`RAY_ADDRESS`, `ledger-dir` on storage both nodes see): "
        f"one node with 2 CPUs, or two nodes with 1 CPU each; 2 ClientApp actors in both. N = {record['n']:,}, "
        f"{record['sampled']} clients sampled per round, `cnn2`, 10 examples per client, DP-SGD batch 10 (the "
        f"work of `bench_scale.py --backend simulation`); {reps} repetition{'s' if reps > 1 else ''}, the variants "
        f"alternated, a fresh cluster each{' (median [min-max]; ratios within each repetition)' if reps > 1 else ''}"
        f". **Both nodes are processes of this one 2-core machine, sharing its cores**: the two-node row measures "
        f"what spreading the clients over two Ray nodes costs (transfers between nodes, remote scheduling), not "
        f"extra compute.",
        "",
        "| Ray cluster | per round, rounds 2..R (s) | vs one node | CPU per round (s): server + Ray head + Ray worker "
        "= all | CPU vs one node | between the nodes per round (MB) | client tasks on the worker per round "
        "| between the nodes per task on the worker (MB) | model bytes per round (MB) | handshake (s) "
        "| whole run (s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, v in enumerate(VARIANTS):
        rs = per[v]
        ratio = [rep[i]["per_round_s"] / rep[0]["per_round_s"] for rep in runs]
        cpu_ratio = [rep[i]["cpu_s"] / rep[0]["cpu_s"] for rep in runs]
        per_task = [r["net_mb"] / r["tasks_on_worker"] if r["tasks_on_worker"] else float("nan") for r in rs]
        lines.append(
            f"| {v} | {cells(rs, 'per_round_s', '.1f')} | {_cell(ratio, '.2f')}x | "
            f"{' + '.join(cells(rs, f'cpu_{g}_s', '.1f') for g in GROUPS)} = {cells(rs, 'cpu_s', '.1f')} | "
            f"{_cell(cpu_ratio, '.2f')}x | {cells(rs, 'net_mb', '.0f')} | {cells(rs, 'tasks_on_worker', '.0f')} of "
            f"{rs[0]['tasks']:.0f} | {_cell(per_task, '.1f')} | {cells(rs, 'model_mb', '.0f')} | "
            f"{cells(rs, 'handshake_s', '.1f')} | {cells(rs, 'wall_s', '.0f')} |")
    lines += [
        "",
        "CPU: user + system seconds of each group's process tree: *server* = the `privet run` tree (SuperLink, "
        "`flwr-simulation`: the ServerApp and the Ray driver); *Ray head* = the head's `ray start` tree (GCS, "
        "raylet, the ClientApp actors there); *Ray worker* = the worker's (raylet, its actors). Between the nodes: "
        "bytes through the veth pair joining the two namespaces, both directions (Ray's objects and its control "
        "traffic); model bytes: what the round's messages carried (`bytes_down` + `bytes_up`).",
        "",
        "**Where a round's time goes** (rounds 2..R, mean per round; Ray's task events against the moments the "
        "rounds' lines appeared). Wall: *before* = the server until the round's first client task (sampling, "
        "building and serialising messages); *client phase* = first client task created to last finished; "
        "*after* = the rest (the last reply pulled to the driver, aggregation, evaluation on 10,000 test images, "
        f"the round's line). In the client phase, in actor-seconds summed over the round's tasks ({ACTORS} actors x "
        "phase = to the actor + running + idle): *to the actor* = created until it runs (pushed to the actor, its "
        "arguments, the message with the model, fetched to the actor's node); *running* = the ClientApp's code "
        "(loading the model, DP-SGD, the reply); *idle* = an actor without a task (Flower's pool handing out the "
        "next message, the previous reply pulled to the driver). Actor start: the slowest ClientApp actor's "
        "creation task on that node, once per run.",
        "",
        "| Ray cluster | before (s) | client phase (s) | after (s) | of which aggregation (s) | to the actor "
        "(actor-s) | running (actor-s) | idle (actor-s) | actor start, head / worker (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for v in VARIANTS:
        rs = per[v]
        lines.append(
            f"| {v} | {cells(rs, 'before_s', '.1f')} | {cells(rs, 'phase_s', '.1f')} | {cells(rs, 'after_s', '.1f')}"
            f" | {cells(rs, 'aggregation_s', '.2f')} | {cells(rs, 'to_actor_s', '.2f')} | "
            f"{cells(rs, 'running_s', '.1f')} | {cells(rs, 'idle_s', '.1f')} | "
            f"{cells(rs, 'actor_start_head_s', '.1f')} / {cells(rs, 'actor_start_worker_s', '.1f')} |")
    lines += [
        "",
        "**Where a round's CPU goes**: CPU seconds per round of each group in each part of the round (the same "
        "parts; sampled every 0.1 s).",
        "",
        "| Ray cluster | " + " | ".join(f"{phase}: {' / '.join(GROUPS)} (s)" for phase in
                                         ("before", "client phase", "after")) + " |",
        "|---|---|---|---|",
    ]
    for v in VARIANTS:
        rs = per[v]
        lines.append(f"| {v} | " + " | ".join(" / ".join(cells(rs, f"cpu_{phase}_{g}_s", ".1f") for g in GROUPS)
                                             for phase in PHASES) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Alternate the variants over repetitions; write the record (.json) and its tables (.md)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="clients")
    p.add_argument("--sampled", type=int, default=20, help="clients per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--reps", type=int, default=2, help="repetitions, the variants alternated (median [min-max])")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale_two_node.md",
                   help="the markdown tables; the numbers also go beside them as JSON (same name, .json)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the tables from this record (.json)")
    p.add_argument("--task-events", action="store_true", help=argparse.SUPPRESS)  # the driver that reads them
    args = p.parse_args(argv)
    if args.task_events:
        dump_task_events()
        return 0
    if args.render:
        args.render.with_suffix(".md").write_text(render(json.loads(args.render.read_text())))
        return 0
    if args.rounds < 2:
        p.error("--rounds must be at least 2 (round 1 holds the handshake)")
    reason = netns_unavailable("unshare", "mount")
    if reason:
        p.error(f"cannot build the namespace cluster: {reason}")
    load_start = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="bench-two-node-"))  # outside the head's private part of /tmp
    runs: list[list[dict[str, Any]]] = []
    try:
        for _ in range(args.reps):
            runs.append([])
            for variant in VARIANTS:
                runs[-1].append(run_once(variant, args.n, args.sampled, args.rounds, work))
                print(json.dumps(runs[-1][-1]), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record = {"n": args.n, "sampled": args.sampled, "rounds": args.rounds, **machine(load_start), "runs": runs}
    write(args.out, record, render)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
