"""Someone else's ServerApp: its own model setup, evaluation and output, privet's strategy.

privet's ``fedavg-hdp`` strategy brings the budget handshake, budget-aware sampling, reply
verification and per-client ε bookkeeping; everything else here is this app's own choice. The
train config is privet's typed ``TrainConfig``, what privet's ClientApp reads.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from flwr.app import ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import privet

log = logging.getLogger("custom_app")
app = ServerApp()

INPUT_SHAPE = (1, 28, 28)  # Fashion-MNIST
NUM_CLASSES = 10


def train_config(rc: dict, num_rounds: int) -> ConfigRecord:
    """What privet's ClientApp needs to run one round of DP-SGD (typed: a bad value fails here)."""
    return privet.TrainConfig(
        num_rounds=num_rounds,
        dp_mode="dpsgd",
        clip=float(rc["clip"]),
        noise_multiplier=0.0,  # 0: every client calibrates σ to its own budget
        local_epochs=int(rc["local-epochs"]),
        batch_size=int(rc["batch-size"]),
        learning_rate=float(rc["learning-rate"]),
        grad_sample_mode="hooks",
        accountant="rdp",
        seed=int(rc["seed"]),
    ).encode()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = dict(context.run_config)
    num_rounds = int(rc["num-server-rounds"])
    initial = privet.initial_arrays(str(rc["model"]), input_shape=INPUT_SHAPE, num_classes=NUM_CLASSES, seed=0)

    strategy = privet.strategy("fedavg-hdp", seed=int(rc["seed"]), min_train_nodes=int(rc["min-nodes"]),
                               min_available_nodes=int(rc["min-nodes"]))
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=num_rounds,
                            train_config=train_config(rc, num_rounds))

    clients = {a.client_id: {"epsilon_budget": a.epsilon_budget, "epsilon_spent": a.epsilon_spent,
                             "rounds": list(a.rounds)}
               for a in strategy.accounts.values()}
    for cid, c in sorted(clients.items()):
        log.warning("client %s spent eps=%.4f of %.4f in rounds %s", cid, c["epsilon_spent"],
                    c["epsilon_budget"], c["rounds"])
    train_metrics = {r: dict(m) for r, m in result.train_metrics_clientapp.items()}
    if rc.get("out-dir"):
        out = Path(str(rc["out-dir"]))
        out.mkdir(parents=True, exist_ok=True)
        (out / "custom-summary.json").write_text(json.dumps(
            {"clients": clients, "train_metrics": train_metrics,
             "final_arrays": list(result.arrays.keys())}, indent=2, default=float))
    context.state["custom-summary"] = MetricRecord({"num-clients": len(clients)})
