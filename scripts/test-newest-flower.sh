#!/usr/bin/env bash
# Run the fast tests (`pytest -m "not slow"`) against the newest Flower release on the package index,
# in a separate virtual environment: what a team already on the newest Flower gets when it installs
# privet into its project.
#
#   scripts/test-newest-flower.sh                  newest flwr on the index, every fast test
#   scripts/test-newest-flower.sh tests/privet     newest flwr, only these tests (pytest arguments)
#   FLWR_VERSION=1.41.0 scripts/test-newest-flower.sh     a given release instead
#   PRIVET_NEWEST_VENV=/path scripts/test-newest-flower.sh   where the venv lives
#                                       (default: ~/.cache/privet/venv-flwr-newest, reused)
#
# The venv gets torch==2.13.0 first (as setup.sh does: no other requirement may pull a CUDA build),
# then privet with its test extra and flwr[simulation]==<newest>, every other package held to
# constraints.txt where that resolves (so that only Flower and what it needs differ from the
# tested set), else resolved freely within pyproject.toml's ranges; the script says which.
# Prints the versions that differ from constraints.txt, then the tests' result; exits with pytest's
# status (0: every fast test passed on the newest Flower).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
VENV="${PRIVET_NEWEST_VENV:-$HOME/.cache/privet/venv-flwr-newest}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), f"privet needs Python 3.11, found {sys.version}"'

newest_flwr() {  # the newest release of flwr on the configured index (pip's own client)
    "$PY" -m pip index versions flwr 2>/dev/null | sed -n -E 's/^flwr \(([^)]+)\).*/\1/p' | head -n 1
}
VERSION="${FLWR_VERSION:-$(newest_flwr)}"
[[ -n "$VERSION" ]] || { echo "test-newest-flower: could not ask the package index for flwr's releases" >&2; exit 2; }
TESTED=$(sed -n -E 's/^flwr==(.*)$/\1/p' constraints.txt)
echo "==> Flower $VERSION (constraints.txt tests $TESTED) in $VENV"

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
PIP=("$VENV/bin/python" -m pip --quiet --disable-pip-version-check)
quiet_pip() {  # pip, without this machine's notes on find-links folders that hold no such package
    "${PIP[@]}" "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}
quiet_pip install --upgrade pip
quiet_pip install "torch==2.13.0"
# constraints.txt without flwr itself: everything else stays at the tested version if it can
others=$(mktemp)
trap 'rm -f "$others"' EXIT
grep -v -E '^flwr==' constraints.txt > "$others"
piperr=$(mktemp)
trap 'rm -f "$others" "$piperr"' EXIT
if "${PIP[@]}" install -c "$others" -e "$REPO[test]" "flwr[simulation]==$VERSION" 2>"$piperr"; then
    echo "==> installed with every other package at its constraints.txt version"
else
    echo "==> flwr $VERSION needs other versions than constraints.txt holds; resolving within pyproject.toml's ranges"
    quiet_pip install -e "$REPO[test]" "flwr[simulation]==$VERSION"
fi
echo "==> versions that differ from constraints.txt:"
"$VENV/bin/python" -m pip freeze --exclude-editable 2>/dev/null | sed -E 's/\+[^ ]*$//' | LC_ALL=C sort \
    | LC_ALL=C comm -13 <(grep -v '^#' constraints.txt | LC_ALL=C sort) - | sed 's/^/    /' || true
echo "==> fast tests on flwr $("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("flwr"))')"
# The editable install points at this checkout; a private FLWR_HOME keeps the user's Flower config out.
export FLWR_HOME="${FLWR_HOME_NEWEST:-$(mktemp -d)}" FLWR_TELEMETRY_ENABLED=0
PATH="$VENV/bin:$PATH" "$VENV/bin/python" -m pytest -q -m "not slow" -p no:cacheprovider "${@:-tests}"
