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
  the cost of holding against a server that deviates;
- **DDG + roster**: ``secure-aggregation = "secagg+ddg"`` with the roster: each member clips,
  scales, rotates (randomised Hadamard), conditionally rounds and adds exact discrete Gaussian
  noise (:func:`privacy.distributed_discrete_gaussian.encode`) before masking one vector of
  d' = 32,768 integers mod 2^b; the server unmasks, rotates back and decodes.

Every masked input travels packed in log₂ M bits per coordinate (:mod:`protocol.bitpack`: b for
DDG, b + ⌈log₂ K⌉ for the Gaussian sums' b = 24 quantiser); the record keeps the masked payload's
bytes per coordinate beside the protobuf totals, and the time to pack and unpack one vector of
d = 2^17 coordinates at several widths, against the unpacked uint32 ``.npy`` encoding the wire
used before and against expanding that vector's mask (ChaCha20), in the same run.

Every train handler draws its noise from privet's CSPRNG (``noise_source("csprng")``, as clients
do): float Gaussian noise for the three Gaussian variants, exact discrete Gaussian noise for DDG,
so the ratios include the privatisation's own cost.

Time is the server's wall time for the whole exchange (the clients run in this process, so
it includes their key agreement, share encryption and mask expansion: on a real deployment
these run in parallel on K machines, and the figure is an upper bound of the round's
protocol cost). Bytes are the protobuf sizes of every message and reply (Flower's own
serialisation of the RecordDicts). Plaintext and secure repetitions alternate, and ratios
are taken within this one run.

Usage::

    python benchmarks/bench_secure_sum.py --clients 10 50 120 --repeats 3 --out benchmarks/results/secure_sum.md
    python benchmarks/bench_secure_sum.py --clients 10 30 --repeats 2 --ddg-bits 12 16 20 24 \
        --out benchmarks/results/secure_sum_ddg.md
    python benchmarks/bench_secure_sum.py --render benchmarks/results/secure_sum.json   # the tables from the record
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common import bytes_to_ndarray, ndarray_to_bytes  # noqa: E402
from flwr.common.serde import recorddict_to_proto  # noqa: E402
from records import machine, write  # noqa: E402

from client.secure_sum import secure_ddg, secure_sum_mod  # noqa: E402
from privacy.distributed_discrete_gaussian import ddg_parameters, encode  # noqa: E402
from privacy.mechanisms import privatize_update  # noqa: E402
from privacy.randomness import noise_source  # noqa: E402
from privacy.secure_sum import mask, quantisation_for  # noqa: E402
from privet.inprocess import InProcessGrid, simulation_node_configs  # noqa: E402
from protocol import keys  # noqa: E402
from protocol.bitpack import pack, unpack  # noqa: E402
from protocol.roster import Roster, generate  # noqa: E402
from protocol.secure_sum import SumParameters  # noqa: E402
from protocol.train_config import TrainConfig  # noqa: E402
from strategies.secagg_config import DEFAULT_BETA  # noqa: E402
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
    """The global model plus a clipped update (fixed per node) with its share of the noise from the CSPRNG;
    inside a DDG sum, that update's integer encoding with exact discrete Gaussian noise instead."""
    weights = msg.content.array_records[keys.ARRAYS].to_numpy_ndarrays()
    rng = np.random.default_rng(context.node_id % 2**32)
    update = [(0.01 * rng.standard_normal(w.shape)).astype(w.dtype) for w in weights]
    ddg = secure_ddg(msg, context)
    if ddg is not None:
        flat = np.concatenate([u.ravel() for u in update])
        encoded, _ = encode(flat, ddg.params, ddg.rotation_seed, noise_source("csprng"))
        return Message(RecordDict({keys.ARRAYS: ArrayRecord([encoded])}), reply_to=msg)
    m = int(cast(int, msg.content.config_records[keys.CONFIG][keys.NOISE_SHARES]))
    noisy, _ = privatize_update(update, clip=CLIP, noise_multiplier=SIGMA, noise_shares=m, rng=noise_source("csprng"))
    return Message(RecordDict({keys.ARRAYS: ArrayRecord([w + u for w, u in zip(weights, noisy, strict=True)])}),
                   reply_to=msg)


