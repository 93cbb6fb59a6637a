"""Which addresses a webhook may reach: public ones, and the operator's allow-list.

A subscriber chooses the URL, and the portal POSTs to it and shows the status
back: without a rule, any user could make the portal probe its own network
(Redis, PostgreSQL, an agent) or a cloud's metadata service. So an address is
refused unless it is global unicast, or lies in ``WEBHOOK_ALLOWED_NETWORKS``
(CIDRs the operator names for internal receivers; empty by default)::

    loopback 127/8 ::1 · private 10/8 172.16/12 192.168/16 fc00::/7 · shared 100.64/10
    link-local 169.254/16 fe80::/10 (metadata 169.254.169.254) · multicast · reserved
    unspecified 0.0.0.0 :: · documentation, benchmarking · fd00:ec2::254 (EC2 metadata)
    IPv4-mapped ::ffff:a.b.c.d, IPv4-compatible, NAT64 and 6to4: judged as the IPv4 inside

The check runs at subscription (a literal address, or what the name resolves
to then) and again at each send, where the address checked is the address the
socket connects to (``notifications.sending``): a name that resolves to a
public address at subscription and to 127.0.0.1 later (DNS rebinding) is
refused at the send. No Django models here; settings are passed in.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable, Sequence

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(a)
    for a in ("169.254.169.254", "169.254.170.2", "100.100.100.200", "fd00:ec2::254")
)
"""Cloud metadata services (AWS, ECS tasks, Alibaba, AWS over IPv6): refused even if allowed."""
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class AddressRefused(ValueError):
    """A webhook address that may not be called; the text says why (shown to the user)."""


def parse_networks(values: Iterable[str]) -> tuple[IPNetwork, ...]:
    """``WEBHOOK_ALLOWED_NETWORKS`` as networks; a value that is not a CIDR raises ValueError."""
    networks: list[IPNetwork] = []
    for value in values:
        text = value.strip()
        if text:
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise ValueError(f"WEBHOOK_ALLOWED_NETWORKS: {text!r} is not a network") from None
    return tuple(networks)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, compatible, NAT64, 6to4), if any."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    packed = int(address)
    if packed >> 32 == 0 and packed > 1:  # ::a.b.c.d, IPv4-compatible (deprecated)
        return ipaddress.IPv4Address(packed)
    return None


def refusal(address: IPAddress, allowed: Sequence[IPNetwork] = ()) -> str:
    """Why a webhook may not connect to ``address`` ("" when it may)."""
    if address in METADATA_ADDRESSES:
        return f"{address} is a cloud metadata address"
    inner = embedded_ipv4(address)
    if inner is not None:
        why = refusal(inner, allowed)
        return f"{address} stands for {inner}: {why}" if why else ""
    if any(address.version == net.version and address in net for net in allowed):
        return ""
    for flag, words in (
        ("is_unspecified", "unspecified"),
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(address, flag):
            return f"{address} is a {words} address"
    if not address.is_global:
        return f"{address} is not a public address"
    return ""


def resolve(host: str, port: int) -> list[IPAddress]:
    """Every address ``host`` resolves to now (a literal address: itself); OSError if none."""
    try:
        return [ipaddress.ip_address(host.strip("[]").split("%", 1)[0])]
    except ValueError:
        pass
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    found: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])
        if address not in found:
            found.append(address)
    if not found:
        raise OSError(f"{host!r} resolves to no address")
    return found


def checked_addresses(host: str, port: int, allowed: Sequence[IPNetwork]) -> list[IPAddress]:
    """``host``'s addresses, all of them allowed; AddressRefused naming the first that is not.

    One refused address refuses the host: a name that answers with a public
    and a private address must not reach the private one on a retry.
    """
    try:
        addresses = resolve(host, port)
    except (OSError, UnicodeError) as exc:
        raise AddressRefused(f"cannot resolve {host!r}: {exc}") from None
    for address in addresses:
        why = refusal(address, allowed)
        if why:
            raise AddressRefused(
                f"{host!r} resolves to a non-public address ({why}): webhooks may only "
                "call public addresses"
            )
    return addresses
