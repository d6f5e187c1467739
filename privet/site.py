r"""``privet site check``: a site's SuperNode configuration, checked before the SuperNode starts.

::

    privet site check --node-config 'partition-id=0 num-partitions=3 client-id="site-0" epsilon=2.5' \
        --superlink fl.example.org:9092 --root-certificates deploy/certs/ca.crt \
        --auth-supernode-private-key deploy/keys/supernode-0

reads the ``--node-config`` string exactly as Flower's ``flower-supernode`` does (space-separated
``key=value`` pairs, each value a TOML value; or one ``.toml`` file), and checks every key the
ClientApp reads with the ClientApp's own rules (:func:`client.profile.resolve_profile`, deployed
semantics: the budget comes from the node config only). Where Flower's parser would stop with
"The provided configuration string is in an invalid format" and no key, this names the key and
how to quote its value. It also looks at what the site's files must be: the certificate and key,
the ledger's folder (and an existing ledger's spend), the data. On success it prints the exact
``flower-supernode`` command line on stdout (notes on stderr), so that a site can run
``$(privet site check ...)``; otherwise one line per problem and exit status 2.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
import re
import shlex
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from protocol import keys

#: Every node-config key the ClientApp reads (``protocol.keys.NODE_*``: one place for a wire key).
NODE_KEYS: tuple[str, ...] = tuple(sorted(v for k, v in vars(keys).items()
                                          if k.startswith("NODE_") and isinstance(v, str)))
#: Flower 1.39's ``flwr.common.config.parse_config_args`` pattern for one ``key=value`` pair.
PAIR = re.compile(r"(\S+?)=(\'[^\']*\'|\"[^\"]*\"|\S+)")
#: Keys whose value must be a number (a quoted number is accepted by the client too).
NUMERIC_KEYS = (keys.NODE_PARTITION_ID, keys.NODE_NUM_PARTITIONS, keys.NODE_EPSILON, keys.NODE_DELTA,
                keys.NODE_MAX_EXAMPLES)


class SiteConfigError(ValueError):
    """A problem with the site's configuration (the message names the key)."""


@dataclass
class SiteCheck:
    """What ``privet site check`` found."""

    node_config: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ parsing
def _value_hint(key: str, raw: str) -> str:
    """How to write ``key``'s value so that Flower's TOML reads it."""
    bare = raw.strip("'\"")
    if key in NUMERIC_KEYS:
        example = f"{key}=2.5" if key in (keys.NODE_EPSILON, keys.NODE_DELTA) else f"{key}=0"
        return (f"{key} takes a number, written bare: {example} (only text is quoted, in double quotes inside the "
                "shell's single quotes: --node-config '... client-id=\"site-0\"')")
    return (f"text goes in double quotes: {key}=\"{bare}\" (inside the shell's single quotes: "
            f"--node-config '... {key}=\"{bare}\"')")


def parse_node_config(text: str) -> dict[str, Any]:
    """The node config Flower's SuperNode would get from ``--node-config TEXT``, pair by pair.

    Raises
    ------
    SiteConfigError
        Naming the first key whose value is not a TOML value (with how to write it), a key given
        twice, or text that is not ``key=value``.
    """
    text = text.strip()
    if text.endswith(".toml") and " " not in text:
        path = Path(text).expanduser()
        try:
            with path.open("rb") as fh:
                table = tomllib.load(fh)
        except OSError as exc:
            raise SiteConfigError(f"node-config file {text}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SiteConfigError(f"node-config file {text}: TOML syntax error: {exc}") from None
        return dict(table)
    config: dict[str, Any] = {}
    leftover = PAIR.sub(" ", text).split()
    if leftover:
        raise SiteConfigError(f"node-config: {' '.join(leftover)!r} is not key=value (pairs are separated by "
                              "spaces, with no space around '=')")
    for key, raw in PAIR.findall(text):
        if key in config:
            raise SiteConfigError(f"node-config '{key}' is given twice")
        try:
            config[key] = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            raise SiteConfigError(
                f"node-config '{key}': {raw} is not a value Flower can read (it would stop with \"The provided "
                f"configuration string is in an invalid format\", without naming the key); {_value_hint(key, raw)}"
            ) from None
    return config


def format_node_config(config: dict[str, Any]) -> str:
    """``config`` as one ``--node-config`` string (TOML values, keys in the ClientApp's order)."""
    order = {k: i for i, k in enumerate((keys.NODE_PARTITION_ID, keys.NODE_NUM_PARTITIONS, keys.NODE_CLIENT_ID,
                                         keys.NODE_EPSILON, keys.NODE_DELTA, keys.NODE_LEDGER_PATH))}

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, float):
            return "inf" if v == math.inf else repr(v)
        if isinstance(v, int):
            return str(v)
        return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'

    items = sorted(config.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))
    return " ".join(f"{k}={value(v)}" for k, v in items)


