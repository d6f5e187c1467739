#!/usr/bin/env bash
# Write the operator's Flower CLI configuration for a privet deployment: one file that privet owns,
# written whole each time (running it twice gives the same file), never appended to ~/.flwr/config.toml.
#
#   deploy/operator-config.sh [--address HOST:PORT] [--ca FILE] [--name NAME] [--home DIR]
#
#   --address  the SuperLink's Control API as the operator reaches it
#              (default 127.0.0.1:${PRIVET_CONTROL_PORT:-9093}: the compose stack publishes it there only)
#   --ca       the CA certificate that signed the SuperLink's (default deploy/certs/ca.crt, written by
#              deploy/generate-certs.sh); stored as an absolute path
#   --name     the connection's name (default privet-compose)
#   --home     the Flower home to write DIR/config.toml into (default: .flwr-home at the repo root,
#              git-ignored)
#
# Flower 1.39's CLI reads $FLWR_HOME/config.toml (default ~/.flwr/config.toml). Point it at this file
# for the commands that talk to the deployment, and leave your own Flower configuration alone:
#
#   export FLWR_HOME=$PWD/.flwr-home
#   flwr run . privet-compose --stream
#   flwr ls privet-compose --format json
#
# The file also keeps Flower's "local" connection (the simulation `flwr run .` starts by itself), so
# `flwr run .` works the same with this FLWR_HOME exported.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ADDRESS="127.0.0.1:${PRIVET_CONTROL_PORT:-9093}"
CA="$ROOT/deploy/certs/ca.crt"
NAME="privet-compose"
HOME_DIR="$ROOT/.flwr-home"
while [[ $# -gt 0 ]]; do
    case "$1" in
        --address) ADDRESS="$2"; shift 2 ;;
        --ca) CA="$2"; shift 2 ;;
        --name) NAME="$2"; shift 2 ;;
        --home) HOME_DIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "operator-config: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$NAME" =~ ^[A-Za-z0-9_-]+$ ]] || { echo "operator-config: --name must be letters, digits, - or _; got '$NAME'" >&2; exit 2; }
[[ -f "$CA" ]] || { echo "operator-config: no CA certificate at $CA: run deploy/generate-certs.sh first (or pass --ca)" >&2; exit 2; }
CA="$(cd "$(dirname "$CA")" && pwd)/$(basename "$CA")"
mkdir -p "$HOME_DIR"
tmp="$(mktemp "$HOME_DIR/.config.toml.XXXXXX")"
cat > "$tmp" <<TOML
# Written by deploy/operator-config.sh; run it again to change it (it rewrites this whole file).
[superlink]
default = "$NAME"

[superlink.$NAME]
address = "$ADDRESS"
root-certificates = "$CA"

[superlink.local]
address = ":local:"
TOML
mv "$tmp" "$HOME_DIR/config.toml"
echo "wrote $HOME_DIR/config.toml (connection '$NAME': $ADDRESS, CA $CA)"
echo "use it with: export FLWR_HOME=$HOME_DIR"
