"""Timeouts and size limits of the HTTP server."""

from __future__ import annotations

import attrs

__all__ = ["HttpLimits", "per_client_cap"]


@attrs.frozen
class HttpLimits:
    """Every deadline and size bound the HTTP server enforces.

    Attributes:
        header_timeout: seconds allowed to receive a whole request head, counted
            from accept (first request) or from the first byte of the next
            request (keep-alive). Exceeded -> 408, then close.
        body_timeout: seconds allowed to receive the whole body once the head
            is in. Exceeded -> 408, then close.
        keepalive_timeout: seconds a keep-alive connection may stay idle
            between requests before it is closed quietly.
        write_timeout: seconds a send may make no progress before the client
            is cut off (the connection is aborted).
        max_header_bytes: largest request head, in bytes. Exceeded -> 431.
        max_body_bytes: largest request body, in bytes. Exceeded -> 413.
        max_connections: most connections served at once; one more gets 503
            with ``Retry-After`` and ``Connection: close``. Each costs a file
            descriptor: the process's open-files limit must be above it.
        max_connections_per_client: most connections one peer address holds at
            once; one more gets the same 503. None: a quarter of
            ``max_connections`` (at least 1) for other hosts and no cap for
            loopback peers (a local reverse proxy carries every client on one
            address); a number applies to every peer, loopback included.
        shutdown_grace: seconds in-flight requests get after
            :meth:`HttpServer.begin_shutdown` before they are cancelled.
        linger_timeout: seconds spent draining a connection after the server
            half-closed it, so the client reads the last response instead of a
            reset.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    keepalive_timeout: float = 5.0
    write_timeout: float = 30.0
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 4 * 1024 * 1024
    max_connections: int = 1000
    max_connections_per_client: int | None = None
    shutdown_grace: float = 10.0
    linger_timeout: float = 1.0


def per_client_cap(limits: HttpLimits, peer_host: str) -> int:
    """The most connections ``peer_host`` (an IP address) may hold at once under ``limits``."""
    if limits.max_connections_per_client is not None:
        return limits.max_connections_per_client
    if ipaddress_is_loopback(peer_host):
        return limits.max_connections
    return max(1, limits.max_connections // 4)


def ipaddress_is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback IP address (127.0.0.0/8, ::1, or ::ffff:127.x.y.z); False for a non-address."""
    import ipaddress

    try:
        address = ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return address.is_loopback or (mapped is not None and mapped.is_loopback)