# ----------------------------------------------------------------- checking
def unknown_keys(config: dict[str, Any]) -> list[str]:
    """One problem per key the ClientApp does not read (with the closest known key)."""
    out = []
    for key in sorted(set(config) - set(NODE_KEYS)):
        close = difflib.get_close_matches(key, NODE_KEYS, n=1, cutoff=0.6)
        hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(NODE_KEYS)}"
        out.append(f"node-config '{key}' is not a key privet reads (it would be ignored); {hint}")
    return out


def check_profile(config: dict[str, Any], check: SiteCheck) -> None:
    """The ClientApp's own rules (:func:`client.profile.resolve_profile`) as a deployed site applies them."""
    from client.profile import resolve_profile

    declared = dict(config)
    if keys.NODE_EPSILON not in declared:
        check.notes.append(f"no '{keys.NODE_EPSILON}': this site takes part in non-private runs only (it refuses "
                           f"every private run at the handshake); add {keys.NODE_EPSILON}=<eps> {keys.NODE_DELTA}="
                           "<delta> to train under a privacy budget")
        declared[keys.NODE_EPSILON] = math.inf  # deployed semantics without a budget
    try:
        profile = resolve_profile(declared, {})
    except ValueError as exc:
        check.problems.append(str(exc))
        return
    if keys.NODE_EPSILON in config:
        check.notes.append(f"site {profile.client_id!r}: partition {profile.partition_id} of "
                           f"{profile.num_partitions}, budget eps={profile.epsilon_budget:g} "
                           f"delta={profile.delta:g} over all runs")
    if keys.NODE_CLIENT_ID not in config:
        check.notes.append(f"no '{keys.NODE_CLIENT_ID}': the site is known as {profile.client_id!r} (its "
                           "partition id); give it a stable name, e.g. client-id=\"site-0\"")
    if profile.ledger_path is None:
        check.notes.append(f"no '{keys.NODE_LEDGER_PATH}': this site's spent budget starts again at zero in every "
                           "run; set ledger-path=\"/var/lib/privet/ledgers/<site>.json\" on a persistent disk")
    else:
        _check_ledger(Path(profile.ledger_path), profile.epsilon_budget, check)


def _check_ledger(path: Path, budget: float, check: SiteCheck) -> None:
    folder = path.parent
    if not folder.is_dir():
        check.problems.append(f"node-config '{keys.NODE_LEDGER_PATH}': the folder {folder} does not exist "
                              f"(create it: mkdir -p {shlex.quote(str(folder))})")
        return
    if not os.access(folder, os.W_OK):
        check.problems.append(f"node-config '{keys.NODE_LEDGER_PATH}': the folder {folder} is not writable by "
                              "this user (the SuperNode's user writes the ledger there)")
        return
    if not path.exists():
        check.notes.append(f"ledger {path}: new (nothing spent yet)")
        return
    from privacy.ledger import PrivacyLedger

    try:
        ledger = PrivacyLedger.load(path)
    except (OSError, ValueError) as exc:
        check.problems.append(f"node-config '{keys.NODE_LEDGER_PATH}': {exc}")
        return
    check.notes.append(f"ledger {path}: eps={ledger.spent():.4f} spent of {budget:g}")


def check_data(config: dict[str, Any], dataset: str, check: SiteCheck) -> None:
    """The dataset the runs will use, in the site's ``data-dir`` (or the default folder)."""
    from tasks.datasets import check_available

    data_dir = config.get(keys.NODE_DATA_DIR)
    try:
        check_available(dataset, str(data_dir) if data_dir else None)
    except (FileNotFoundError, ValueError) as exc:
        where = f"node-config '{keys.NODE_DATA_DIR}'" if data_dir else f"dataset {dataset!r}"
        check.problems.append(f"{where}: {exc}")


