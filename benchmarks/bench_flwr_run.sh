#!/usr/bin/env bash
# `flwr run .` (as docs/running.md writes it) against `privet run`, the default experiment, each timed
# as a whole process from outside and interleaved by farm-bench (A B A B ...; ratios pair by pair).
# Writes benchmarks/results/flwr_run.md from farm-bench's own table. Needs the farm-bench tool.
#
#   bash benchmarks/bench_flwr_run.sh [RUNS]      # default 3 pairs, about 5 min each on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}
work=$(mktemp -d /tmp/privet-flwr-bench.XXXX)
cat > "$work/a.sh" <<A
#!/usr/bin/env bash
cd "$PWD" && source .venv/bin/activate
export FLWR_HOME=\$(mktemp -d "$work/home.XXXX")
out=\$(mktemp -d "$work/out.XXXX")
flwr run . --run-config "out-dir='\$out/r'" --federation-config "num-supernodes=10 client-resources-num-cpus=1" --stream > "\$out/log" 2>&1
python -c "import json,sys; s=json.load(open('\$out/r/summary.json')); sys.exit(s['status'] != 'completed')"
python -c "from pathlib import Path; from privet.cli import stop_local_superlink; stop_local_superlink(Path('\$FLWR_HOME'))"  # by its FLWR_HOME, by pid
A
cat > "$work/b.sh" <<B
#!/usr/bin/env bash
cd "$PWD" && out=\$(mktemp -d "$work/pout.XXXX") && .venv/bin/privet run --out "\$out/r" > "\$out/log" 2>&1
B
chmod +x "$work/a.sh" "$work/b.sh"
farm-bench -n "$runs" --warmup 0 --timeout 3600 --vs "$work/b.sh" -- "$work/a.sh" > "$work/bench.txt" 2>&1
{
    echo "# \`flwr run .\` vs \`privet run\`: the default experiment, whole process"
    echo
    echo "\`bash benchmarks/bench_flwr_run.sh $runs\`, $(date -u '+%Y-%m-%d %H:%M UTC'), load average $(cut -d' ' -f1 /proc/loadavg) at the end."
    echo "A = \`flwr run . --federation-config \"num-supernodes=10 client-resources-num-cpus=1\" --stream\`,"
    echo "B = \`privet run\`; both the default experiment (10 clients, 3 rounds, Ray simulation, one CPU per client)."
    echo "farm-bench times each from its start to its exit, A and B in turn; A/B is taken pair by pair."
    echo "CPU seconds count only the processes the command waited for (not Ray's workers): compare wall times."
    echo
    echo "| figure | min | median | max |"
    echo "|---|---:|---:|---:|"
    grep -E '^(A|B|A/B) (user|sys|cpu|wall)' "$work/bench.txt" | awk '$1 == "A/B" {printf "| A/B %s | %s | %s | %s |\n", $2, $3, $4, $5; next} {printf "| %s %s %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6}'
} > benchmarks/results/flwr_run.md
cat benchmarks/results/flwr_run.md
