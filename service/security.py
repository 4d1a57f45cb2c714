"""API keys with scopes and model patterns, the bind rule, and ``python -m service.security``.

Keys are configured as hashes (``OPML_API_KEYS``, a JSON list of ``"<sha256 hex>:<scopes>"`` or
``"<sha256 hex>:<scopes>:<models>"`` entries), so the configuration never holds a usable
secret. A presented key is hashed and compared with *every* configured hash by
:func:`hmac.compare_digest` (no early exit), so the answer time does not depend on which hash,
or how much of one, matched. Keys are never logged.

Scopes: ``query`` (reads), ``ingest`` (samples), ``admin`` (create/delete models, replace a
metric); ``admin`` includes the other two.

Models: the optional third part limits a key to some models, for one key per tenant. It is a
``|``-separated list of exact model names and prefix patterns ending in ``*`` (``tenant-a-*|shared``
covers ``shared`` and every name starting with ``tenant-a-``; ``*`` alone covers every model, as an
entry without the third part does). A key limited so is answered 403 for any request naming a model
outside its patterns, before the model is looked up (the same answer whether or not it exists: a key
cannot probe for other tenants' names); it may create only models its patterns cover, and the model
list shows it only those. Everything outside ``/v1/models`` under ``/v1/`` is for unlimited keys
only. A malformed pattern (a ``*`` not at the end, characters no model name has, an empty list) is
a start-up error naming ``OPML_API_KEYS``.

>>> entry = entry_for("s3cret", ["ingest"])
>>> ring = KeyRing.parse([entry])
>>> sorted(map(str, ring.scopes_of("s3cret") or ()))
['ingest']
>>> ring.scopes_of("guess") is None
True
>>> sorted(map(str, KeyRing.parse([entry_for("k", ["admin"])]).scopes_of("k") or ()))
['admin', 'ingest', 'query']
>>> grant = KeyRing.parse([entry_for("t", ["ingest"], ["tenant-a-*", "shared"])]).grant_of("t")
>>> grant.covers("tenant-a-cam1"), grant.covers("shared"), grant.covers("tenant-b-cam1")
(True, True, False)
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import re
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


def entry_for(key: str, scopes: Iterable[str], models: Iterable[str] | None = None) -> str:
    """The ``OPML_API_KEYS`` entry of ``key`` with ``scopes`` (and, if given, limited to the
    ``models`` patterns); ValueError names a bad scope or pattern."""
    entry = f"{key_hash(key)}:{','.join(Scope(s).value for s in scopes)}"
    if models is None:
        return entry
    patterns = list(models)
    ModelPatterns.parse("|".join(patterns))  # checked here too: never print a bad entry
    return f"{entry}:{'|'.join(patterns)}"


#: An exact model name (as :data:`service.api.schemas.NAME_PATTERN`) and a prefix of one.
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,63}")
_PREFIX = re.compile(r"(?:[a-z0-9][a-z0-9_-]{0,62})?\*")


@dataclass(frozen=True)
class ModelPatterns:
    """The models a key covers: exact names and name prefixes (``None`` prefixes: all).

    >>> patterns = ModelPatterns.parse("tenant-a-*|shared")
    >>> patterns.covers("tenant-a-x"), patterns.covers("shared"), patterns.covers("shared2")
    (True, True, False)
    >>> ModelPatterns.parse("*").covers("anything")
    True
    >>> ModelPatterns.parse("a*b")
    Traceback (most recent call last):
    ...
    ValueError: model pattern 'a*b': expected a model name or a name prefix ending in '*'
    """

    names: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def parse(cls, text: str) -> ModelPatterns:
        """Read ``"<name or prefix*>|..."``; ValueError names the bad pattern."""
        names: set[str] = set()
        prefixes: list[str] = []
        for raw in text.split("|"):
            pattern = raw.strip()
            if _NAME.fullmatch(pattern):
                names.add(pattern)
            elif _PREFIX.fullmatch(pattern):
                prefixes.append(pattern[:-1])
            else:
                raise ValueError(
                    f"model pattern {pattern!r}: expected a model name or a name prefix ending "
                    "in '*'"
                )
        return cls(frozenset(names), tuple(sorted(set(prefixes))))

    @property
    def everything(self) -> bool:
        return "" in self.prefixes

    def covers(self, name: str) -> bool:
        """True if a key with these patterns may use model ``name``."""
        return name in self.names or any(name.startswith(p) for p in self.prefixes)


@dataclass(frozen=True)
class Grant:
    """What one key may do: its scopes, and the models it covers (``models`` None: all).

    >>> Grant(frozenset({Scope.QUERY}), None).covers("any")
    True
    """

    scopes: frozenset[Scope]
    models: ModelPatterns | None

    @property
    def limited(self) -> bool:
        """True if the key covers only some models."""
        return self.models is not None

    def covers(self, name: str) -> bool:
        """True if the key may use model ``name``."""
        return self.models is None or self.models.covers(name)


@dataclass(frozen=True)
class _Key:
    digest: bytes
    grant: Grant


class KeyRing:
    """The configured keys (their hashes and scopes); empty = authentication off."""

    def __init__(self, keys: list[_Key]) -> None:
        self._keys = keys

    @classmethod
    def parse(cls, entries: Iterable[str]) -> KeyRing:
        """Read ``"<sha256 hex>:<scope>,<scope>[:<models>]"`` entries; ValueError names a bad
        one (by its position: the entry itself is not shown)."""
        keys = []
        for n, entry in enumerate(entries):
            digest, sep, rest = entry.strip().partition(":")
            scopes, limited, models = rest.partition(":")
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
            patterns = None
            if limited:
                try:
                    patterns = ModelPatterns.parse(models)
                except ValueError as exc:
                    raise ValueError(
                        f"OPML_API_KEYS[{n}]: {exc} (the third part of an entry is a "
                        "'|'-separated list of model names and prefixes ending in '*')"
                    ) from None
                if patterns.everything:
                    patterns = None
            keys.append(_Key(raw, Grant(frozenset(granted), patterns)))
        return cls(keys)

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def grant_of(self, key: str) -> Grant | None:
        """What ``key`` may do, or None if it is not configured (constant-time compares)."""
        digest = hashlib.sha256(key.encode()).digest()
        found: Grant | None = None
        for candidate in self._keys:  # every hash is compared: no early exit
            if hmac.compare_digest(digest, candidate.digest):
                found = candidate.grant
        return found

    def scopes_of(self, key: str) -> frozenset[Scope] | None:
        """The scopes of ``key``, or None if it is not configured."""
        grant = self.grant_of(key)
        return None if grant is None else grant.scopes


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
        p.add_argument(
            "--models",
            default=None,
            help="limit the key to these models: '|'-separated names and prefixes ending in "
            "'*', e.g. 'tenant-a-*|shared' (default: every model)",
        )
    args = parser.parse_args(argv)
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    try:
        [Scope(s) for s in scopes]
    except ValueError:
        parser.error(f"--scopes: choose from {[s.value for s in Scope]}")
    models = None if args.models is None else args.models.split("|")
    if models is not None:
        try:
            ModelPatterns.parse(args.models)
        except ValueError as exc:
            parser.error(f"--models: {exc}")
    if args.command == "new":
        key = secrets.token_urlsafe(32)  # URL-safe: also valid inside a WebSocket subprotocol
        print(f"key:   {key}")
        print(f"entry: {entry_for(key, scopes, models)}")
        return 0
    key = sys.stdin.readline().strip()
    if not key:
        parser.error("no key on stdin")
    print(entry_for(key, scopes, models))
    return 0


if __name__ == "__main__":
    sys.exit(main())
