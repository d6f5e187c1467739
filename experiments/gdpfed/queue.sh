#!/usr/bin/env bash
# GDPFed Table 2 at the paper's scale (n = 6000, T = 50, model cnn2, sigma_m by the run's accountant; #36),
# one run at a time, each appended to experiments/gdpfed/runs.jsonl by reproduce.py (which also rewrites
# results.md). A run already recorded is skipped, so a stopped queue resumes where it was; a run stopped
# midway records nothing and runs again.
#
# Start (own process group, survives the shell; niced for the shared 2-core machine):
#   setsid nohup nice -n 15 experiments/gdpfed/queue.sh > results/gdpfed-queue/queue.log 2>&1 &
# Watch:  tail -f results/gdpfed-queue/queue.log results/gdpfed-queue/<method>-seed<k>.log
# Stop:   kill -- -<pgid>   (pgid = the pid setsid gave queue.sh; ps -o pgid= -p <pid>)
# Reorder without losing the run in flight: kill only queue.sh's pid, then start the new queue with
#   WAIT_FOR=<the running reproduce.py's pid>.
set -u
cd "$(dirname "$0")/../.."
LOGS=results/gdpfed-queue
mkdir -p "$LOGS"
#: "method seed [key=value ...]": the extra run-config changes go to reproduce.py --set (a row of their own).
QUEUE=(
  "dp-fedavg 1" "gdpfed-plus 1" "fedavg 1"
  "dp-fedavg 2" "gdpfed-plus 2" "fedavg 2"
  "dp-fedavg 1 gdpfed.server-step=0.5" "dp-fedavg 2 gdpfed.server-step=0.5"
  "gdpfed-plus 3" "dp-fedavg 3" "fedavg 3"
  "dp-fedavg 3 gdpfed.server-step=0.5"
  "gdpfed-plus 4" "dp-fedavg 4" "gdpfed-plus 5" "dp-fedavg 5"
  "dp-fedavg 4 gdpfed.server-step=0.5" "dp-fedavg 5 gdpfed.server-step=0.5"
  "fedavg 4" "fedavg 5"
  "gdpfed 1" "idp-fedavg-sample 1" "gdpfed 2" "idp-fedavg-sample 2" "gdpfed 3" "idp-fedavg-sample 3"
  "gdpfed 4" "idp-fedavg-sample 4" "gdpfed 5" "idp-fedavg-sample 5"
  "gdpfed-op 1" "idp-fedavg-scale 1" "gdpfed-op 2" "idp-fedavg-scale 2"
  "gdpfed-op 3" "idp-fedavg-scale 3" "pfa-groups 1" "gdpfed-op 4" "idp-fedavg-scale 4" "pfa-groups 2"
  "gdpfed-op 5" "idp-fedavg-scale 5" "pfa-groups 3"
)
# WAIT_FOR=<pid>: start only after that process (a run of an earlier queue left to finish) has ended.
while [ -n "${WAIT_FOR:-}" ] && kill -0 "$WAIT_FOR" 2>/dev/null; do sleep 20; done
for item in "${QUEUE[@]}"; do
  read -r method seed changes <<< "$item"
  tag="$method-seed$seed${changes:+-${changes//[^A-Za-z0-9.]/_}}"
  echo "$(date -Is) start $method seed $seed ${changes:-}"
  # shellcheck disable=SC2086  # changes: zero or more key=value words
  .venv/bin/python experiments/gdpfed/reproduce.py --clients 6000 --rounds 50 --methods "$method" --seeds "$seed" \
    ${changes:+--set $changes} --skip-recorded >> "$LOGS/$tag.log" 2>&1
  rc=$?
  echo "$(date -Is) end $method seed $seed ${changes:-}: exit $rc ($(grep -c '' experiments/gdpfed/runs.jsonl) rows)"
done
echo "$(date -Is) queue done"
