"""Every record name, config key and metric key that crosses the wire, defined once.

Server (strategies, server app) and clients (client app) import these names; no string
literal for a wire key is repeated anywhere else. Keys are kebab-case like Flower's
run config. Grouped by what they are:

1. records of a message, and message sub-actions;
2. the train config every round carries, then each method's section of it (PFA+,
   personalization, GDPFed, DP-FedC);
3. metrics of replies, and of the server's aggregated round;
4. node-config keys a site's operator sets;
5. reply metadata; DP modes and tasks; error-reason prefixes;
6. the secure-sum stages.
"""

from __future__ import annotations

from typing import Final

# --- record names inside a Message's RecordDict -----------------------------------
ARRAYS: Final = "arrays"
CONFIG: Final = "config"
METRICS: Final = "metrics"
META: Final = "meta"

# --- message sub-actions ---------------------------------------------------------
QUERY_BUDGET: Final = "budget"  # MessageType.QUERY -> @app.query()

# --- config keys sent to clients (train / evaluate / query) ----------------------
SERVER_ROUND: Final = "server-round"
NUM_ROUNDS: Final = "num-rounds"
DP_MODE: Final = "dp-mode"
CLIP: Final = "clip"
NOISE_MULTIPLIER: Final = "noise-multiplier"
NOISE_SHARES: Final = "noise-shares"
TARGET_EPSILON: Final = "target-epsilon"
#: Simulation only: every simulated client holds the smallest / largest budget of the run's
#: distribution ("minimum" / "maximum": PFA's homogeneous references). A deployed client's
#: budget comes from its node config alone and ignores it.
BUDGET_REFERENCE: Final = "budget-reference"
BUDGET_REFERENCES: Final = ("minimum", "maximum")
LOCAL_EPOCHS: Final = "local-epochs"
# τ steps per round instead of epochs: LOCAL_STEPS below, the same key as the reply's metric
CALIBRATION: Final = "calibration"  # "accountant" | "pfa-closed-form" (privacy.calibration)
BATCH_SIZE: Final = "batch-size"
LEARNING_RATE: Final = "learning-rate"
MOMENTUM: Final = "momentum"
GRAD_SAMPLE_MODE: Final = "grad-sample-mode"
ACCOUNTANT: Final = "accountant"
SEED: Final = "seed"
# PFA+: the previous round's public subspace, and the upload format asked for
PROJECTION_BASIS_PREFIX: Final = "basis/"  # ArrayRecord key prefix, one basis per layer
UPLOAD_FORMAT: Final = "upload-format"  # "full" | "coordinates"
TASK: Final = "task"  # what the client works on: TASK_MODEL | TASK_CLUSTERING
TASK_MODEL: Final = "model"
TASK_CLUSTERING: Final = "clustering"

# --- the train config's PFA+ section --------------------------------------------------
# A train request to a private PFA+ client carries, besides "arrays" (the global model,
# which the client loads), a second ArrayRecord with the previous round's subspace:
# "basis/<layer>" (d × k) and, when centred, "center/<layer>" (d,) per model array.
PFA_BASIS_RECORD: Final = "pfa-basis"
PROJECTION_CENTER_PREFIX: Final = "center/"
UPLOAD_FULL: Final = "full"  # value of UPLOAD_FORMAT: the whole model (the default)
UPLOAD_COORDINATES: Final = "coordinates"  # value of UPLOAD_FORMAT: k values per layer

# --- the train config's personalization section (PPSGD / CENTAUR) ------------------
# Train/evaluate config: which personal part the client keeps in its context.state and
# never uploads. Absent or "" = no personalization.
PERSONALIZATION: Final = "personalization"
PERSONALIZATION_ADDITIVE: Final = "additive"  # PPSGD: predict with u + v_k
PERSONALIZATION_HEAD: Final = "head"  # CENTAUR: shared body, local head
PERSONALIZATION_SCHEMES: Final = (PERSONALIZATION_ADDITIVE, PERSONALIZATION_HEAD)
PERSONAL_LR_SCALE: Final = "personal-lr-scale"  # PPSGD's α: v_k steps with α × the lr
HEAD_EPOCHS: Final = "head-epochs"  # CENTAUR: epochs on the local head before the body

