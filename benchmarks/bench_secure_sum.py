"""A secure sum against a plaintext FedAvg sum: per-round time and bytes on the wire.

K clients per sum (10, 50, 120), the default model (``cnn``, 26,010 parameters). Both
variants run the same ClientApp (privet's SecAgg+ mod, :mod:`client.secure_sum`, in front of
a train handler that returns the global model plus a fixed privatised update, so that
training, identical in both, is left out) on the in-process grid, and the same server code:

- **plaintext**: one train message per client, replies summed as float arrays;
- **secure**: :func:`strategies.secure_sum.open_sums` (stages 0–1), the train messages as
  stage 2, :func:`strategies.secure_sum.release_sums` (stage 3, unmasking).

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
from privet.inprocess import InProcessGrid  # noqa: E402
from protocol import keys  # noqa: E402
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
    return {n: Message(RecordDict({keys.ARRAYS: ArrayRecord(weights),
                                   keys.CONFIG: ConfigRecord({keys.NOISE_SHARES: len(nodes)})}),
                       dst_node_id=n, message_type=MessageType.TRAIN) for n in nodes}


def plaintext_round(grid: CountingGrid, weights: list[np.ndarray]) -> list[np.ndarray]:
    """FedAvg's exchange: send the model, sum the returned updates."""
    nodes = grid.get_node_ids()
    replies = grid.send_and_receive(list(_train_messages(nodes, weights).values()))
    total = [np.zeros(w.shape) for w in weights]
    for r in replies:
        for j, a in enumerate(r.content.array_records[keys.ARRAYS].to_numpy_ndarrays()):
            total[j] += a - weights[j]
    return total


def secure_round(grid: CountingGrid, weights: list[np.ndarray]) -> list[np.ndarray]:
    """The same sum through the four SecAgg+ stages."""
    nodes = grid.get_node_ids()
    d = sum(w.size for w in weights)
    q = quantisation_for(CLIP, SIGMA * CLIP / np.sqrt(len(nodes)), d, len(nodes), 24)
    cfg = SecureAggregation()
    sums = open_sums(grid, [nodes], [q], [len(nodes)], cfg, timeout=600, ttl=None)
    stage2 = collect_messages(sums, _train_messages(nodes, weights))
    replies = grid.send_and_receive(stage2)
    shapes = [w.shape for w in weights]
    inputs = {r.metadata.src_node_id: masked_input(r, shapes, q.modulus) for r in replies if not r.has_error()}
    (result,) = release_sums(grid, sums, {n: v for n, v in inputs.items() if not isinstance(v, str)}, shapes,
                             timeout=600, ttl=None)
    assert result.total is not None, result.reason
    return result.total


def measure(k: int, repeats: int, weights: list[np.ndarray]) -> dict[str, float]:
    """Median seconds and bytes per round of both variants, alternating."""
    times: dict[str, list[float]] = {"plain": [], "secure": []}
    bytes_: dict[str, tuple[int, int]] = {}
    sums: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for name, fn in (("plain", plaintext_round), ("secure", secure_round)):
            grid = CountingGrid(app, [{}] * k, {})
            start = time.perf_counter()
            sums[name] = fn(grid, weights)
            times[name].append(time.perf_counter() - start)
            bytes_[name] = (grid.down, grid.up)
    err = max(float(np.max(np.abs(a - b))) for a, b in zip(sums["plain"], sums["secure"], strict=True))
    plain, secure = statistics.median(times["plain"]), statistics.median(times["secure"])
    return {"k": k, "plain_s": plain, "secure_s": secure, "time_ratio": secure / plain,
            "plain_up": bytes_["plain"][1], "secure_up": bytes_["secure"][1],
            "plain_down": bytes_["plain"][0], "secure_down": bytes_["secure"][0], "max_abs_error": err}


def main() -> None:
    """Run the grid of K and write a markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 120])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "secure_sum.md")
    args = parser.parse_args()
    weights = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10))
    rows = [measure(k, args.repeats, weights) for k in args.clients]
    lines = [
        f"# Secure sum vs plaintext sum ({datetime.now(UTC):%Y-%m-%d %H:%M} UTC, load {os.getloadavg()[0]:.2f}, "
        f"{args.repeats} alternating repeats, median)", "",
        "Model `cnn` (26,010 parameters); b = 24 quantisation bits; every member a neighbour of every other.", "",
        "| K | plaintext s/round | secure s/round | time ratio | bytes up plain | bytes up secure | up ratio "
        "| bytes down plain | bytes down secure | down ratio | max abs error of the sum |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['k']} | {r['plain_s']:.3f} | {r['secure_s']:.3f} | {r['time_ratio']:.1f}x "
                     f"| {r['plain_up']:,} | {r['secure_up']:,} | {r['secure_up'] / r['plain_up']:.2f}x "
                     f"| {r['plain_down']:,} | {r['secure_down']:,} | {r['secure_down'] / r['plain_down']:.2f}x "
                     f"| {r['max_abs_error']:.2e} |")
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
