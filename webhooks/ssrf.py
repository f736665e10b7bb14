"""The SSRF guard: which addresses a webhook may be delivered to.

A delivery resolves its host once, judges every answered address here, and is refused
(permanently, recorded) if any one is not public; the connection is then pinned to the
vetted addresses (``webhooks.services.transport``), so a second resolution can never
take it somewhere else.

The judgement is an explicit table of networks for both families. ``ipaddress.is_global``
is not relied on: it calls some IPv4-carrying IPv6 forms global. IPv6 forms that carry an
IPv4 address are judged as that IPv4 address (IPv4-mapped, whose socket really is an IPv4
one) or refused outright, fail-closed, because a translator or tunnel on the path could
reach anything the embedded address names (NAT64, IPv4-translated, IPv4-compatible,
6to4, Teredo). Outside ``2000::/3`` nothing in IPv6 is global unicast, so everything else
is refused as reserved.

This module is pure: the allow-list is passed in by the caller (from
``VPAY_WEBHOOK_ALLOW_CIDRS``), never read from settings here.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _nets(rows: Iterable[tuple[str, str]]) -> tuple[tuple[Network, str], ...]:
    return tuple((ipaddress.ip_network(cidr), reason) for cidr, reason in rows)


# Every IPv4 network a webhook must never reach. Anything not listed is public.
BLOCKED_V4 = _nets(
    [
        ("0.0.0.0/8", "this-network"),
        ("10.0.0.0/8", "private (RFC 1918)"),
        ("100.64.0.0/10", "carrier-grade NAT (RFC 6598)"),
        ("127.0.0.0/8", "loopback"),
        ("169.254.0.0/16", "link-local (incl. cloud metadata 169.254.169.254)"),
        ("172.16.0.0/12", "private (RFC 1918)"),
        ("192.0.0.0/24", "IETF protocol assignments"),
        ("192.0.2.0/24", "documentation (TEST-NET-1)"),
        ("192.31.196.0/24", "AS112"),
        ("192.52.193.0/24", "AMT"),
        ("192.88.99.0/24", "6to4 relay anycast"),
        ("192.168.0.0/16", "private (RFC 1918)"),
        ("192.175.48.0/24", "AS112 direct delegation"),
        ("198.18.0.0/15", "benchmarking"),
        ("198.51.100.0/24", "documentation (TEST-NET-2)"),
        ("203.0.113.0/24", "documentation (TEST-NET-3)"),
        ("224.0.0.0/4", "multicast"),
        ("240.0.0.0/4", "reserved"),  # includes 255.255.255.255, broadcast
    ]
)

# IPv6 networks that carry an IPv4 address. IPv4-mapped is judged as its IPv4 address;
# the rest are refused whatever they carry.
V4_MAPPED = ipaddress.ip_network("::ffff:0:0/96")
REFUSED_V4_CARRIERS = _nets(
    [
        ("64:ff9b::/96", "NAT64 (well-known prefix)"),
        ("64:ff9b:1::/48", "NAT64 (local-use prefix)"),
        ("::ffff:0:0:0/96", "IPv4-translated (SIIT)"),
        ("::/96", "IPv4-compatible (deprecated)"),
        ("2002::/16", "6to4"),
        ("2001::/32", "Teredo"),
    ]
)

# Checked first: both sit inside ::/96 (IPv4-compatible) but are better named as themselves.
SPECIAL_V6 = _nets([("::/128", "unspecified"), ("::1/128", "loopback")])
# IPv6 networks never reachable, checked before the 2000::/3 rule.
BLOCKED_V6 = _nets(
    [
        ("100::/64", "discard-only"),
        ("2001::/23", "IETF protocol assignments"),
        ("2001:db8::/32", "documentation"),
        ("3fff::/20", "documentation"),
        ("5f00::/16", "segment routing (SRv6) SIDs"),
        ("fc00::/7", "unique-local"),
        ("fe80::/10", "link-local"),
        ("fec0::/10", "site-local (deprecated)"),
        ("ff00::/8", "multicast"),
    ]
)
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")


@dataclass(frozen=True)
class Verdict:
    """The judgement of one address: ``allowed``, the address to connect to, and why not."""

    address: IPAddress
    allowed: bool
    reason: str = ""
    connect_to: IPAddress | None = None  # IPv4-mapped addresses connect as plain IPv4


def classify(address: IPAddress | str, allow: Sequence[Network] = ()) -> Verdict:
    """Judge one address. ``allow`` (dev/test only) lets the listed networks through.

    The allow-list is checked against the address as it will be connected to (an
    IPv4-mapped address is judged as its IPv4 address for the allow-list too).
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return Verdict(ip, False, "scoped IPv6 address")
        if ip in V4_MAPPED:
            inner = classify(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF), allow)
            reason = f"IPv4-mapped {inner.address}: {inner.reason}" if not inner.allowed else ""
            return Verdict(ip, inner.allowed, reason, inner.connect_to)
    if any(ip in net for net in allow if net.version == ip.version):
        return Verdict(ip, True, connect_to=ip)
    if isinstance(ip, ipaddress.IPv4Address):
        for net, reason in BLOCKED_V4:
            if ip in net:
                return Verdict(ip, False, reason)
        return Verdict(ip, True, connect_to=ip)
    for net, reason in SPECIAL_V6:
        if ip in net:
            return Verdict(ip, False, reason)
    for net, reason in REFUSED_V4_CARRIERS:
        if ip in net:
            return Verdict(ip, False, f"{reason}: carries IPv4, refused")
    for net, reason in BLOCKED_V6:
        if ip in net:
            return Verdict(ip, False, reason)
    if ip not in GLOBAL_UNICAST_V6:
        return Verdict(ip, False, "reserved (outside 2000::/3)")
    return Verdict(ip, True, connect_to=ip)