class CountingGrid(InProcessGrid):
    """The in-process grid, counting the protobuf bytes of every message each way, and the masked payloads' bytes."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003
        super().__init__(*args, **kwargs)
        self.down = self.up = self.masked = self.coordinates = 0

    def send_and_receive(self, messages, *, timeout=None):  # noqa: ANN001, ANN201, D102
        messages = list(messages)
        self.down += sum(recorddict_to_proto(m.content).ByteSize() for m in messages)
        replies = super().send_and_receive(messages, timeout=timeout)
        self.up += sum(recorddict_to_proto(r.content).ByteSize() for r in replies if not r.has_error())
        for r in replies:
            record = None if r.has_error() else r.content.config_records.get(keys.SECAGG_RECORD)
            payload = record.get(keys.SECAGG_MASKED) if record is not None else None
            if isinstance(payload, bytes):
                self.masked += len(payload)
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


def secure_round(grid: CountingGrid, weights: list[np.ndarray], roster: Roster | None,
                 ddg_bits: int = 0) -> list[np.ndarray]:
    """The same sum through the secure-sum stages (the consistency round too, with a roster); ``ddg_bits`` > 0:
    a ``secagg+ddg`` sum mod 2^ddg_bits."""
    nodes = grid.get_node_ids()
    d = sum(w.size for w in weights)
    cfg, k, sum_id = SecureAggregation(), len(nodes), f"bench-{time.time()}"
    if ddg_bits:
        ddg = ddg_parameters(clip=CLIP, dim=d, bits=ddg_bits, noise_multiplier=SIGMA, noise_shares=k, max_members=k,
                             beta=DEFAULT_BETA)
        params = SumParameters.for_ddg(sum_id, k, cfg.shamir_threshold(k), k, SIGMA, k, ddg, cfg.wrap_probability)
    else:
        q = quantisation_for(CLIP, SIGMA * CLIP / np.sqrt(k), d, k, 24)
        params = SumParameters(sum_id, k, cfg.shamir_threshold(k), k, float(q.clipping_range), q.levels, q.modulus,
                               CLIP, SIGMA, k)
    sums = open_sums(grid, [nodes], [params], cfg, roster=roster, timeout=600, ttl=None)
    stage2 = collect_messages(sums, _train_messages(nodes, weights))
    replies = grid.send_and_receive(stage2)
    shapes = [w.shape for w in weights]
    inputs = {r.metadata.src_node_id: masked_input(r, sums[0].input_shapes(shapes), params.modulus)
              for r in replies if not r.has_error()}
    grid.coordinates = sum(sum(a.size for a in v) for v in inputs.values() if not isinstance(v, str))
    (result,) = release_sums(grid, sums, {n: v for n, v in inputs.items() if not isinstance(v, str)}, shapes,
                             roster=roster, timeout=600, ttl=None)
    assert result.total is not None, result.reason
    return result.total


def measure(k: int, repeats: int, weights: list[np.ndarray], folder: Path,
            ddg_bits: tuple[int, ...] = ()) -> dict[str, Any]:
    """Seconds of every repeat and bytes per round of the variants, alternating within each repeat."""
    roster_path = generate([str(i) for i in range(k)], folder / f"roster-{k}")
    roster = Roster.load(roster_path)
    variants: list[tuple[str, Callable[..., list[np.ndarray]], Roster | None, int]] = [
        ("plain", plaintext_round, None, 0), ("secure", secure_round, None, 0), ("signed", secure_round, roster, 0)]
    variants += [(f"ddg{b}", secure_round, roster, b) for b in ddg_bits]
    times: dict[str, list[float]] = {name: [] for name, *_ in variants}
    bytes_: dict[str, dict[str, int]] = {}
    sums: dict[str, list[np.ndarray]] = {}
    for _ in range(repeats):
        for name, fn, anchor, bits in variants:
            grid = CountingGrid(app, simulation_node_configs(k), {"roster": str(roster_path)} if anchor else {})
            start = time.perf_counter()
            sums[name] = fn(grid, weights, anchor, bits) if bits else fn(grid, weights, anchor)
            times[name].append(time.perf_counter() - start)
            bytes_[name] = {"down": grid.down, "up": grid.up, "masked": grid.masked, "coordinates": grid.coordinates}
    # the sums are noisy (independent CSPRNG noise in every variant): the error is the RMS per coordinate
    # of each sum's difference from the plaintext one, against √2·σC, the noise alone would give
    rms = {v: float(np.sqrt(np.mean(np.concatenate([(a - b).ravel() for a, b in zip(sums["plain"], sums[v],
                                                                                      strict=True)]) ** 2)))
           for v in times if v != "plain"}
    return {"k": k, "seconds": times, "bytes": bytes_, "rms": rms, "expected_rms": float(np.sqrt(2) * SIGMA * CLIP)}


def packing(dim: int, widths: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """Seconds to pack and unpack one masked vector of ``dim`` coordinates at each width (the fastest of ``repeats``:
    each takes about a millisecond, and on a loaded machine a median mostly measures preemption), beside the
    unpacked uint32 .npy encoding and the mask expansion of the same vector, interleaved."""
    rng = np.random.default_rng(0)
    rows = []
    for width in widths:
        values = rng.integers(0, 2**width, size=dim, dtype=np.int64)
        seconds: dict[str, list[float]] = {"pack": [], "unpack": [], "npy": [], "mask": []}
        packed = npy = b""
        for _ in range(repeats):
            start = time.perf_counter()
            packed = pack(values, width)
            seconds["pack"].append(time.perf_counter() - start)
            start = time.perf_counter()
            back = unpack(packed, dim, width)
            seconds["unpack"].append(time.perf_counter() - start)
            start = time.perf_counter()
            npy = ndarray_to_bytes(values.astype(np.uint64 if width > 32 else np.uint32))
            bytes_to_ndarray(npy).astype(np.int64)
            seconds["npy"].append(time.perf_counter() - start)
            start = time.perf_counter()
            mask(os.urandom(32), 2**width, [(dim,)])
            seconds["mask"].append(time.perf_counter() - start)
            assert np.array_equal(back, values.astype(np.uint64))
        rows.append({"bits": width, "bytes": len(packed), "npy_bytes": len(npy),
                     **{k: min(v) for k, v in seconds.items()}})
    return {"dim": dim, "repeats": repeats, "rows": rows}


def roster_work(k: int, repeats: int, folder: Path) -> dict[str, Any]:
    """One member's signature work in a K-member secure sum with the roster, timed (fastest of ``repeats``).

    What :mod:`client.secure_sum` does with a roster: sign its keys' transcript (setup), verify the K
    members' key signatures (share keys), sign the survivor set (consistency round), and verify the
    majority of survivor signatures it needs (:func:`protocol.secure_sum.consistency_threshold`) before
    unmasking; the real :class:`protocol.roster.Roster` and :class:`protocol.roster.SigningKey`.
    """
    from protocol.roster import Roster, SigningKey, generate
    from protocol.secure_sum import consistency_threshold, keys_transcript, survivors_transcript

    names = [f"site-{i}" for i in range(k)]
    roster = Roster.load(generate(names, folder / f"roster-{k}"))
    signers = [SigningKey.load(folder / f"roster-{k}" / "keys" / f"{n}.pem") for n in names]
    sum_digest = bytes(32)
    keyed = [keys_transcript(sum_digest, n, i, bytes(32), bytes(32)) for i, n in enumerate(names)]
    key_sigs = [key.sign(m) for key, m in zip(signers, keyed, strict=True)]
    survivors = survivors_transcript(sum_digest, range(k))
    needed = consistency_threshold(max(2, k // 2), k)
    survivor_sigs = [key.sign(survivors) for key in signers[:needed]]
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        signers[0].sign(keyed[0])
        assert all(roster.verify(n, sig, m) is None for n, sig, m in zip(names, key_sigs, keyed, strict=True))
        signers[0].sign(survivors)
        assert all(roster.verify(n, sig, survivors) is None for n, sig in zip(names, survivor_sigs, strict=False))
        best = min(best, time.perf_counter() - start)
    return {"k": k, "signs": 2, "verifies": k + needed, "seconds": best}


def _labels(record: dict[str, Any]) -> list[tuple[str, str]]:
    names = [("plain", "plaintext"), ("secure", "secure"), ("signed", "secure + roster")]
    return names + [(f"ddg{b}", f"DDG {b} bits + roster") for b in record["config"]["ddg_bits"]]


def _spread(values: list[float]) -> str:
    mid = statistics.median(values)
    return f"{mid:.1f}x" if len(values) == 1 else f"{mid:.1f}x [{min(values):.1f}-{max(values):.1f}]"


def render(record: dict[str, Any]) -> str:
    """The markdown tables of a record: time, bytes and error per K."""
    names = _labels(record)
    cfg = record["config"]
    lines = [
        "# Secure sum vs plaintext sum", "",
        f"`benchmarks/bench_secure_sum.py --clients {' '.join(str(r['k']) for r in record['rows'])} --repeats "
        f"{cfg['repeats']}" + (f" --ddg-bits {' '.join(map(str, cfg['ddg_bits']))}" if cfg["ddg_bits"] else "")
        + f"`, {record['date']}, {record['cpus']} CPUs, load average {record['load_start']:.1f} at the start and "
        f"{record['load_end']:.1f} at the end. Model `cnn` (26,010 parameters); b = 24 quantisation bits for the "
        "Gaussian secure sums; every member a neighbour of every other; every client's noise from the CSPRNG. "
        f"The variants alternate within each of {cfg['repeats']} repeats; times are medians, time ratios the "
        "median [min-max] of the ratios within a repeat.", "",
        "## Time", "",
        "The last column is the roster's own cost: the signatures and the consistency round, against the same "
        "secure sum without them.", "",
        "| K | " + " | ".join(f"{label} s/round" for _, label in names) + " | "
        + " | ".join(f"{label} / plaintext" for _, label in names[1:]) + " | secure + roster / secure |",
        "|---" * (2 * len(names) + 1) + "|",
    ]
    for r in record["rows"]:
        t = r["seconds"]
        ratios = [_spread([x / p for x, p in zip(t[v], t[base], strict=True)])
                  for v, base in [*((v, "plain") for v, _ in names[1:]), ("signed", "secure")]]
        lines.append(f"| {r['k']} | " + " | ".join(f"{statistics.median(t[v]):.3f}" for v, _ in names) + " | "
                     + " | ".join(ratios) + " |")
    lines += ["", "## Bytes", "",
              "| K | " + " | ".join(f"bytes up {label}" for _, label in names) + " | "
              + " | ".join(f"{label} / plaintext, up" for _, label in names[1:]) + " | "
              + " | ".join(f"{label} / plaintext, down" for _, label in names[1:]) + " |",
              "|---" * (1 + len(names) + 2 * (len(names) - 1)) + "|"]
    for r in record["rows"]:
        b = r["bytes"]
        lines.append(f"| {r['k']} | " + " | ".join(f"{b[v]['up']:,}" for v, _ in names) + " | "
                     + " | ".join(f"{b[v]['up'] / b['plain']['up']:.2f}x" for v, _ in names[1:]) + " | "
                     + " | ".join(f"{b[v]['down'] / b['plain']['down']:.2f}x" for v, _ in names[1:]) + " |")
    if all("masked" in r["bytes"][v] for r in record["rows"] for v, _ in names[1:]):
        lines += ["", "## Bytes per coordinate", "",
                  "The masked payload (each member's masked input as sent, without the rest of its reply) over the "
                  "coordinates it carries: log₂ M / 8.", "",
                  "| K | " + " | ".join(f"{label}" for _, label in names[1:]) + " |", "|---" * len(names) + "|"]
        for r in record["rows"]:
            b = r["bytes"]
            lines.append(f"| {r['k']} | " + " | ".join(f"{b[v]['masked'] / b[v]['coordinates']:.3f}"
                                                       for v, _ in names[1:]) + " |")
    lines += ["", "## The roster per client", "",
              "What the roster (signed keys, the consistency round) adds per client to the same secure sum: "
              "(secure + roster − secure) / K, bytes exactly, seconds the median [min-max] over the repeats "
              "(all K clients run in one process, so a client's share of the round's time).", "",
              "| K | bytes up per client | bytes down per client | seconds per client |", "|---|---|---|---|"]
    for r in record["rows"]:
        b, t, k = r["bytes"], r["seconds"], r["k"]
        extra = [(x - y) / k for x, y in zip(t["signed"], t["secure"], strict=True)]
        spread = (f"{statistics.median(extra):.3f}" if len(extra) == 1
                  else f"{statistics.median(extra):.3f} [{min(extra):.3f}-{max(extra):.3f}]")
        lines.append(f"| {k} | {(b['signed']['up'] - b['secure']['up']) / k:,.0f} | "
                     f"{(b['signed']['down'] - b['secure']['down']) / k:,.0f} | {spread} |")
    if record.get("roster_work"):
        lines += ["", "One member's signature work alone (`--roster-work`; the real roster code, fastest of "
                  f"{record['roster_work']['repeats']} on this machine, {record['roster_work']['date']}): what "
                  "the roster costs a client's CPU on a deployment, where members run in parallel.", "",
                  "| K | signatures made | signatures verified | ms per client |", "|---|---|---|---|"]
        for w in record["roster_work"]["rows"]:
            lines.append(f"| {w['k']} | {w['signs']} | {w['verifies']} | {1e3 * w['seconds']:.2f} |")
    lines += ["", "## Error", "",
              "| K | " + " | ".join(f"RMS of {label} − plaintext" for _, label in names[1:])
              + " | √2·σC (independent noise alone) |", "|---" * (len(names) + 1) + "|"]
    for r in record["rows"]:
        lines.append(f"| {r['k']} | " + " | ".join(f"{r['rms'][v]:.4f}" for v, _ in names[1:])
                     + f" | {r['expected_rms']:.4f} |")
    packed = cfg.get("wire") == "packed"
    wire = ("packed in b bits per coordinate (protocol/bitpack.py)" if packed else "in uint32")
    if not packed:
        lines += ["", "This record predates packing (#39): every masked coordinate travelled as a uint32, 4 bytes; the "
                  "packed wire's bytes are in `secure_sum_ddg.md`. Packing changes no integer of any sum, and its "
                  "time is under 2 ms for 131k coordinates, so the time columns stand."]
    lines += ["", "The roster's cost is the Ed25519 signatures (each member signs its keys and the survivor set, and "
              "verifies K signatures at share keys and a majority at unmask) and the consistency round's messages. "
              f"A DDG member's input is one vector of d' = 32,768 integers (26,010 padded to a power of two) {wire}, "
              "and its encoding (rotation, rounding, exact sampling) runs in each client: on a deployment, in parallel."]
    if packed:
        widths = ", ".join(f"{(r['k'] * (2**24 - 1)).bit_length()} at K = {r['k']}" for r in record["rows"])
        lines += ["A Gaussian secure sum's masked coordinate is uniform mod M = 2^⌈log₂(K·(2^24 − 1) + 1)⌉ and travels "
                  f"in log₂ M bits: {widths}."]
    if "packing" in record:
        lines += ["", "## Packing", "",
                  f"One masked vector of d = {record['packing']['dim']:,} coordinates packed and unpacked (the fastest "
                  f"of {record['packing']['repeats']} interleaved tries: each takes about a millisecond, and on this "
                  "shared machine a median mostly measures preemption), beside the unpacked uint32 .npy encoding (uint64 above 32 bits) "
                  "and the expansion of that vector's mask (ChaCha20), in the same run.", "",
                  "| bits | bytes packed | bytes .npy | pack ms | unpack ms | .npy write + read ms | mask ms "
                  "| (pack + unpack) / mask |", "|---" * 8 + "|"]
        for row in record["packing"]["rows"]:
            lines.append(f"| {row['bits']} | {row['bytes']:,} | {row['npy_bytes']:,} | {1e3 * row['pack']:.2f} | "
                         f"{1e3 * row['unpack']:.2f} | {1e3 * row['npy']:.2f} | {1e3 * row['mask']:.2f} | "
                         f"{(row['pack'] + row['unpack']) / row['mask']:.2f}x |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Run the grid of K; write the record (.json beside --out) and its tables."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 120])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ddg-bits", type=int, nargs="*", default=[],
                        help="also time secagg+ddg sums (with the roster) mod 2^b for each b")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "secure_sum.md",
                        help="the tables; the record goes beside it (.json)")
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rebuild the tables from this record")
    parser.add_argument("--packing-bits", type=int, nargs="*", default=[12, 16, 20, 24, 32],
                        help="time packing one masked vector of d = 2^17 coordinates at these widths")
    parser.add_argument("--roster-work", type=int, nargs="*", metavar="K",
                        help="with --render: time one member's signature work at these K and add it to the record")
    args = parser.parse_args()
    if args.render:
        record = json.loads(args.render.read_text())
        if args.roster_work:
            import tempfile

            with tempfile.TemporaryDirectory() as folder:
                rows = [roster_work(k, 20, Path(folder)) for k in args.roster_work]
            record["roster_work"] = {"date": machine(os.getloadavg()[0])["date"], "repeats": 20, "rows": rows}
            args.render.write_text(json.dumps(record, indent=1) + "\n")
        args.render.with_suffix(".md").write_text(render(record))
        return
    weights = get_weights(build_model("cnn", input_shape=(1, 28, 28), num_classes=10))
    import tempfile

    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder:
        rows = [measure(k, args.repeats, weights, Path(folder), tuple(args.ddg_bits)) for k in args.clients]
    record = {**machine(load_start), "config": {"repeats": args.repeats, "ddg_bits": args.ddg_bits, "wire": "packed"},
              "rows": rows, "packing": packing(2**17, tuple(args.packing_bits), 40)}
    write(args.out, record, render)


if __name__ == "__main__":
    main()
