"""A turn's network policy, and the one decision the proxy asks of it. Pure: no I/O.

Theory of operation
-------------------

An agent is not trusted, so what it may reach on the network is the operator's to say, per
agent (``network``, ``network_allow``) with a ``[server]`` default. The words:

* ``"internet"`` (the default): **public addresses only**. An address is public when
  :func:`public` says so: Python's :attr:`ipaddress.IPv4Address.is_global` (which already
  refuses loopback, link-local ``169.254.0.0/16`` and ``fe80::/10`` — the cloud metadata
  services —, RFC 1918, ULA ``fc00::/7``, CGNAT ``100.64.0.0/10``, ``0.0.0.0/8``, the
  documentation and benchmarking ranges, ``240.0.0.0/4`` and the broadcast address), and
  moreover not multicast (``is_global`` says ``True`` for ``224.0.0.1`` and ``ff0e::1``), and,
  for IPv6, not an IPv4 address in disguise whose IPv4 is not public: IPv4-mapped
  (``::ffff:127.0.0.1``), 6to4 (``2002:7f00:1::``, which ``is_global`` calls global) and the
  NAT64 well-known prefix (``64:ff9b::7f00:1``, likewise). The special-purpose ranges are also
  listed here (``_ALSO_NOT_PUBLIC``), so a Python whose ``is_global`` table is older (3.11's
  point releases differ on ``192.0.0.0/24``) refuses the same.
* a list of names (``"api.anthropic.com"``, ``"*.githubusercontent.com"``, ``"pypi.org:443"``)
  and networks: only these, and a name only while it resolves to a public address (a listed
  name that resolves to ``127.0.0.1`` is DNS rebinding, refused like any other);
* ``"model"``: the list the agent's adapter declares for its model API (data, on the
  adapter), plus the host of a base URL its config names (a grant: whatever its address);
* ``"host"``: everything the daemon's user reaches (no proxy, no namespace: opt-in);
* ``"none"``: nothing at all.

``network_allow`` grants, whatever the address: a name (``"git.internal:443"``), an address
(``"127.0.0.1:8080"``, ``"[::1]:8080"``) or a network (``"10.0.0.0/8"``), each with an optional
port. A grant is the only way to a loopback or private address. A loopback port granted one
by one (:attr:`Policy.forwarded`) is also forwarded to the turn's own loopback, where a tool
that keeps loopback off the proxy (``NO_PROXY``) looks for it.

:func:`parse_policy` turns the config's words into a frozen :class:`Policy` (raising
:class:`PolicyError` with the fix); :func:`decide` is what the proxy asks for each connection
*after* it resolved the name itself: the name the client asked for, the port, and the
address it is about to connect to — never the client's idea of the address. It answers
:class:`Allowed` or :class:`Refused` with a reason a person can act on.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

Kind = Literal["internet", "list", "host", "none"]
"""What a policy does: public addresses, a list, everything, nothing (``"model"`` is a list)."""

#: The words ``network`` takes besides a list.
WORDS = ("internet", "model", "host", "none")
#: The default where the config says nothing.
DEFAULT = "internet"

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
#: Ranges refused whatever this Python's ``is_global`` table says (it changed between 3.11
#: point releases): IANA's special-purpose registry, where it is not globally reachable.
_ALSO_NOT_PUBLIC = tuple(ipaddress.ip_network(n) for n in (
    "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
    "192.0.0.0/29", "192.0.0.8/32", "192.0.0.170/31", "192.0.2.0/24", "192.168.0.0/16", "198.18.0.0/15",
    "198.51.100.0/24", "203.0.113.0/24", "240.0.0.0/4",
    "::/128", "::1/128", "::ffff:0:0/96", "64:ff9b:1::/48", "100::/64", "2001:db8::/32",
    "fc00::/7", "fe80::/10",
))


class PolicyError(ValueError):
    """A ``network`` or ``network_allow`` value that means nothing; the message says why and the fix."""


@dataclass(frozen=True, slots=True)
class NameRule:
    """A host name, or ``*.`` and a domain (its subdomains, at any depth), with an optional port."""

    pattern: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        """Does ``host:port`` fall under this rule? (``host`` already normalised.)"""
        if self.port is not None and self.port != port:
            return False
        if self.pattern.startswith("*."):
            return host.endswith(self.pattern[1:]) and len(host) > len(self.pattern) - 1
        return host == self.pattern

    def __str__(self) -> str:
        return self.pattern if self.port is None else f"{self.pattern}:{self.port}"


@dataclass(frozen=True, slots=True)
class NetRule:
    """An address or a network, with an optional port."""

    network: IPNetwork
    port: int | None = None

    def matches(self, address: IPAddress, port: int) -> bool:
        """Is ``address:port`` inside this rule?"""
        if self.port is not None and self.port != port:
            return False
        return _unwrap(address) in self.network or address in self.network

    def __str__(self) -> str:
        net = self.network
        text = str(net.network_address) if net.prefixlen == net.max_prefixlen else str(net)
        if self.port is None:
            return text
        return f"[{text}]:{self.port}" if net.version == 6 else f"{text}:{self.port}"


Rule = NameRule | NetRule


@dataclass(frozen=True, slots=True)
class Policy:
    """One agent's network, parsed: what :func:`decide` applies."""

    kind: Kind
    label: str
    """How the config said it, for ``status``, ``check`` and the dashboard (``"internet"``,
    ``"model"``, ``"3 names"``)."""
    names: tuple[Rule, ...] = ()
    """A list's entries: a name only while it resolves to a public address; a network whatever."""
    grants: tuple[Rule, ...] = ()
    """``network_allow``, and a ``"model"`` policy's configured base URL: whatever the address."""

    @property
    def proxied(self) -> bool:
        """Does a turn under this policy reach the network only through the proxy?"""
        return self.kind in ("internet", "list")

    @property
    def forwarded(self) -> tuple[tuple[str, int], ...]:
        """The host's loopback ports this policy grants one by one (``"127.0.0.1:11434"``,
        ``"[::1]:9000"``, ``"localhost:8080"``: an address or ``localhost``, and a port), as
        (address, port): each is forwarded to the same address on the turn's own loopback,
        so a tool reaches it directly as well as through the proxy. A network or a portless
        grant is reached through the proxy only."""
        found: list[tuple[str, int]] = []
        for rule in self.grants:
            if rule.port is None:
                continue
            if isinstance(rule, NameRule):
                if rule.pattern == "localhost":
                    found += [("127.0.0.1", rule.port), ("::1", rule.port)]
            elif rule.network.num_addresses == 1 and rule.network.network_address.is_loopback:
                found.append((str(rule.network.network_address), rule.port))
        return tuple(dict.fromkeys(found))

    def describe(self) -> dict[str, object]:
        """For ``status`` and the dashboard."""
        return {"policy": self.label, "kind": self.kind, "names": [str(r) for r in self.names],
                "allow": [str(r) for r in self.grants]}


