"""Loopback addresses: what a local run listens on (Ray, the bus, DCS stores and groups, the API, engine servers).

No Ray import: the engine server process and the DCS transport use it too."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1, an IPv4-mapped loopback (::ffff:127.0.0.1) or 'localhost'; False for any other name
    or address."""
    try:
        ip = ipaddress.ip_address(host.strip("[]").split("%")[0])
    except ValueError:
        return host == "localhost"
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)