# --- the train config's GDPFed section ---------------------------------------------
# A train request from a GDPFed-family strategy carries the group's whole-run mechanism:
# σ_m (NOISE_MULTIPLIER), r_m (NOISE_SHARES: the client adds N(0, C²σ_m²/r_m)), q_m and
# T (NUM_ROUNDS). The client charges (σ_m, q_m, T) to its ledger once per run (first
# participation) and reports GROUP_SAMPLE_RATE as its SAMPLE_RATE and T as LOCAL_STEPS.
GROUP_INDEX: Final = "gdpfed-group"  # 1-based group index m
GROUP_SAMPLE_RATE: Final = "gdpfed-sample-rate"  # q_m; its presence marks a group round
LR_DECAY: Final = "lr-decay"  # η_t = η·decay^(t−1) per round (1.0: none)
# --- the train config's DP-FedC section (the clustering task) -----------------------
DPFEDC_K: Final = "dpfedc-k"  # number of clusters
DPFEDC_RHO: Final = "dpfedc-rho"
DPFEDC_MU_H: Final = "dpfedc-mu-h"
DPFEDC_Q1: Final = "dpfedc-q1"  # H steps per round
DPFEDC_Q2: Final = "dpfedc-q2"  # W steps per round (0: floor(q_hat/t)+1)
DPFEDC_Q_HAT: Final = "dpfedc-q-hat"
DPFEDC_H_STEP: Final = "dpfedc-h-step"  # "safe" | "paper"
DPFEDC_ALPHA2: Final = "dpfedc-alpha2"
DPFEDC_CALIBRATION: Final = "dpfedc-calibration"  # "rigorous" | "paper" | "none"
DPFEDC_EPSILON_BAR: Final = "dpfedc-epsilon-bar"  # the paper's nominal total epsilon
DPFEDC_GRAD_CLIP: Final = "dpfedc-grad-clip"  # G, per-minibatch gradient bound (0: none)
DPFEDC_CLIENT_RATE: Final = "dpfedc-client-rate"  # p = K/N of the paper's (32)
DPFEDC_PLANNED_ROUNDS: Final = "dpfedc-planned-rounds"  # rounds a rigorous client plans its noise for (0: all)

# --- metric keys in train / evaluate / query replies -----------------------------
NUM_EXAMPLES: Final = "num-examples"
EPSILON_BUDGET: Final = "epsilon-budget"
EPSILON_SPENT: Final = "epsilon-spent"
EPSILON_ROUND: Final = "epsilon-round"
DELTA: Final = "delta"
TRAIN_LOSS: Final = "train-loss"
EVAL_LOSS: Final = "eval-loss"
EVAL_ACCURACY: Final = "eval-accuracy"
UPDATE_NORM: Final = "update-norm"
CLIPPED: Final = "clipped"
NON_FINITE_UPDATE: Final = "non-finite-update"  # 1: training diverged, the zero update was released in its place
LOCAL_STEPS: Final = "local-steps"
SAMPLE_RATE: Final = "sample-rate"
TRAIN_SECONDS: Final = "train-seconds"
# --- the server's metrics of an aggregated round (what Flower's strategy returns) ---
NUM_ACCEPTED: Final = "num-accepted"
NUM_REJECTED: Final = "num-rejected"
NUM_DROPPED: Final = "num-dropped"
NUM_SUMMED: Final = "num-summed"
MAX_EPSILON_SPENT: Final = "max-epsilon-spent"
MEAN_EPSILON_SPENT: Final = "mean-epsilon-spent"
#: Data-dependent metrics a train reply carries only where the client's operator opts in
#: (``report-train-metrics``): not covered by the client's ε.
UNCOVERED_TRAIN_METRICS: Final = (TRAIN_LOSS, TRAIN_SECONDS, UPDATE_NORM, CLIPPED, NON_FINITE_UPDATE, "head-train-loss")

# --- node-config keys a SuperNode operator sets (``--node-config "k=v ..."``) --------
NODE_PARTITION_ID: Final = "partition-id"
NODE_NUM_PARTITIONS: Final = "num-partitions"
NODE_CLIENT_ID: Final = "client-id"
NODE_EPSILON: Final = "epsilon"
NODE_DELTA: Final = "delta"
NODE_LEDGER_PATH: Final = "ledger-path"
NODE_DATA_DIR: Final = "data-dir"
NODE_SHARD_CACHE: Final = "shard-cache"
NODE_NOISE_SOURCE: Final = "noise-source"  # csprng | os | seeded (see privacy.randomness)
NODE_ALLOW_SEEDED_NOISE: Final = "allow-seeded-noise"
NODE_ALLOW_EVALUATION: Final = "allow-evaluation"
NODE_REPORT_TRAIN_METRICS: Final = "report-train-metrics"
NODE_MAX_EXAMPLES: Final = "max-examples"
#: The federation roster (client-id -> Ed25519 public key) and this site's signing key: files the
#: operator hands the site out of band (protocol.roster); never taken from the server's run config.
NODE_ROSTER: Final = "roster"
NODE_SIGNING_KEY: Final = "signing-key"
#: A site's own floors (protocol.site.SiteFloors; the simulation's [tool.flwr.app.config.site]).
NODE_MIN_SUM_SIZE: Final = "min-sum-size"
NODE_MIN_NOISE_MULTIPLIER: Final = "min-noise-multiplier"
NODE_MAX_EPSILON_PER_RELEASE: Final = "max-epsilon-per-release"
NODE_MAX_RELEASES_PER_RUN: Final = "max-releases-per-run"
#: An auditor's canary client (``privet audit --runtime flower``, client.work.CanaryWork): a node whose
#: round releases S·B·u instead of training, u the unit direction its seed draws; set by the node's
#: operator (the auditor) only, never by the server.
NODE_AUDIT_CANARY_SEED: Final = "audit-canary-seed"
NODE_AUDIT_CANARY_SIGN: Final = "audit-canary-sign"  # S: +1 or -1, the auditor's secret coin
NODE_AUDIT_CANARY_NORM: Final = "audit-canary-norm"  # B > 0: the update's norm before clipping

