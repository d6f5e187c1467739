"""A secure sum against a plaintext FedAvg sum: per-round time and bytes on the wire.

K clients per sum (10, 50, 120), the default model (``cnn``, 26,010 parameters). Every
variant runs the same ClientApp (privet's secure-sum mod, :mod:`client.secure_sum`, in front of
a train handler that returns the global model plus a fixed privatised update, so that
training, identical in all, is left out) on the in-process grid, and the same server code:

- **plaintext**: one train message per client, replies summed as float arrays;
- **secure**: :func:`strategies.secure_sum.open_sums` (setup, share keys), the train messages as
  the collect stage, :func:`strategies.secure_sum.release_sums` (unmask), without a roster
  (it holds against a server that follows the protocol);
- **secure + roster**: the same with every member's keys signed and checked against a roster
  and the consistency round (each survivor signs U3, each checks a majority's signatures):
  the cost of holding against a server that deviates.

Time is the server's wall time for the whole exchange (the clients run in this process, so
it includes their key agreement, share encryption and mask expansion: on a real deployment
these run in parallel on K machines, and the figure is an upper bound of the round's
protocol cost). Bytes are the protobuf sizes of every message and reply (Flower's own
serialisation of the RecordDicts). Plaintext and secure repetitions alternate, and ratios
are taken within this one run.

Usage::

    python benchmarks/bench_secure_sum.py --clients 10 50 120 --repeats 3 --out benchmarks/results/secure_sum.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.serde import recorddict_to_proto  # noqa: E402

from client.secure_sum import secure_sum_mod  # noqa: E402
from privacy.secure_sum import quantisation_for  # noqa: E402
from privet.inprocess import InProcessGrid, simulation_node_configs  # noqa: E402
from protocol import keys  # noqa: E402
from protocol.roster import Roster, generate  # noqa: E402
from protocol.train_config import TrainConfig  # noqa: E402
from strategies.secure_sum import (  # noqa: E402
    SecureAggregation,
    collect_messages,
    masked_input,
    open_sums,
    release_sums,
)
from tasks.models import build_model, get_weights  # noqa: E402

SIGMA, CLIP = 1.0, 1.0

app = ClientApp(mods=[secure_sum_mod])


@app.train()
def train(msg: Message, context: Context) -> Message:
    """The global model plus a clipped update with its share of the noise (fixed per node)."""
    weights = msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
    rng = np.random.default_rng(context.node_id % 2**32)
    m = int(msg.content.config_records[keys.CONFIG][keys.NOISE_SHARES])
    out = [w + (0.01 * rng.standard_normal(w.shape) + rng.normal(0, SIGMA * CLIP / np.sqrt(m), w.shape))
           .astype(w.dtype) for w in weights]
    return Message(RecordDict({keys.ARRAYS: ArrayRecord(out)}), reply_to=msg)


class CountingGrid(InProcessGrid):
    """The in-process grid, counting the protobuf bytes of every message each way."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.down = self.up = 0

    def send_and_receive(self, messages, *, timeout=None):  # noqa: ANN001, ANN201, D102
        messages = list(messages)
        self.down += sum(recorddict_to_proto(m.content).ByteSize() for m in messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        self.up += sum(recorddict_to_proto(r.content).ByteSize() for r in replies if not r.has_error())
        return replies


def _train_messages(nodes: list[int], weights: list[np.ndarray]) -> dict[int, Message]:
    config = TrainConfig(num_rounds=1, dp_mode=keys.DP_UPDATE, local_epochs=1, batch_size=32, learning_rate=0.1,
                         clip=CLIP, noise_multiplier=SIGMA, noise_shares=len(nodes), server_round=1).encode()
    return {n: Message(RecordDict({keys.ARRAYS: ArrayRecord(weights), keys.CONFIG: ConfigRecord(dict(config))}),
                       dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes}


def plaintext_round(grid: CountingGrid, weights: list[np.ndarray], roster: Roster | None) -> list[np.ndarray]:
    """FedAvg's exchange: send the model, sum the returned updates."""
    nodes = grid.get_node_ids()
    replies = grid.send_and_receive(list(_train_messages(nodes, weights).values()))
    total = [np.zeros(w.shape) for w in weights]
    for r in replies:
        for j, a in enumerate(r.content.array_records[keys.ARRAYS].to_numpy_ndarrays()):
            total[j] += a - weights[j]
    return total


def secure_round(grid: CountingGrid, weights: list[np.ndarray], roster: Roster | None) -> list[np.ndarray]:
    """The same sum through the secure-sum stages (the consistency round too, with a roster)."""
    nodes = grid.get_node_ids()
    d = sum(w.size for w in weights)
    q = quantisation_for(CLIP, SIGMA * CLIP / np.sqrt(len(nodes)), d, len(nodes), 24)
    cfg = SecureAggregation()
    sums = open_sums(grid, [nodes], [q], [(CLIP, SIGMA, len(nodes), len(nodes))], cfg, sum_ids=[f"bench-{time.time()}"],
                     roster=roster, timeout=600, ttl=None)
    stage2 = collect_messages(sums, _train_messages(nodes, weights))
    replies = grid.send_and_receive(stage2)
    shapes = [w.shape for w in weights]
    inputs = {r.metadata.src_node_id: masked_input(r, shapes, q.modulus) for r in replies if not r.has_error()}
    (result,) = release_sums(grid, sums, {n: v for n, v in inputs.items() if not isinstance(v, str)}, shapes,
                             roster=roster, timeout=600, ttl=None)
    assert result.total is not None, result.reason
    return result.total


def measure(k: int, repeats: int, weights: list[np.ndarray], folder: Path) -> dict[str, float]:
    """Median seconds and bytes per round of the three variants, alternating."""
    roster_path = generate([str(i) for i in range(k)], folder / f"roster-{k}")
    roster = Roster.load(roster_path)
    variants = (("plain", plaintext_round, None), ("secure", secure_round, None), ("signed", secure_round, roster))
    times: dict[str, list[float]] = {name: [] for name, *_ in variants}
    bytes_: dict[str, tuple[int, int]] = {}
    sums: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for name, fn, anchor in variants:
            grid = CountingGrid(app, simulation_node_configs(k), {"roster": str(roster_path)} if anchor else {})
            start = time.perf_counter()
            sums[name] = fn(grid, weights, anchor)
            times[name].append(time.perf_counter() - start)
            bytes_[name] = (grid.down, grid.up)
    err = max(float(np.max(np.abs(a - b))) for v in ("secure", "signed")
              for a, b in zip(sums["plain"], sums[v], strict=True))
    plain, secure, signed = (statistics.median(times[v]) for v in ("plain", "secure", "signed"))
    return {"k": k, "plain_s": plain, "secure_s": secure, "signed_s": signed, "time_ratio": secure / plain,
            "signed_ratio": signed / secure, "plain_up": bytes_["plain"][1], "secure_up": bytes_["secure"][1],
            "signed_up": bytes_["signed"][1], "plain_down": bytes_["plain"][0], "secure_down": bytes_["secure"][0],
            "signed_down": bytes_["signed"][0], "max_abs_error": err}


def main() -> None:
    """Run the grid of K and write a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 120])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "secure_sum.md")
    args = parser.parse_args()
    weights = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10))
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(k, args.repeats, weights, Path(folder)) for k in args.clients]
    lines = [
        f"# Secure sum vs plaintext sum ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}, "
        f"{args.repeats} alternating repeats, median)", "",
        "Model `cnn` (26,010 parameters); b = 24 quantisation bits; every member a neighbour of every other.", "",
        "| K | plaintext s/round | secure s/round | secure + roster s/round | secure / plain | roster / secure "
        "| bytes up plain | secure | secure + roster | bytes down plain | secure | secure + roster "
        "| max abs error of the sum |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['k']} | {r['plain_s']:.3f} | {r['secure_s']:.3f} | {r['signed_s']:.3f} "
                     f"| {r['time_ratio']:.1f}x | {r['signed_ratio']:.2f}x "
                     f"| {r['plain_up']:,} | {r['secure_up']:,} | {r['signed_up']:,} "
                     f"| {r['plain_down']:,} | {r['secure_down']:,} | {r['signed_down']:,} "
                     f"| {r['max_abs_error']:.2e} |")
    lines += ["", "The roster's cost is the Ed25519 signatures (each member signs its keys and the survivor set, and "
              "verifies K signatures at share keys and a majority at unmask) and the consistency round's messages."]
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
