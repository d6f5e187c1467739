"""The Docker image and the compose stack, end to end (slow; needs a Docker engine).

1. a base image: ``$PRIVET_BASE_IMAGE``, else a local ``python:3.11-slim``, else one built
   from Debian bookworm with debootstrap (``deploy/build-base-image.sh``; no image registry
   needed);
2. a wheelhouse of the pinned dependencies (``deploy/build-wheelhouse.sh``);
3. ``docker build`` of our image from both, offline (``pip --no-index``);
4. ``deploy/generate-certs.sh`` + ``deploy/compose.py 3`` and ``compose up``: a SuperLink
   with TLS, SuperNode authentication and a database on a volume, three SuperNodes with
   their own budgets and ledger volumes, and the one-shot key registration;
5. a 3-round experiment with ``flwr run`` from this machine against the stack, one site restarted
   after round 1 and again after round 2 (it must keep the run's cap, ``run-epsilon``, stored with
   its ledger), checked with ``flwr ls --format json``, the run's summary.json copied out of the
   SuperLink and the restarted site's ledger;
6. ``compose down -v``.

The base image tarball and the wheelhouse are cached in ``$PRIVET_CACHE``
(default /var/cache/privet-ci), so later runs only rebuild what changed. If no Docker
engine is running and this is root with ``dockerd`` installed, the test starts one for
itself and stops it afterwards. Otherwise it skips, saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
import tomllib
import uuid
from pathlib import Path

import pytest

from privacy.ledger import PrivacyLedger
from tests.deploy_support import FAST, generate_certs, missing
from tests.flower_processes import APP_DIR, BIN, free_port, stop

pytestmark = pytest.mark.slow

CACHE = Path(os.environ.get("PRIVET_CACHE", "/var/cache/privet-ci"))
IMAGE = "privet:ci-test"
DATA = Path(os.environ.get("PRIVET_DATA", "/usr/share/datasets/fashion-mnist"))
BUDGETS = [1.0, 2.5, 6.0]
ROUNDS = 3
RUN_EPSILON = 0.6  # each site's cap for the run, below every budget
#: the build context: the files the Dockerfile copies, and every package the wheel ships
PACKAGES = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"][
    "packages"]
CONTEXT_FILES = ["Dockerfile", ".dockerignore", "pyproject.toml", "constraints.txt", "README.md", *PACKAGES]


def _run(cmd: list[str], timeout: float = 600, check: bool = True, **kw) -> subprocess.CompletedProcess:
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> {res.returncode}\n{res.stdout[-4000:]}\n{res.stderr[-4000:]}")
    return res


def _engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


@pytest.fixture(scope="module")
def docker_engine():
    """A running Docker engine: the one there is, or a ``dockerd`` started here (root)."""
    if missing("docker"):
        pytest.skip("no `docker` CLI on this machine (CI installs docker.io; see .ci/run)")
    proc = None
    if not _engine_up():
        if os.geteuid() != 0 or missing("dockerd"):
            pytest.skip("no Docker engine is running and this test cannot start one "
                        f"({'not root' if os.geteuid() != 0 else 'no dockerd'})")
        log = open(CACHE.parent / "privet-dockerd.log" if CACHE.parent.exists() else "/tmp/privet-dockerd.log", "a")
        proc = subprocess.Popen(["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 60
        while not _engine_up():
            if proc.poll() is not None or time.monotonic() > deadline:
                stop(proc)
                pytest.skip(f"dockerd could not start here (exit {proc.returncode}); see {log.name}")
            time.sleep(1)
    try:
        yield
    finally:
        if proc is not None:
            stop(proc, timeout=30)


def _compose_cmd() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if not missing("docker-compose"):
        return ["docker-compose"]
    pytest.skip("neither `docker compose` (v2 plugin) nor `docker-compose` is installed")


def _base_image(timings: dict) -> str:
    wanted = os.environ.get("PRIVET_BASE_IMAGE")
    if wanted:
        return wanted
    if _run(["docker", "image", "inspect", "python:3.11-slim"], check=False).returncode == 0:
        return "python:3.11-slim"
    tag = "privet/python:3.11-bookworm"
    if _run(["docker", "image", "inspect", tag], check=False).returncode != 0:
        if missing("debootstrap"):
            pytest.skip("no python:3.11-slim image, no image registry, and no debootstrap to build one "
                        "(apt-get install debootstrap)")
        t = time.monotonic()
        _run(["bash", str(APP_DIR / "deploy" / "build-base-image.sh"), tag], timeout=1800,
             env={**os.environ, "PRIVET_CACHE": str(CACHE)})
        timings["base image (debootstrap + import)"] = time.monotonic() - t
    return tag


def _wheelhouse(timings: dict) -> Path:
    """The cached wheelhouse, rebuilt when the project's dependencies change."""
    wheels = CACHE / "wheelhouse"
    import tomllib

    deps = tomllib.loads((APP_DIR / "pyproject.toml").read_text())["project"]["dependencies"]
    pins = (APP_DIR / "constraints.txt").read_text()  # the exact versions the wheelhouse holds
    stamp = hashlib.sha256(json.dumps([sorted(deps), pins]).encode()).hexdigest()
    stamp_file = wheels / ".deps-sha256"
    if not (stamp_file.exists() and stamp_file.read_text() == stamp):
        t = time.monotonic()
        _run(["bash", str(APP_DIR / "deploy" / "build-wheelhouse.sh"), str(wheels)], timeout=1800,
             env={**os.environ, "PYTHON": str(BIN / "python")})
        stamp_file.write_text(stamp)
        timings["wheelhouse"] = time.monotonic() - t
    return wheels