# --- metadata (ConfigRecord "meta") in replies -----------------------------------
CLIENT_ID: Final = "client-id"
BUDGET_SOURCE: Final = "budget-source"  # "node-config" | "distribution"
NOISE_SOURCE: Final = "noise-source"  # "csprng" | "os" | "seeded" (privacy.randomness)
GUARANTEE_UNIT: Final = "guarantee-unit"  # "client" | "record": what the client's ε protects
CLIENT_EVALUATION: Final = "client-evaluation"  # "on" | "off": answers evaluate messages
#: The handshake's binding of a client id to its roster key (protocol.roster): the server's fresh
#: challenge in the budget query, the client's Ed25519 signature in its declaration.
CHALLENGE: Final = "challenge"
SIGNATURE: Final = "signature"
TRAIN_METRICS: Final = "train-metrics"  # "on" | "off": reply carries uncovered train metrics

# --- DP modes (the run config's ``dp-mode``; the mechanism each one runs: --------
# protocol.train_config.TrainConfig.mechanism, the one rule) ----------------------
DP_SGD: Final = "dpsgd"
DP_UPDATE: Final = "update"
DP_NONE: Final = "none"
DP_MODES: Final = (DP_SGD, DP_UPDATE, DP_NONE)

# --- error reasons a client sends (prefixes; the rest is a human message) ---------
BUDGET_EXHAUSTED: Final = "budget-exhausted"
EVALUATION_REFUSED: Final = "evaluation-refused"
#: Error-reason prefix of a request refused by one of the site's own floors (protocol.site): nothing was
#: trained or charged.
SITE_FLOOR: Final = "site-floor"
#: Error-reason prefix of a train message refused because it outlived its time-to-live
#: (the round it belongs to is over): nothing was trained or charged.
STALE_MESSAGE: Final = "stale-message"

# --- secure sums (protocol.secure_sum, client.secure_sum, strategies.secure_sum) -----
#: The record of a secure-sum stage in a train message and in its reply.
SECAGG_RECORD: Final = "privet-secagg"
SECAGG_STAGE: Final = "stage"
STAGE_SETUP: Final = "setup"
STAGE_SHARE_KEYS: Final = "share-keys"
STAGE_COLLECT: Final = "collect"
STAGE_CONSISTENCY: Final = "consistency"
STAGE_UNMASK: Final = "unmask"
SECAGG_SUM_ID: Final = "param/sum_id"
SECAGG_PK1: Final = "pk1"  # the member's key for pairwise masks
SECAGG_PK2: Final = "pk2"  # the member's key for encrypting shares
SECAGG_NODES: Final = "nodes"
SECAGG_NAMES: Final = "names"
SECAGG_PK1S: Final = "pk1s"
SECAGG_PK2S: Final = "pk2s"
SECAGG_SIGNATURES: Final = "signatures"
SECAGG_SIGNERS: Final = "signers"
SECAGG_DESTINATIONS: Final = "destinations"
SECAGG_SOURCES: Final = "sources"
SECAGG_CIPHERTEXTS: Final = "ciphertexts"
SECAGG_MASKED: Final = "masked"  # one byte string: the input mod M packed in log2 M bits (secure_sum.pack_masked)
SECAGG_SURVIVORS: Final = "survivors"
SECAGG_OWNERS: Final = "owners"
SECAGG_SHARES: Final = "shares"
SECAGG_KINDS: Final = "kinds"  # "seed" | "key": which secret of its owner each share is
#: r_min, the fewest inputs a released sum may hold (a sum's parameters).
SECURE_MIN_SURVIVORS: Final = "min-survivors"
#: Error-reason prefix of a client that refuses a secure-sum stage (too few survivors, a
#: forged share or key, a malformed stage): it sent nothing that would release its update.
SECURE_SUM_REFUSED: Final = "secure-sum-refused"
#: Reply meta: the secure-sum floor r_min a client charged for ("0": no secure sum).
SECURE_SURVIVORS: Final = "secure-min-survivors"
