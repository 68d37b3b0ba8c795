"""The ``network_whitelist`` of policy.yaml, parsed once and matched per CONNECT.

Entries (case-insensitive, surrounding blanks and one trailing dot ignored):

``api.openai.com``          that host, port 443 only
``api.openai.com:8443``     that host, that port
``*.example.com``           any *strict* subdomain of example.com (not example.com), port 443
``*.example.com:8080``      the same, on that port
``127.0.0.1:11434``         an IPv4 literal (port 443 when none is given)
``[::1]:8080``              an IPv6 literal, always in brackets

Matching looks at the CONNECT authority only and never resolves a name: a hostname rule
never matches an IP-literal target, and an IP literal is reached only when it is listed
literally.  Authorities that the resolver would read as an address although they are
not canonical IP literals (``2130706433``, ``0x7f.1``, ``127.1``) are refused as hosts, so
nothing reaches an address through a name-shaped back door.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

import msgspec

from fluffy.errors import PolicyError

DEFAULT_PORT = 443

_LABEL = re.compile(r"(?!-)[a-z0-9-]{1,63}(?<!-)\Z")
_PORT = re.compile(r"[0-9]{1,5}\Z")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
#: What an entry may be (said when one is not).
ENTRY_SYNTAX = (
    "entries are 'host', 'host:port', '*.domain[:port]', 'IPv4[:port]' or '[IPv6][:port]' "
    "(port 443 when none is given)"
)


class AuthorityError(ValueError):
    """A host or ``host:port`` that is not a plain hostname or canonical IP literal."""


class Target(msgspec.Struct, frozen=True):
    """A normalised destination: lower-case hostname (no trailing dot) or an IP literal."""

    host: str
    port: int
    ip: IPAddress | None = None

    @property
    def authority(self) -> str:
        """``host:port`` again, IPv6 in brackets (what is dialled and audited)."""
        if self.ip is not None and self.ip.version == 6:
            return f"[{self.host}]:{self.port}"
        return f"{self.host}:{self.port}"


def normalise_host(raw: str) -> tuple[str, IPAddress | None]:
    """Lower-case ``raw``, drop one trailing dot; return it with its IP if it is one.

    ``raw`` may carry IPv6 brackets.  Raises :class:`AuthorityError` for anything else
    than a DNS hostname (LDH labels) or a canonical IPv4/IPv6 literal.
    """
    host = raw.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        try:
            ip6 = ipaddress.IPv6Address(host[1:-1])
        except ValueError as exc:
            raise AuthorityError(f"{raw!r} is not an IPv6 address") from exc
        return ip6.compressed, ip6
    if ":" in host:
        raise AuthorityError(f"{raw!r}: an IPv6 address must be written in brackets, [::1]")
    if host.endswith("."):
        host = host[:-1]
    if not host or len(host) > 253:
        raise AuthorityError(f"{raw!r} is not a hostname")
    if not host.isascii():
        raise AuthorityError(f"{raw!r} is not ASCII; write the name in punycode (xn--...)")
    try:
        ip4 = ipaddress.IPv4Address(host)
    except ValueError:
        pass
    else:
        return str(ip4), ip4
    labels = host.split(".")
    if not all(_LABEL.match(label) for label in labels):
        raise AuthorityError(f"{raw!r} is not a hostname (letters, digits, '-' and dots)")
    if labels[-1].isdigit() or _inet_aton_reads(host):
        raise AuthorityError(f"{raw!r} reads as a non-canonical IP address; write it plainly")
    return host, None


def _inet_aton_reads(host: str) -> bool:
    """True when the C resolver would take ``host`` as an address (``0x7f000001``)."""
    try:
        socket.inet_aton(host)
    except OSError:
        return False
    return True


def parse_port(raw: str) -> int:
    if not _PORT.match(raw) or not 0 < int(raw) < 65536:
        raise AuthorityError(f"port {raw!r} is not a number from 1 to 65535")
    return int(raw)


def split_authority(raw: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` -> (host part, port); the port may default."""
    text = raw.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise AuthorityError(f"{raw!r}: unclosed '['")
        host, rest = text[: end + 1], text[end + 1 :]
        if not rest:
            port_text = None
        elif rest.startswith(":"):
            port_text = rest[1:]
        else:
            raise AuthorityError(f"{raw!r}: expected ':port' after ']'")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    elif ":" in text:
        raise AuthorityError(f"{raw!r}: an IPv6 address must be written in brackets, [::1]")
    else:
        host, port_text = text, None
    if port_text is None:
        if default_port is None:
            raise AuthorityError(f"{raw!r} has no port; a CONNECT target is host:port")
        return host, default_port
    return host, parse_port(port_text)


