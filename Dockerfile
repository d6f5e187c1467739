# One image for every process of a privet deployment: the SuperLink (with the ServerApp
# it starts as a subprocess), a SuperNode (with its ClientApp subprocesses), and the
# `flwr`/`privet` CLIs. What each container runs is chosen by its command:
#
#   docker run privet flower-superlink --ssl-... --enable-supernode-auth --database /var/lib/privet/state.db
#   docker run privet flower-supernode --root-certificates ... --superlink superlink:9092 --node-config "..."
#
# Build:
#   docker build -t privet:latest .
#   docker build --build-arg BASE_IMAGE=registry.example.org/python:3.11-slim -t privet .
#
# Offline / air-gapped: put wheels of every dependency in .wheelhouse/ at the repo root
# (deploy/build-wheelhouse.sh does it) and the build installs from there only
# (pip --no-index --find-links). Without a wheelhouse it installs from the package index
# (PIP_INDEX_URL can be passed as a build arg for a mirror).
#
# Fashion-MNIST: the four IDX files (*-ubyte or *-ubyte.gz) found in deploy/data/ are
# copied to /usr/share/datasets/fashion-mnist, the default data folder; otherwise mount
# them there at run time (-v /usr/share/datasets/fashion-mnist:/usr/share/datasets/fashion-mnist:ro)
# or point the node config's data-dir at a mounted folder.
#
# No secrets are baked in: certificates, keys, budgets and ledgers are mounted at run time.

ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG PIP_INDEX_URL=""
# where torch's CPU-only build comes from when there is no wheelhouse (PyPI's Linux
# torch wheel is the multi-GB CUDA build)
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG PRIVET_UID=10001

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    FLWR_TELEMETRY_ENABLED=0 \
    FLWR_DISABLE_UPDATE_CHECK=1 \
    FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 \
    FLWR_HOME=/var/lib/privet/flwr \
    OMP_NUM_THREADS=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

# A virtual environment works the same on python:3.11-slim and on Debian's python3
# (which refuses system-wide pip installs).
RUN python3 -c 'import sys; assert sys.version_info[:2] == (3, 11), "privet needs Python 3.11: " + sys.version' \
    && python3 -m venv /opt/venv

# 1) Dependencies, in their own layer (rebuilt only when pyproject.toml, constraints.txt or the
#    wheelhouse changes): pyproject's ranges at the exact versions of constraints.txt (the tested
#    set). `.wheelhouse*` matches nothing when there is no wheelhouse: then the index is used.
COPY pyproject.toml constraints.txt .wheelhouse* /tmp/wheelhouse/
RUN set -eu; \
    cd /tmp/wheelhouse; \
    python3 -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' > requirements.txt; \
    if ls *.whl >/dev/null 2>&1; then \
        echo "installing from the wheelhouse only ($(ls *.whl | wc -l) wheels)"; \
        set -- --no-index --find-links /tmp/wheelhouse; \
    else \
        echo "no wheelhouse: installing from the package index"; \
        set -- ${PIP_INDEX_URL:+--index-url "$PIP_INDEX_URL"}; \
    fi; \
    if ls *.whl >/dev/null 2>&1; then \
        pip install "$@" "torch==2.13.0"; \
    else \
        pip install --index-url "$TORCH_INDEX_URL" "torch==2.13.0" || pip install "$@" "torch==2.13.0"; \
    fi; \
    pip install "$@" -c constraints.txt -r requirements.txt hatchling; \
    rm -rf /tmp/wheelhouse

# 2) Fashion-MNIST IDX files, when the build context has them in deploy/data/
#    (deploy/data/README.md is always there so this COPY never fails).
COPY deploy/data/ /usr/share/datasets/fashion-mnist/
RUN rm -f /usr/share/datasets/fashion-mnist/README.md /usr/share/datasets/fashion-mnist/.gitignore

# 3) privet itself (the FAB that `flwr run` ships is the same code).
WORKDIR /opt/privet
COPY pyproject.toml README.md ./
COPY server/ server/
COPY protocol/ protocol/
COPY privet/ privet/
COPY client/ client/
COPY strategies/ strategies/
COPY privacy/ privacy/
COPY tasks/ tasks/
COPY deploy/healthcheck.py /usr/local/bin/privet-healthcheck
RUN pip install --no-deps --no-build-isolation --no-index . \
    && chmod 0755 /usr/local/bin/privet-healthcheck \
    && python3 -c "import flwr, torch, opacus, server.app, client.app; print('flwr', flwr.__version__, 'torch', torch.__version__, 'opacus', opacus.__version__)"

# Non-root user; its state (FLWR_HOME, SuperLink database, ledgers, results) lives in
# /var/lib/privet, which compose mounts as a volume.
RUN (useradd --system --uid "${PRIVET_UID}" --user-group --home-dir /var/lib/privet --shell /usr/sbin/nologin privet \
        || adduser -S -u "${PRIVET_UID}" -h /var/lib/privet privet) \
    && mkdir -p /var/lib/privet/flwr /var/lib/privet/ledgers /var/lib/privet/results /tmp/matplotlib \
    && chown -R privet:privet /var/lib/privet /tmp/matplotlib
USER privet
WORKDIR /var/lib/privet

# 9092: Fleet API (gRPC, SuperNodes connect here). 9093: SuperLink Control API (HTTP, the
# operator's `flwr` CLI; do not expose it publicly). 9094: a SuperNode's local Runtime API.
# 8081: gRPC health service (--health-server-address), used by the HEALTHCHECK.
EXPOSE 9092 9093 9094 8081
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["privet-healthcheck"]
CMD ["flower-superlink", "--help"]
