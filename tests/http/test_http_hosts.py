"""DNS rebinding (issue 49 item 7): a server on loopback without an API key answers only loopback Host names."""

from __future__ import annotations

import pytest
import trio

from http_kit import RawClient, assert_envelope, build_request, start_server
from kestrel_trio.http import HostAllowlist, default_host_allowlist

pytestmark = pytest.mark.usefixtures("close_raw_clients")
BUDGET = 10  # s


def _request(host: str) -> bytes:
    return build_request("GET", "/hello").replace(b"Host: test", b"Host: " + host.encode())


async def test_a_rebound_host_name_gets_403_and_loopback_names_are_served(nursery):
    with trio.fail_after(BUDGET):
        running = await start_server(nursery, hosts=default_host_allowlist("127.0.0.1", api_key=False))
        for host in ("localhost", f"127.0.0.1:{running.port}", "[::1]:8080", "LOCALHOST."):
            client = await RawClient.connect(running.port)
            await client.send(_request(host))
            assert (await client.read_response()).status == 200, host
        for host in ("evil.example", f"evil.example:{running.port}", "", "localhost.evil.example"):
            client = await RawClient.connect(running.port)
            await client.send(_request(host))
            got = await client.read_response()
            error = assert_envelope(got, 403, "host_not_allowed")
            assert "--host-allowlist" in error["message"]


async def test_the_default_allowlist_is_only_for_loopback_without_an_api_key():
    assert default_host_allowlist("0.0.0.0", api_key=False) is None
    assert default_host_allowlist("127.0.0.1", api_key=True) is None
    allow = default_host_allowlist("127.0.0.2", api_key=False)
    assert allow is not None and allow.allows("127.0.0.2:9000") and allow.allows("[::1]") and not allow.allows("x")
    assert HostAllowlist.of(["proxy.internal:8080"]).allows("proxy.internal")
