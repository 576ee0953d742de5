"""Where an artifact download may be led: a redirect to a loopback,
link-local, private or otherwise non-public address is refused, unless the
signed URL itself is on such an address (a mirror inside the network is
then what was signed for, and its redirects stay inside too).

A host is judged by every address it resolves to now; the connection that
follows resolves it again, so a name that changes its answer in between
is not caught here (the signed host is trusted to be a mirror, not an
attacker's DNS).

Must not: fetch anything, or say what a refused target would have answered.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from reconciler.node.artifact_store import StageFailed

REDIRECT_SCHEMES = ("http", "https")


def _port(url: str) -> int:
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


def addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """The addresses ``host`` names now (itself when it is a literal); empty
    when it does not resolve (the request then fails on its own)."""
    try:
        return [ipaddress.ip_address(host.strip("[]").split("%", 1)[0])]
    except ValueError:
        pass
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]


def inside(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is not a public one: loopback, link-local,
    private, unspecified, reserved or multicast (an IPv4 mapped in IPv6
    judged as the IPv4)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return (
        address.is_loopback
        or address.is_link_local
        or address.is_private
        or address.is_unspecified
        or address.is_reserved
        or address.is_multicast
    )


class Fence:
    """The rule for one signed URL's redirects."""

    def __init__(self, signed_url: str) -> None:
        self.signed_url = signed_url
        host = urlsplit(signed_url).hostname or ""
        self.signed_inside = any(inside(a) for a in addresses(host, _port(signed_url)))

    def check_redirect(self, target: str) -> None:
        """``StageFailed`` when a redirect to ``target`` may not be followed."""
        parts = urlsplit(target)
        if parts.scheme not in REDIRECT_SCHEMES:
            raise StageFailed(
                "download_failed",
                f"GET {self.signed_url} was redirected to a {parts.scheme or 'relative'} URL, "
                "not http(s); refused",
            )
        host = parts.hostname or ""
        if not host:
            raise StageFailed(
                "download_failed", f"GET {self.signed_url} was redirected to a URL without a host"
            )
        if self.signed_inside:
            return
        if any(inside(a) for a in addresses(host, _port(target))):
            raise StageFailed(
                "download_failed",
                f"GET {self.signed_url} was redirected to {host}, a loopback, link-local or "
                "private address; refused (only a signed URL on such an address may lead "
                "there): sign the URL the file is served from",
            )