@dataclass(frozen=True, slots=True)
class Allowed:
    """The connection may be made."""

    why: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The connection may not be made; ``reason`` says why, and what would allow it."""

    reason: str


Decision = Allowed | Refused

HOST = Policy("host", "host")
NONE = Policy("none", "none")


# ------------------------------------------------------------------ addresses


def _unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 one stands for (mapped, 6to4, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in _NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def public(address: IPAddress) -> bool:
    """Is ``address`` on the public internet (see the module's docstring for exactly which)?"""
    inner = _unwrap(address)
    if inner is not address:  # an IPv4 address in IPv6 clothing is as public as the IPv4 one
        return public(inner)
    if any(address in net for net in _ALSO_NOT_PUBLIC if net.version == address.version):
        return False
    return address.is_global and not address.is_multicast


def kind_of(address: IPAddress) -> str:
    """What a non-public address is, in words a refusal can use."""
    inner = _unwrap(address)
    if inner.is_loopback:
        return "loopback"
    if inner.is_link_local:
        return "link-local (cloud metadata)"
    if inner.is_multicast:
        return "multicast"
    if inner.is_unspecified:
        return "unspecified"
    if isinstance(inner, ipaddress.IPv4Address) and inner in ipaddress.IPv4Network("100.64.0.0/10"):
        return "shared (CGNAT)"
    if inner.is_private:
        return "private"
    return "reserved" if not public(inner) else "public"


# ------------------------------------------------------------------ parsing


def normalise_host(host: str) -> str:
    """A host name as rules compare it: lower case, no trailing dot, no IPv6 brackets."""
    return host.strip().strip("[]").rstrip(".").lower()


def parse_address(host: str) -> IPAddress | None:
    """``host`` as an address literal, or None for a name."""
    try:
        return ipaddress.ip_address(normalise_host(host).split("%", 1)[0])
    except ValueError:
        return None


def parse_rule(text: str) -> Rule:
    """One entry: ``name``, ``*.domain``, ``name:port``, ``addr``, ``addr:port``, ``[v6]:port``, ``net/len``."""
    if not isinstance(text, str) or not text.strip():
        raise PolicyError(f"expected a name, an address or a network, got {text!r}")
    word = text.strip()
    port: int | None = None
    if word.startswith("["):
        inner, sep, rest = word[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise PolicyError(f"{text!r}: an IPv6 address with a port is written [addr]:port")
        word, port = inner, _port(text, rest[1:]) if rest else None
    elif word.count(":") == 1:
        word, _, digits = word.partition(":")
        port = _port(text, digits)
    try:
        return NetRule(ipaddress.ip_network(word, strict=False), port)
    except ValueError:
        pass
    name = normalise_host(word)
    if "/" in name or name == "*":
        raise PolicyError(f"{text!r} is neither a host name nor a network "
                          '(everything public is network = "internet")')
    body = name[2:] if name.startswith("*.") else name
    labels = body.split(".")
    if not body or "*" in body or any(not label or len(label) > 63 or not all(c.isalnum() or c in "-_" for c in label)
                                     for label in labels):
        raise PolicyError(f"{text!r} is not a host name (a wildcard is written *.example.com)")
    return NameRule(name, port)


def _port(text: str, digits: str) -> int:
    if not digits.isdigit() or not 0 < int(digits) < 65536:
        raise PolicyError(f"{text!r}: the port must be a number from 1 to 65535")
    return int(digits)


def parse_policy(
    network: str | Sequence[str],
    allow: Sequence[str] = (),
    *,
    model_hosts: Sequence[str] = (),
    base_urls: Sequence[str] = (),
) -> Policy:
    """The policy the config's ``network`` and ``network_allow`` say.

    ``model_hosts``: the adapter's model API hosts, and ``base_urls``: the URLs the agent's
    config points its CLI at (both only for ``"model"``)."""
    grants = tuple(parse_rule(entry) for entry in allow)
    if isinstance(network, str):
        if network == "host":
            return HOST
        if network == "none":
            return NONE
        if network == "internet":
            return Policy("internet", "internet", grants=grants)
        if network == "model":
            names = tuple(parse_rule(h) for h in model_hosts)
            from_urls = tuple(rule for url in base_urls for rule in _url_rules(url))
            if not names and not from_urls:
                raise PolicyError('network = "model": this adapter names no model API host and no base URL '
                                  "is configured; list the hosts: network = [\"api.example.com\"]")
            return Policy("list", "model", names=names, grants=grants + from_urls)
        raise PolicyError(f"expected one of {', '.join(repr(w) for w in WORDS)} or a list of names, got {network!r}")
    entries = list(network)
    if not entries:
        raise PolicyError('an empty list allows nothing: write network = "none"')
    names = tuple(parse_rule(entry) for entry in entries)
    return Policy("list", f"{len(names)} name{'s' if len(names) != 1 else ''}", names=names, grants=grants)


def _url_rules(url: str) -> list[Rule]:
    """A base URL's host and port, as a grant."""
    parts = urlsplit(url)
    if not parts.hostname:
        return []
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return []
    address = parse_address(parts.hostname)
    if address is not None:
        return [NetRule(ipaddress.ip_network(address), port)]
    return [NameRule(normalise_host(parts.hostname), port)]


def configured_urls(env: Mapping[str, str], options: Mapping[str, object] = {}) -> list[str]:
    """The URLs an agent's ``env`` and ``options`` point its CLI at (a base URL, an API host)."""
    found: list[str] = []
    for key, value in [*env.items(), *options.items()]:
        if isinstance(value, str) and value.startswith(("http://", "https://")) and _is_url_key(key):
            found.append(value)
    return found


def _is_url_key(key: str) -> bool:
    upper = key.upper()
    return any(word in upper for word in ("URL", "BASE", "HOST", "ENDPOINT"))


def local_urls(urls: Iterable[str]) -> list[str]:
    """Of ``urls``, those whose host is a loopback or private address literal (or ``localhost``):
    what ``"internet"`` refuses unless granted (``corral check`` says so)."""
    found = []
    for url in urls:
        host = urlsplit(url).hostname or ""
        address = parse_address(host)
        named_local = normalise_host(host) in ("localhost", "localhost.localdomain")
        if named_local or (address is not None and not public(address)):
            found.append(url)
    return found


def grant_for(url: str) -> str:
    """The ``network_allow`` entry that grants ``url``'s host and port."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if normalise_host(host) in ("localhost", "localhost.localdomain"):
        host = "127.0.0.1"
    address = parse_address(host)
    if address is not None and address.version == 6:
        return f"[{address}]:{port}"
    return f"{host}:{port}"


# ------------------------------------------------------------------ the decision


def decide(policy: Policy, host: str, port: int, address: IPAddress) -> Decision:
    """May a turn under ``policy`` connect to ``address`` (what ``host`` resolved to) on ``port``?

    ``host`` is the name the client asked for (or the address literal it gave), ``address``
    the one the proxy resolved and is about to connect to."""
    if policy.kind == "host":
        return Allowed("network = \"host\"")
    if policy.kind == "none":
        return Refused('network = "none": this agent has no network')
    name = normalise_host(host)
    for rule in policy.grants:
        if _rule_matches(rule, name, port, address):
            return Allowed(f"network_allow grants {rule}")
    if policy.kind == "list":
        listed = next((r for r in policy.names if _rule_matches(r, name, port, address)), None)
        if listed is None:
            return Refused(f"{name}:{port} is not in this agent's network ({policy.label}); "
                           f"add it: network_allow = [\"{_grant_word(name, port)}\"]")
        if isinstance(listed, NetRule) or public(address):
            return Allowed(f"the network list has {listed}")
        return Refused(f"{name} resolves to {address}, a {kind_of(address)} address, which a listed name may not "
                       f"reach; grant it if meant: network_allow = [\"{_grant_word(name, port)}\"]")
    if public(address):
        return Allowed("a public address")
    what = name if name == str(address) else f"{name} ({address})"
    return Refused(f"{what} is a {kind_of(address)} address, and network = \"internet\" reaches public "
                   f"addresses only; grant it if meant: network_allow = [\"{_grant_word(str(address), port)}\"]")


def screen(policy: Policy, host: str, port: int) -> Refused | None:
    """Before resolving: a refusal no address could change (``"none"``, a name no rule of a
    list could match), so the proxy asks no resolver about a name it would refuse anyway."""
    if policy.kind == "none":
        return Refused('network = "none": this agent has no network')
    if policy.kind != "list" or parse_address(host) is not None:
        return None
    name = normalise_host(host)
    rules = (*policy.names, *policy.grants)
    if any(isinstance(r, NetRule) or r.matches(name, port) for r in rules):
        return None
    return Refused(f"{name}:{port} is not in this agent's network ({policy.label}); "
                   f"add it: network_allow = [\"{_grant_word(name, port)}\"]")


def _rule_matches(rule: Rule, name: str, port: int, address: IPAddress) -> bool:
    if isinstance(rule, NetRule):
        return rule.matches(address, port)
    return parse_address(name) is None and rule.matches(name, port)


def _grant_word(host: str, port: int) -> str:
    address = parse_address(host)
    return f"[{address}]:{port}" if address is not None and address.version == 6 else f"{host}:{port}"
