"""``privet roster generate``: the federation's roster and one signing key per site, for an operator.

The operator hands each site its key (``keys/<site>.pem``, mode 0600: it never leaves the site) and
every site, and the server, the roster (``roster.json``), out of band; each site names both in its
SuperNode's ``--node-config`` (``roster=... signing-key=...``). See docs/deployment.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def cmd_generate(args: argparse.Namespace) -> int:
    """Write the keys and the roster; print where."""
    from protocol.roster import generate

    sites = list(args.sites) or [f"{args.prefix}{i}" for i in range(args.count)]
    if len(set(sites)) != len(sites):
        print("privet: error: a site name is given twice", flush=True)
        return 2
    roster = generate(sites, Path(args.out))
    print(f"privet: roster of {len(sites)} sites in {roster}; signing keys in {roster.parent / 'keys'} "
          "(give each site its own key only)")
    return 0


def add_parser(sub: Any) -> None:
    """Register ``privet roster generate``."""
    roster = sub.add_parser("roster", help="make the federation roster and the sites' signing keys")
    actions = roster.add_subparsers(dest="roster_command", required=True)
    gen = actions.add_parser("generate", help="write roster.json and keys/<site>.pem")
    gen.add_argument("sites", nargs="*", help="client ids (default: --count sites named <prefix><i>)")
    gen.add_argument("--count", type=int, default=2, help="number of sites when none is named")
    gen.add_argument("--prefix", default="site-", help="site name prefix when none is named")
    gen.add_argument("--out", default="deploy/roster", help="folder to write (default deploy/roster)")
    gen.set_defaults(func=cmd_generate)
