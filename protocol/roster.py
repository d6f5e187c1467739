"""The federation roster: each site's long-term signing key, handed to every site out of band.

A server that deviates from the protocol can forward other keys than the members sent (and
so decrypt their secret shares), or let a node take another site's name. What stops it is a
trust anchor it does not control: the **roster**, a file the operator gives every site (and
the server) in its node config, mapping each ``client-id`` to its Ed25519 public key. Each
site holds the matching private key (its **signing key**) and signs

* its answer to the budget handshake, over the server's fresh challenge, its client id and the
  node id the server addressed (so the name is bound to the key, and a reply cannot be replayed
  by another node), and
* in every secure sum, its public keys (bound to the sum's parameters, which every member
  therefore agrees on) and the set of survivors it saw (the consistency round).

Signatures are Ed25519 (``cryptography``'s implementation; RFC 8032), over a domain-separated,
length-prefixed encoding (:func:`transcript`), so no message of one kind can be taken for
another. A deployment without a roster still runs secure sums; every guarantee sentence then
says "against a server that follows the protocol".

Roster file (JSON)::

    {"format": "privet-roster-1", "sites": {"site-0": "<base64 of the 32-byte public key>", ...}}

A signing key is a PKCS#8 PEM file (``privet roster generate`` writes both).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = ["ROSTER_FORMAT", "Roster", "SigningKey", "generate", "transcript"]

ROSTER_FORMAT = "privet-roster-1"


def transcript(kind: str, *parts: bytes | str | int) -> bytes:
    """The bytes a signature covers: a domain tag and length-prefixed parts (no two encodings collide)."""
    out = bytearray(b"privet/" + kind.encode() + b"\x00")
    for part in parts:
        raw = part.encode() if isinstance(part, str) else part.to_bytes(16, "big", signed=True) \
            if isinstance(part, int) else bytes(part)
        out += len(raw).to_bytes(8, "big") + raw
    return bytes(out)


def digest(*parts: bytes | str | int) -> bytes:
    """SHA-256 of a transcript of ``parts`` (e.g. a secure sum's parameters)."""
    return hashlib.sha256(transcript("digest", *parts)).digest()


@dataclass(frozen=True)
class SigningKey:
    """A site's long-term Ed25519 private key."""

    key: Ed25519PrivateKey

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        """Read a PKCS#8 PEM file; ValueError naming the file if it is not an Ed25519 private key."""
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise ValueError(f"signing key {os.fspath(path)!r} cannot be read: {exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise ValueError(f"signing key {os.fspath(path)!r} is not an Ed25519 private key")
        return cls(key)

    def sign(self, message: bytes) -> bytes:
        """An Ed25519 signature of ``message``."""
        return self.key.sign(message)

    def public_bytes(self) -> bytes:
        """The raw 32-byte public key."""
        return self.key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


@dataclass(frozen=True)
class Roster:
    """client-id -> Ed25519 public key: who may take part, under which name."""

    sites: Mapping[str, bytes]

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Roster:
        """Read a roster file; ValueError naming the file and what is wrong."""
        name = os.fspath(path)
        try:
            state = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ValueError(f"roster {name!r} cannot be read: {exc}") from None
        if not isinstance(state, dict) or state.get("format") != ROSTER_FORMAT or not isinstance(state.get("sites"),
                                                                                                  dict):
            raise ValueError(f"roster {name!r} must be {{\"format\": \"{ROSTER_FORMAT}\", \"sites\": {{...}}}}")
        sites: dict[str, bytes] = {}
        for site, encoded in state["sites"].items():
            try:
                raw = base64.b64decode(str(encoded), validate=True)
                Ed25519PublicKey.from_public_bytes(raw)
            except ValueError:
                raise ValueError(f"roster {name!r}: site {site!r} has no valid Ed25519 public key") from None
            sites[str(site)] = raw
        if not sites:
            raise ValueError(f"roster {name!r} lists no site")
        if len(set(sites.values())) != len(sites):
            raise ValueError(f"roster {name!r}: two sites share one key")
        return cls(sites)

    def verify(self, client_id: str, signature: bytes, message: bytes) -> str | None:
        """Why ``signature`` is not ``client_id``'s over ``message`` (None: it is)."""
        key = self.sites.get(client_id)
        if key is None:
            return f"{client_id!r} is not on the roster"
        try:
            Ed25519PublicKey.from_public_bytes(key).verify(signature, message)
        except InvalidSignature:
            return f"the signature is not {client_id!r}'s roster key's"
        return None

    def holds(self, client_id: str, key: SigningKey) -> bool:
        """Whether ``key`` is ``client_id``'s roster key (a site checks its own entry at start)."""
        return self.sites.get(client_id) == key.public_bytes()


def generate(sites: Iterable[str], folder: str | os.PathLike[str]) -> Path:
    """Write a signing key per site (``<folder>/keys/<site>.pem``, mode 0600) and ``<folder>/roster.json``.

    Returns the roster's path. For an operator (``privet roster generate``) and for simulations,
    where privet is every site's operator.
    """
    out = Path(folder)
    (out / "keys").mkdir(parents=True, exist_ok=True)
    public: dict[str, str] = {}
    for site in sites:
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        path = out / "keys" / f"{site}.pem"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        public[site] = base64.b64encode(SigningKey(key).public_bytes()).decode()
    roster = out / "roster.json"
    roster.write_text(json.dumps({"format": ROSTER_FORMAT, "sites": public}, indent=1))
    return roster


def simulated_key_path(roster: str | os.PathLike[str], client_id: str) -> Path:
    """Where :func:`generate` put ``client_id``'s signing key, beside the roster (simulation only)."""
    return Path(roster).parent / "keys" / f"{client_id}.pem"
