"""Two replicas behind nginx (deploy/nginx.conf rendered as docs/deployment.md does): passive failover.

Theory of operation: open-source nginx has no active health checks, so it
notices a stopped replica only when a request's connection is refused; that
request is passed to the other replica (it was never sent, so even a POST is
safe to pass on), and the replica stays out of the pool for fail_timeout. This
test stops a replica with no request in flight at the instant its listener
closes (nginx has a small window there: see deploy/nginx.conf), then checks
that no request fails, that all go to the survivor, and that the restarted
replica gets work again once fail_timeout has passed.
"""

from __future__ import annotations

import concurrent.futures
import signal
import subprocess
import time

import pytest
from openai import AuthenticationError, OpenAI

from deploy_kit import (
    API_KEY, HOST, Child, chat_once, chat_stream, free_ports, http_get, nginx_main_config, render_nginx_site,
    require_tool, start_replica, wait_healthy, wait_until,
)

pytestmark = pytest.mark.slow


def _served_by(outcome, names: dict[str, str]) -> str | None:
    """The replica that answered: the last address in nginx's $upstream_addr (earlier ones were refused)."""
    if outcome.replica is None:
        return None
    return names.get(outcome.replica.split(",")[-1].strip())


def test_nginx_passes_over_a_stopped_replica_and_takes_it_back(tmp_path):
    nginx = require_tool("nginx")
    envsubst = require_tool("envsubst", "gettext-base")
    board1, board2, lb_port = free_ports(3)
    names = {f"{HOST}:{board1}": "board1", f"{HOST}:{board2}": "board2"}
    env = {"KESTREL_LB_LISTEN": f"{HOST}:{lb_port}", "KESTREL_BOARD1": f"{HOST}:{board1}",
           "KESTREL_BOARD2": f"{HOST}:{board2}"}
    site = render_nginx_site(envsubst, env, tmp_path / "kestrel-trio.conf")
    main = nginx_main_config(tmp_path, site)
    check = subprocess.run([nginx, "-t", "-p", str(tmp_path), "-c", str(main), "-e", "stderr"],
                           capture_output=True, text=True, timeout=20)
    assert check.returncode == 0, check.stderr

    children: list[Child] = []
    try:
        replicas = {port: start_replica(port, tmp_path / f"{port}.log", drain_delay=1, grace=1)
                    for port in (board1, board2)}
        children += replicas.values()
        for port, child in replicas.items():
            wait_healthy(child, port)
        children.append(Child("nginx", [nginx, "-p", str(tmp_path), "-c", str(main), "-e", "stderr"],
                              tmp_path / "nginx.log", stop_signal=signal.SIGTERM))
        wait_until(lambda: http_get(f"http://{HOST}:{lb_port}/health")[0] == 200, 15, "nginx to answer")
        client = OpenAI(base_url=f"http://{HOST}:{lb_port}/v1", api_key=API_KEY, max_retries=0, timeout=30.0)
        with client, OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0, timeout=30.0) as stranger:
            with pytest.raises(AuthenticationError):
                stranger.models.list()  # the key reaches the replica unchanged: a wrong one is refused there
            _check_balanced(client, names)

            replicas[board1].terminate()
            assert replicas[board1].wait(timeout=20) == 0
            after_stop = [chat_once(client, 4) for _ in range(6)]
            assert all(o.kind == "completed" for o in after_stop), after_stop
            assert {_served_by(o, names) for o in after_stop} == {"board2"}, after_stop

            t_restart = time.monotonic()
            restarted = start_replica(board1, tmp_path / "board1-again.log", drain_delay=1, grace=1)
            children.append(restarted)
            wait_healthy(restarted, board1)
            t_ready = time.monotonic()
            back = wait_until(lambda: _served_by(_checked(chat_once(client, 4)), names) == "board1", 20,
                              "nginx to send a request to the restarted replica")
            print(f"\nnginx (passive checks, fail_timeout 5 s): restarted replica healthy after "
                  f"{t_ready - t_restart:.2f} s, first served a request {time.monotonic() - t_ready:.2f} s later")
            assert back
    except BaseException:
        print("\n".join(f"--- {child.name}\n{child.log_tail(1500)}" for child in children))
        raise
    finally:
        for child in reversed(children):
            child.stop()


def _checked(outcome):
    assert outcome.kind == "completed", outcome
    return outcome


def _check_balanced(client: OpenAI, names: dict[str, str]) -> None:
    """Concurrent streams through nginx all complete, spread over both replicas by least_conn."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        streams = list(pool.map(lambda _: chat_stream(client, 64), range(4), timeout=60))
    assert all(o.kind == "completed" for o in streams), streams
    assert {_served_by(o, names) for o in streams} == {"board1", "board2"}, streams