class AddressRefused(Exception):
    """The host resolved to an address a webhook must not reach, or did not resolve at all.

    ``permanent``: True when an answered address is not public (the delivery is refused
    for good); False when resolution itself failed (an ordinary failed attempt: DNS
    blips heal).
    """

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


Resolver = Callable[[str, int], list[str]]


def system_resolver(host: str, port: int) -> list[str]:
    """Every address the system resolver answers for ``host`` (both families, TCP)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]  # an IPv4 or IPv6 sockaddr's host is already text


def resolve_within(resolver: Resolver, host: str, port: int, timeout: float) -> list[str]:
    """``resolver(host, port)``, given at most ``timeout`` seconds; ``TimeoutError`` after.

    ``getaddrinfo`` takes no timeout, and a nameserver the merchant controls can answer as
    slowly as it likes (glibc waits about 5 s per try, per server). The lookup runs in a
    daemon thread of its own (never a shared pool a slow nameserver could fill); past the
    timeout the caller moves on and the thread ends when the resolver gives up.
    """
    if timeout <= 0:
        raise TimeoutError("no time left to resolve")
    outcome: dict[str, object] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["answers"] = resolver(host, port)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="vpay-resolve", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"no answer within {timeout:.1f} s")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["answers"]  # type: ignore[return-value]


def parse_cidrs(text: str) -> tuple[Network, ...]:
    """``VPAY_WEBHOOK_ALLOW_CIDRS``: comma-separated CIDRs (blank: none). ValueError on a bad one."""
    return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip())


def vet(
    host: str,
    port: int,
    *,
    allow: Sequence[Network] = (),
    resolver: Resolver = system_resolver,
    timeout: float | None = None,
) -> list[IPAddress]:
    """Resolve ``host`` once and return the addresses to connect to, or raise :class:`AddressRefused`.

    Every answered address must pass: one private answer among public ones refuses the
    delivery (an attacker controls which answer a client picks). An IP literal is judged
    without resolving. ``timeout``: the resolution's share of the attempt's deadline; a
    lookup that takes longer is an ordinary (non-permanent) failure.
    """
    literal = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        answers = [ipaddress.ip_address(literal)]
    except ValueError:
        try:
            raw = resolver(host, port) if timeout is None else resolve_within(resolver, host, port, timeout)
            answers = [ipaddress.ip_address(a.split("%", 1)[0]) for a in raw]
        except (OSError, UnicodeError, ValueError) as exc:
            raise AddressRefused(f"could not resolve {host!r}: {exc}", permanent=False) from exc
    if not answers:
        raise AddressRefused(f"{host!r} resolved to no address", permanent=False)
    vetted: list[IPAddress] = []
    for ip in answers:
        verdict = classify(ip, allow)
        if not verdict.allowed:
            raise AddressRefused(f"{host!r} resolves to {ip}, which is {verdict.reason}", permanent=True)
        assert verdict.connect_to is not None
        if verdict.connect_to not in vetted:
            vetted.append(verdict.connect_to)
    return vetted
