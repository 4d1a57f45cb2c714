"""API keys with scopes, the bind rule, and ``python -m service.security`` to make keys.

Keys are configured as hashes (``OPML_API_KEYS``, a JSON list of ``"<sha256 hex>:<scopes>"``
entries), so the configuration never holds a usable secret. A presented key is hashed and
compared with *every* configured hash by :func:`hmac.compare_digest` (no early exit), so the
answer time does not depend on which hash, or how much of one, matched. Keys are never logged.

Scopes: ``query`` (reads), ``ingest`` (samples), ``admin`` (create/delete models, replace a
metric); ``admin`` includes the other two.

>>> entry = entry_for("s3cret", ["ingest"])
>>> ring = KeyRing.parse([entry])
>>> sorted(map(str, ring.scopes_of("s3cret") or ()))
['ingest']
>>> ring.scopes_of("guess") is None
True
>>> sorted(map(str, KeyRing.parse([entry_for("k", ["admin"])]).scopes_of("k") or ()))
['admin', 'ingest', 'query']
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import secrets
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum


class Scope(StrEnum):
    """What a key may do."""

    QUERY = "query"
    INGEST = "ingest"
    ADMIN = "admin"


#: ``admin`` implies the others: an operator's key can also read and ingest.
IMPLIED = {Scope.ADMIN: (Scope.QUERY, Scope.INGEST)}


def key_hash(key: str) -> str:
    """The SHA-256 hex digest of a key, as ``OPML_API_KEYS`` holds it."""
    return hashlib.sha256(key.encode()).hexdigest()


def entry_for(key: str, scopes: Iterable[str]) -> str:
    """The ``OPML_API_KEYS`` entry of ``key`` with ``scopes``."""
    return f"{key_hash(key)}:{','.join(Scope(s).value for s in scopes)}"


@dataclass(frozen=True)
class _Key:
    digest: bytes
    scopes: frozenset[Scope]


class KeyRing:
    """The configured keys (their hashes and scopes); empty = authentication off."""

    def __init__(self, keys: list[_Key]) -> None:
        self._keys = keys

    @classmethod
    def parse(cls, entries: Iterable[str]) -> KeyRing:
        """Read ``"<sha256 hex>:<scope>,<scope>"`` entries; ValueError names a bad one."""
        keys = []
        for n, entry in enumerate(entries):
            digest, sep, scopes = entry.strip().partition(":")
            try:
                raw = bytes.fromhex(digest)
                granted = {Scope(s.strip()) for s in scopes.split(",") if s.strip()}
            except ValueError:
                raw, granted = b"", set()
            if not sep or len(raw) != 32 or not granted:
                raise ValueError(
                    f"OPML_API_KEYS[{n}]: expected '<64 hex digits>:<scopes>' with scopes from "
                    f"{[s.value for s in Scope]} (the entry itself is not shown)"
                )
            for scope in list(granted):
                granted.update(IMPLIED.get(scope, ()))
            keys.append(_Key(raw, frozenset(granted)))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def scopes_of(self, key: str) -> frozenset[Scope] | None:
        """The scopes of ``key``, or None if it is not configured (constant-time compares)."""
        digest = hashlib.sha256(key.encode()).digest()
        found: frozenset[Scope] | None = None
        for candidate in self._keys:  # every hash is compared: no early exit
            if hmac.compare_digest(digest, candidate.digest):
                found = candidate.scopes
        return found


def is_loopback(host: str) -> bool:
    """True if ``host`` (an address or a name) only ever means this machine.

    >>> is_loopback("127.0.0.1"), is_loopback("::1"), is_loopback("0.0.0.0")
    (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def bind_refusal(host: str, keys: KeyRing, allow_insecure_bind: bool) -> str | None:
    """Why the service must not bind ``host``, or None if it may.

    Without API keys anyone who reaches the port can create, feed and delete models, so only a
    loopback interface is allowed unless ``OPML_ALLOW_INSECURE_BIND=true`` says otherwise.

    >>> bind_refusal("127.0.0.1", KeyRing([]), False) is None
    True
    >>> bind_refusal("0.0.0.0", KeyRing([]), False) is not None
    True
    >>> bind_refusal("0.0.0.0", KeyRing([]), True) is None
    True
    """
    if keys.enabled or allow_insecure_bind or is_loopback(host):
        return None
    return (
        f"refusing to bind {host!r} without API keys: anyone reaching it could change models. "
        "Configure OPML_API_KEYS (see `python -m service.security new --help`), bind a loopback "
        "address (OPML_HOST=127.0.0.1), or set OPML_ALLOW_INSECURE_BIND=true"
    )


def main(argv: list[str] | None = None) -> int:
    """``new``: make a random key and its entry; ``hash``: the entry of a key read from stdin."""
    parser = argparse.ArgumentParser(
        prog="python -m service.security", description="Make OPML_API_KEYS entries."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, text in (
        ("new", "print a fresh random key (give it to the client) and its entry"),
        ("hash", "read a key from stdin, print its entry (the key is not echoed)"),
    ):
        p = sub.add_parser(command, help=text, description=text)
        p.add_argument(
            "--scopes",
            default="query",
            help="comma-separated: query, ingest, admin (admin includes the others)",
        )
    args = parser.parse_args(argv)
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    try:
        [Scope(s) for s in scopes]
    except ValueError:
        parser.error(f"--scopes: choose from {[s.value for s in Scope]}")
    if args.command == "new":
        key = secrets.token_urlsafe(32)  # URL-safe: also valid inside a WebSocket subprotocol
        print(f"key:   {key}")
        print(f"entry: {entry_for(key, scopes)}")
        return 0
    key = sys.stdin.readline().strip()
    if not key:
        parser.error("no key on stdin")
    print(entry_for(key, scopes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
