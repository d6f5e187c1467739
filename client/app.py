"""The privet ClientApp: the budget handshake, one train round (:mod:`client.round`), local evaluation.

Every handler answers with an error reply (never an exception) when it cannot or must not do
the work: a malformed node config, or a request that would take the client past its privacy
budget (reason prefixed ``budget-exhausted``).

What a client releases, and under which guarantee, where its operator does not opt in to more:

* **train replies** (:mod:`client.round`): the model under the ledger's ε; public figures.
* **handshake replies**: budget, δ, ε spent and n (public under replace-one).
* **evaluate replies**: a loss and an accuracy on private data, *not* covered by the ledger:
  answered only where the operator allows it (``allow-evaluation``; in simulation
  ``client-evaluation = "on"``), never once the budget is spent, and declared in the report
  as outside the guarantee.

All DP randomness comes from a source nobody else can reproduce (:mod:`privacy.randomness`,
``csprng`` by default); ``seeded`` noise is accepted only where the operator allows it, and the
report says the guarantee then does not hold against whoever knows the seed.
"""

from __future__ import annotations

import logging

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from client.allocator import tune_malloc
from client.ledger_store import load_ledger
from client.model_task import load_local_data, model_from
from client.personalization import personalize_for_evaluation
from client.profile import load_signing_key, resolve_profile
from client.ray_pool import install as keep_lost_actors_out_of_the_pool
from client.replies import error_reply
from client.round import TASKS, train_round
from client.secure_sum import secure_sum_mod
from privacy.accountants import DEFAULT_ACCOUNTANT
from privacy.policy import is_spent
from protocol import keys
from protocol.budget_query import BudgetQuery, handshake_transcript
from protocol.errors import ERROR_BUDGET, ERROR_CONFIG, ERROR_REFUSED
from protocol.log import route_privet_logs_to_flower
from protocol.replies import BudgetDeclaration, EvaluationReport
from protocol.run_settings import RunSettings
from tasks.models import evaluate

log = logging.getLogger("privet.client")
route_privet_logs_to_flower()


app = ClientApp(mods=[secure_sum_mod])  # secure sums: client/secure_sum.py
tune_malloc()  # keep DP-SGD's per-step buffers in the heap (client/allocator.py)
keep_lost_actors_out_of_the_pool()  # flwr-simulation only: lost Ray actors leave the pool (client/ray_pool.py)


@app.query(keys.QUERY_BUDGET)
def query_budget(msg: Message, context: Context) -> Message:
    """Handshake: declare (ε, δ), the example count and the ε already spent."""
    try:
        query = BudgetQuery.decode(msg.content[keys.CONFIG])
        profile = resolve_profile(context.node_config, context.run_config, query.budget_reference)
        ledger = load_ledger(profile, context, query.accountant)
        num_examples = TASKS[query.task].count(RunSettings.of(context.run_config), profile)
    except (ValueError, FileNotFoundError) as exc:
        log.error("budget handshake refused (node %s): %s",
                  context.node_config.get(keys.NODE_CLIENT_ID, context.node_id), exc)
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    signature = b""
    if profile.signing_key and query.challenge:  # binds the name it declares to its roster key
        signature = load_signing_key(profile.signing_key).sign(
            handshake_transcript(query.challenge, profile.client_id, int(context.node_id)))
    declaration = BudgetDeclaration(
        client_id=profile.client_id, epsilon_budget=float(ledger.epsilon_budget), delta=float(ledger.delta),
        num_examples=int(num_examples), epsilon_spent=float(ledger.spent()), guarantee_unit=ledger.unit(),
        noise_source=profile.noise_source, client_evaluation=profile.allow_evaluation, signature=signature)
    return Message(declaration.encode({keys.BUDGET_SOURCE: profile.budget_source}), reply_to=msg)


@app.train()
def train(msg: Message, context: Context) -> Message:
    """One round of local training under the requested mechanism, within the budget (:mod:`client.round`)."""
    return train_round(msg, context)


@app.evaluate()
def evaluate_local(msg: Message, context: Context) -> Message:
    """Evaluate the received model on this client's local shard, where the operator allows it.

    The reply (a loss and an accuracy on private data) is not covered by the ledger: it is
    refused unless the node allows evaluation (``allow-evaluation``, or in simulation
    ``client-evaluation = "on"``), and always once the client's budget is spent.
    """
    try:
        profile = resolve_profile(context.node_config, context.run_config)
    except ValueError as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    if not profile.allow_evaluation:
        return error_reply(msg, ERROR_REFUSED, f"{keys.EVALUATION_REFUSED}: client {profile.client_id} does not "
                           "evaluate on its private data (an uncharged release); its operator can allow it with "
                           "node-config 'allow-evaluation=true' (simulation: client-evaluation = \"on\")")
    try:
        cfg = msg.content.config_records.get(keys.CONFIG, ConfigRecord())
        ledger = load_ledger(profile, context, str(cfg.get(keys.ACCOUNTANT, DEFAULT_ACCOUNTANT)))
        if is_spent(ledger.spent(), ledger.epsilon_budget):
            return error_reply(msg, ERROR_BUDGET, f"{keys.BUDGET_EXHAUSTED}: client {profile.client_id} has spent "
                               "its budget and answers no request that depends on its data")
        settings = RunSettings.of(context.run_config)
        data, num_classes = load_local_data(profile, settings)
        model = model_from(msg.content.array_records[keys.ARRAYS], data, num_classes, settings.model)
        model, data = personalize_for_evaluation(msg.content, context, model, data, profile.partition_id)
    except (ValueError, KeyError, FileNotFoundError) as exc:
        return error_reply(msg, ERROR_CONFIG, f"config-error: {exc}")
    loss, accuracy = evaluate(model, data)
    report = EvaluationReport(accuracy=float(accuracy), loss=float(loss), num_examples=int(len(data)))
    return Message(RecordDict({keys.METRICS: report.metrics()}), reply_to=msg)
