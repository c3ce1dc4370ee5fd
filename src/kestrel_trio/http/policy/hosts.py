"""Which ``Host`` header values the server answers: a defence against DNS rebinding.

A web page on ``evil.example`` whose name the attacker re-points at 127.0.0.1 is, to the browser, same-origin with
the local server, so CORS does not stop it; only the ``Host`` header (still ``evil.example``) tells. As Ollama,
Jupyter and Vite do, a server listening on loopback with no API key answers only loopback names and its own bound
address; other hosts get 403 naming the host. Ports are not compared: a name is allowed with any port (a local
proxy on another port sends its own).
"""

from __future__ import annotations

from typing import Iterable

import attrs

from kestrel_trio.http.policy.limits import ipaddress_is_loopback

__all__ = ["HostAllowlist", "LOOPBACK_NAMES", "default_host_allowlist"]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


@attrs.frozen
class HostAllowlist:
    """Host names (lower case, IPv6 without brackets, no port) the server answers."""

    names: frozenset[str]

    @classmethod
    def of(cls, names: Iterable[str]) -> "HostAllowlist":
        """From user-given names: ``example.com``, ``example.com:8000``, ``[::1]`` or ``[::1]:8000``."""
        return cls(frozenset(_hostname(name) for name in names if name.strip()))

    def allows(self, host: str) -> bool:
        """Whether a request whose ``Host`` header is ``host`` is answered."""
        return _hostname(host) in self.names


def default_host_allowlist(bind_host: str, api_key: bool) -> HostAllowlist | None:
    """The loopback names and ``bind_host`` when it is a loopback address (or ``localhost``) and no API key is set;
    None (any host) otherwise: a server reachable from other machines is reached under names it cannot know."""
    if api_key or not (bind_host == "localhost" or ipaddress_is_loopback(bind_host)):
        return None
    return HostAllowlist(LOOPBACK_NAMES | {_hostname(bind_host)})


def _hostname(host: str) -> str:
    host = host.strip().lower().rstrip(".")
    if host.startswith("["):  # [v6] or [v6]:port
        return host[1:].partition("]")[0]
    if host.count(":") == 1:  # name:port or v4:port
        return host.partition(":")[0]
    return host  # a name, a v4 address, or a bare v6 address