def parse_target(authority: str) -> Target:
    """A CONNECT request-target (``host:port``, port required) -> :class:`Target`."""
    host_text, port = split_authority(authority)
    host, ip = normalise_host(host_text)
    return Target(host, port, ip)


class Rule(msgspec.Struct, frozen=True):
    """One entry: ``entry`` as written in policy.yaml (stripped), what it admits."""

    entry: str
    host: str  # the hostname, the suffix of a wildcard ("example.com"), or the IP's text
    port: int
    wildcard: bool = False
    ip: IPAddress | None = None

    @classmethod
    def read(cls, entry: str) -> Rule:
        """``entry`` as a rule; :class:`AuthorityError` (saying why) if it is not one."""
        text = entry.strip()
        host_text, port = split_authority(text, DEFAULT_PORT)
        wildcard = host_text.startswith("*.")
        if wildcard:
            host_text = host_text[2:]
        if "*" in host_text:
            raise AuthorityError("'*' is allowed only as the whole first label, '*.domain'")
        host, ip = normalise_host(host_text)
        if wildcard and ip is not None:
            raise AuthorityError("a wildcard cannot cover IP addresses")
        if wildcard and "." not in host:
            raise AuthorityError("a wildcard needs a domain of two labels or more")
        return cls(text, host, port, wildcard, ip)

    @classmethod
    def parse(cls, entry: str) -> Rule:
        """:meth:`read` for policy.yaml: a bad entry is a :class:`PolicyError` naming it."""
        try:
            return cls.read(entry)
        except AuthorityError as exc:
            raise PolicyError(
                f"network_whitelist entry {entry!r} is invalid: {exc}",
                why=ENTRY_SYNTAX,
            ) from None

    def matches(self, target: Target) -> bool:
        if target.port != self.port:
            return False
        if self.ip is not None or target.ip is not None:
            return self.ip is not None and self.ip == target.ip
        if self.wildcard:
            return target.host.endswith("." + self.host)
        return target.host == self.host


class AllowList:
    """An immutable set of :class:`Rule`; :meth:`allows` names the rule that admits."""

    def __init__(self, rules: Iterable[Rule] = ()) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)

    @classmethod
    def from_entries(cls, entries: Iterable[str]) -> AllowList:
        """Parse every entry; the first bad one raises :class:`PolicyError` naming it."""
        if isinstance(entries, str):
            raise PolicyError(
                "network_whitelist must be a list of entries, not one string",
                why="a YAML list is written one '- entry' per line",
            )
        return cls(Rule.parse(entry) for entry in entries)

    def allows(self, host: str, port: int) -> str | None:
        """The entry that admits ``host``:``port`` (as written), or None.

        ``host`` is a host in any case (IPv6 with or without brackets); a host that is
        not a hostname or a canonical IP literal is never admitted.
        """
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # a bare IPv6 address: unambiguous here, there is no port
        try:
            name, ip = normalise_host(host)
        except AuthorityError:
            return None
        return self.match(Target(name, port, ip))

    def match(self, target: Target) -> str | None:
        for rule in self.rules:
            if rule.matches(target):
                return rule.entry
        return None

    def covers(self, rule: Rule) -> bool:
        """Whether every target ``rule`` admits is admitted here too (a wildcard is
        covered by the same or a wider wildcard on its port, never by hostnames)."""
        if not rule.wildcard:
            return self.match(Target(rule.host, rule.port, rule.ip)) is not None
        return any(
            mine.wildcard
            and mine.port == rule.port
            and (rule.host == mine.host or rule.host.endswith("." + mine.host))
            for mine in self.rules
        )

    def __len__(self) -> int:
        return len(self.rules)

    def __repr__(self) -> str:
        return f"AllowList({[rule.entry for rule in self.rules]!r})"