def _context(tmp_path: Path, wheels: Path) -> Path:
    ctx = tmp_path / "context"
    ctx.mkdir()
    for name in CONTEXT_FILES:
        src = APP_DIR / name
        if src.is_dir():
            shutil.copytree(src, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(src, ctx / name)
    (ctx / "deploy").mkdir()
    shutil.copy2(APP_DIR / "deploy" / "healthcheck.py", ctx / "deploy" / "healthcheck.py")
    shutil.copytree(APP_DIR / "deploy" / "data", ctx / "deploy" / "data")
    try:  # hard links: no copy of ~0.5 GB when the cache is on the same file system
        _run(["cp", "-al", str(wheels), str(ctx / ".wheelhouse")])
    except AssertionError:
        shutil.copytree(wheels, ctx / ".wheelhouse")
    return ctx


def _flwr(home: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_UPDATE_CHECK": "1", "FLWR_TELEMETRY_ENABLED": "0",
           "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([str(BIN / "flwr"), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_compose_stack_with_tls_and_node_auth(tmp_path, docker_engine):
    if not (DATA / "train-images-idx3-ubyte.gz").exists() and not (DATA / "train-images-idx3-ubyte").exists():
        pytest.skip(f"no Fashion-MNIST IDX files in {DATA} to mount (apt-get install dataset-fashion-mnist)")
    compose = _compose_cmd()
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    base = _base_image(timings)
    wheels = _wheelhouse(timings)
    ctx = _context(tmp_path, wheels)

    t = time.monotonic()
    build = _run(["docker", "build", "--build-arg", f"BASE_IMAGE={base}", "-t", IMAGE, str(ctx)],
                 timeout=2400, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    timings["docker build"] = time.monotonic() - t
    assert "installing from the wheelhouse only" in build.stdout or "Using cache" in build.stdout
    user = _run(["docker", "run", "--rm", "--network", "none", IMAGE, "id", "-u"]).stdout.strip()
    assert user != "0", "the image runs as a non-root user"
    versions = _run(["docker", "run", "--rm", "--network", "none", IMAGE, "python", "-c",
                     "import flwr, torch, opacus; print(flwr.__version__, torch.__version__, opacus.__version__)"])
    pins = dict(line.split("==", 1) for line in (APP_DIR / "constraints.txt").read_text().splitlines()
                if "==" in line and not line.startswith("#"))
    flwr_v, torch_v, opacus_v = versions.stdout.split()  # the image holds exactly the tested versions
    assert (flwr_v, torch_v.split("+")[0], opacus_v) == (pins["flwr"], pins["torch"], pins["opacus"])

    certs, keys = generate_certs(ctx / "deploy", 3)
    _run(["python3", str(APP_DIR / "deploy" / "compose.py"), "3", "--budgets", ",".join(map(str, BUDGETS)),
          "-o", str(ctx / "docker-compose.yml")])
    fleet_port, control_port = free_port(), free_port()
    project = f"privetci{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PRIVET_IMAGE": IMAGE, "PRIVET_FLEET_BIND": "127.0.0.1",
           "PRIVET_FLEET_PORT": str(fleet_port), "PRIVET_CONTROL_PORT": str(control_port),
           "PRIVET_DATA": str(DATA), "COMPOSE_PROJECT_NAME": project}
    dc = [*compose, "-p", project, "-f", str(ctx / "docker-compose.yml")]
    cli = tmp_path / "cli"
    cli.mkdir()
    (cli / "config.toml").write_text(
        '[superlink]\ndefault = "privet-compose"\n\n'
        f'[superlink.privet-compose]\naddress = "127.0.0.1:{control_port}"\n'
        f'root-certificates = "{certs / "ca.crt"}"\n')
    try:
        t = time.monotonic()
        _run([*dc, "up", "-d", "--no-build"], timeout=600, cwd=ctx, env=env)
        deadline = time.monotonic() + 300
        while True:
            listing = _flwr(cli, "supernode", "list", "privet-compose", "--format", "json")
            try:
                nodes = json.loads(listing.stdout).get("nodes", [])
            except json.JSONDecodeError:
                nodes = []
            if len(nodes) == 3 and all(n["status"] == "online" for n in nodes):
                break
            if time.monotonic() > deadline:
                logs = _run([*dc, "logs", "--tail", "40"], cwd=ctx, env=env, check=False)
                pytest.fail(f"the stack did not come up: {listing.stdout}{listing.stderr}\n{logs.stdout}")
            time.sleep(2)
        timings["compose up -> 3 SuperNodes online"] = time.monotonic() - t
        health = _run(["docker", "inspect", "--format", "{{.State.Health.Status}}",
                       _run([*dc, "ps", "-q", "superlink"], cwd=ctx, env=env).stdout.strip()])
        assert health.stdout.strip() == "healthy"

        def submit(name: str, **extra) -> int:  # noqa: ANN003
            overrides = tmp_path / f"{name}.toml"
            overrides.write_text("\n".join(f"{k} = {json.dumps(v)}" for k, v in {
                **FAST, "num-clients": 3, "min-train-clients": 3, "out-dir": f"/var/lib/privet/results/{name}",
                **extra}.items()))
            out = _flwr(cli, "run", str(APP_DIR), "privet-compose", "--run-config", str(overrides), "--format", "json")
            assert out.returncode == 0, out.stdout + out.stderr
            return int(json.loads(out.stdout)["run-id"])

        def wait(run_id: int) -> str:
            deadline = time.monotonic() + 600
            while True:
                runs = json.loads(_flwr(cli, "ls", "privet-compose", "--format", "json").stdout)["runs"]
                status = next(r for r in runs if int(r["run-id"]) == run_id)["status"]
                if status.startswith("finished") or time.monotonic() > deadline:
                    return status
                time.sleep(3)

        # the run meets two restarts of supernode-1's container, after round 1 and after round 2: the
        # site comes back with its ledger volume, continues the run under the cap it stored with the
        # ledger (run-epsilon), and the run completes (a lost reply costs at most round-timeout). The
        # timeout is also the train messages' TTL: a restarted container that needs longer than it to pull
        # its message refuses it as stale, so it is set well above a restart on a loaded 2-core machine.
        t = time.monotonic()
        link = _run([*dc, "ps", "-q", "superlink"], cwd=ctx, env=env).stdout.strip()
        run_id = submit("ci", **{"round-timeout": 180.0, "num-server-rounds": ROUNDS, "run-epsilon": RUN_EPSILON})
        for after in (1, 2):
            deadline = time.monotonic() + 300
            while f'"round": {after}' not in _run(
                    ["docker", "exec", link, "cat", "/var/lib/privet/results/ci/rounds.jsonl"], check=False).stdout:
                assert time.monotonic() < deadline, f"round {after} never finished"
                time.sleep(1)
            _run([*dc, "restart", "supernode-1"], cwd=ctx, env=env, timeout=120)
        status = wait(run_id)
        timings[f"{ROUNDS}-round run (logreg, 256 examples/client), supernode-1 restarted twice"] = \
            time.monotonic() - t
        assert status == "finished:completed", _run([*dc, "logs", "--tail", "60"], cwd=ctx, env=env).stdout

        _run(["docker", "cp", f"{link}:/var/lib/privet/results/ci/summary.json", str(tmp_path / "summary.json")])
        summary = json.loads((tmp_path / "summary.json").read_text())
        assert summary["rounds_completed"] == ROUNDS and summary["final_accuracy"] > 0.2
        by_id = {c["client_id"]: c for c in summary["clients"]}
        for i, eps in enumerate(BUDGETS):
            c = by_id[f"site-{i}"]
            assert c["epsilon_budget"] == eps and c["within_budget"]
            assert 1 in c["rounds_joined"]
        # each SuperNode's ledger is on its own volume; its logs say what it did per round
        node = _run([*dc, "ps", "-q", "supernode-1"], cwd=ctx, env=env).stdout.strip()
        ledger = _run(["docker", "exec", node, "cat", "/var/lib/privet/ledgers/site-1.json"]).stdout
        assert json.loads(ledger)["history"]
        restarted = PrivacyLedger.from_json(ledger)  # the volume kept every charge across both restarts
        assert restarted.spent() >= by_id["site-1"]["epsilon_spent"] * (1 - 1e-9)
        assert restarted.rounds_joined() >= len(by_id["site-1"]["rounds_joined"])
        # the fresh ledger holds this run alone: two restarts never re-based the run's cap on it
        assert restarted.spent() <= RUN_EPSILON * (1 + 1e-9), (restarted.spent(), RUN_EPSILON)
        assert [plan.cap for plan in restarted.runs.values()] == [RUN_EPSILON]
        node_log = _run([*dc, "logs", "supernode-1"], cwd=ctx, env=env).stdout
        assert "client site-1 round 1 mode=dpsgd" in node_log
        # the Control API is the operator's alone: a SuperNode container reaches the Fleet API,
        # but neither the SuperLink's Control API by name nor its operator-network address
        probe = ("import socket, sys\n"
                 "def ok(h, p):\n"
                 "    try:\n"
                 "        socket.create_connection((h, p), 3).close(); return True\n"
                 "    except OSError:\n"
                 "        return False\n"
                 "print(ok('superlink', 9092), ok('superlink', 9093), ok('172.30.93.2', 9093))")
        reach = _run(["docker", "exec", node, "python", "-c", probe]).stdout.split()
        assert reach == ["True", "False", "False"], reach

        timings["total"] = time.monotonic() - t0
        print("compose test timings (s):", json.dumps({k: round(v, 1) for k, v in timings.items()}))
        (CACHE / "last-compose-timings.json").write_text(json.dumps(timings, indent=2))
    finally:
        _run([*dc, "down", "-v", "--remove-orphans", "--timeout", "20"], cwd=ctx, env=env, check=False,
             timeout=300)