def check_site(node_config: str, *, superlink: str, root_certificates: str | None, private_key: str | None,
               insecure: bool = False, dataset: str = "fashion-mnist") -> SiteCheck:
    """Everything ``privet site check`` checks, and the command line it prints."""
    check = SiteCheck()
    try:
        check.node_config = parse_node_config(node_config)
    except SiteConfigError as exc:
        check.problems.append(str(exc))
        return check
    check.problems += unknown_keys(check.node_config)
    check_profile(check.node_config, check)
    check_data(check.node_config, dataset, check)
    command = ["flower-supernode"]
    if insecure:
        command.append("--insecure")
        check.notes.append("--insecure: no TLS; for a test deployment on one machine only")
    elif not root_certificates:
        check.problems.append("--root-certificates FILE is required: the SuperLink's CA certificate "
                              "(deploy/certs/ca.crt from deploy/generate-certs.sh), or --insecure for a test without TLS")
    else:
        _need_file(root_certificates, "--root-certificates", check)
        command += ["--root-certificates", root_certificates]
    command += ["--superlink", superlink]
    if private_key:
        _need_file(private_key, "--auth-supernode-private-key", check)
        command += ["--auth-supernode-private-key", private_key]
    else:
        check.notes.append("no --auth-supernode-private-key: only a SuperLink without --enable-supernode-auth "
                           "accepts this site")
    command += ["--node-config", format_node_config(check.node_config)]
    check.command = command
    if shutil.which("flower-supernode") is None:
        local = Path(sys.executable).with_name("flower-supernode")
        check.notes.append(f"flower-supernode is not on PATH: `source {local.parent / 'activate'}` first, or run "
                           f"{local}" if local.exists() else "flower-supernode is not on PATH: install privet "
                           "(pip install -c constraints.txt .) in this environment and activate it")
    return check


def _need_file(path: str, flag: str, check: SiteCheck) -> None:
    p = Path(path)
    if not p.is_file():
        check.problems.append(f"{flag} {path}: no such file")
    elif not os.access(p, os.R_OK):
        check.problems.append(f"{flag} {path}: not readable by this user")


# ---------------------------------------------------------------------- CLI
SITE_HELP = """\
Check a site's SuperNode configuration before starting it: every --node-config key the
ClientApp reads, with the ClientApp's own rules (partition, budget, delta, noise source,
evaluation, ledger, data), the files it names, and quoting. Prints the exact
flower-supernode command line on stdout (notes on stderr); exit status 2 with one line per
problem otherwise.

examples:
  privet site check --node-config 'partition-id=0 num-partitions=3 client-id="site-0" epsilon=2.5 delta=1e-5 ledger-path="/var/lib/privet/ledgers/site-0.json"' \\
      --superlink fl.example.org:9092 --root-certificates deploy/certs/ca.crt \\
      --auth-supernode-private-key deploy/keys/supernode-0
  privet site check --node-config site-0.toml --superlink 127.0.0.1:9092 --insecure"""


def add_parser(sub: Any) -> None:
    """``privet site check`` on the ``privet`` command's subparsers."""
    site = sub.add_parser("site", help="check a site's SuperNode configuration",
                          description=SITE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    site_sub = site.add_subparsers(dest="site_command", required=True, metavar="{check}")
    check = site_sub.add_parser("check", help="check a --node-config and print the flower-supernode command",
                                description=SITE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    check.add_argument("--node-config", required=True, metavar="'KEY=VALUE ...' | FILE.toml",
                       help="exactly what flower-supernode's --node-config gets")
    check.add_argument("--superlink", default="127.0.0.1:9092", help="the SuperLink's Fleet API, HOST:PORT")
    check.add_argument("--root-certificates", help="the SuperLink's CA certificate (deploy/certs/ca.crt)")
    check.add_argument("--auth-supernode-private-key", dest="private_key",
                       help="this site's private key (deploy/keys/supernode-<i>)")
    check.add_argument("--insecure", action="store_true", help="no TLS (a test deployment on one machine)")
    check.add_argument("--dataset", default="fashion-mnist", help="the dataset the runs use (default fashion-mnist)")
    check.set_defaults(func=cmd_site_check)


def cmd_site_check(args: argparse.Namespace) -> int:
    """Print the notes and the command, or every problem (exit 2)."""
    check = check_site(args.node_config, superlink=args.superlink, root_certificates=args.root_certificates,
                       private_key=args.private_key, insecure=args.insecure, dataset=args.dataset)
    if check.problems:
        for problem in check.problems:
            print(f"privet site check: error: {problem}", file=sys.stderr)
        return 2
    for note in check.notes:
        print(f"privet site check: {note}", file=sys.stderr)
    print(shlex.join(check.command))
    return 0
