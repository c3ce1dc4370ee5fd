"""Two replicas behind HAProxy (deploy/haproxy.cfg as shipped): one is SIGTERMed mid-stream and restarted.

Theory of operation: the replica runs with --drain-delay, so on SIGTERM its
/health turns 503 while it keeps serving; HAProxy's check takes it out of the
pool before its listener closes, its running streams finish (or end with an
error event and [DONE] when --grace runs out), and no client sees a connection
error. Restarted on the same port, it answers 200 again and HAProxy sends it
work again. The figures are printed (``pytest -s``) for the closing note.
"""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
from pathlib import Path

import pytest
from openai import OpenAI

from deploy_kit import (
    API_KEY, DEPLOY, HOST, Child, LoadLoop, Outcome, chat_stream, free_ports, haproxy_server_states, require_tool, start_replica, wait_healthy, wait_until,
)

DRAIN_DELAY = 3.0  # s: more than HAProxy's ~1.5 s to mark a replica DOWN (deploy/haproxy.cfg)
GRACE = 1.0  # s: short, so a long stream on the stopped replica is cut with an error event
LONG_STREAMS = 4
LONG_TOKENS = 800
VICTIM, SURVIVOR = "board1", "board2"

pytestmark = pytest.mark.slow


class Cluster:
    """Replicas and HAProxy on free loopback ports; ``close`` kills whatever still runs."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        board1, board2, self.lb_port, self.stats_port = free_ports(4)
        self.ports = {VICTIM: board1, SURVIVOR: board2}
        self.children: list[Child] = []
        self.replicas: dict[str, Child] = {}

    def start_replica(self, name: str) -> Child:
        log = self.tmp_path / f"{name}-{len(self.children)}.log"
        child = start_replica(self.ports[name], log, drain_delay=DRAIN_DELAY, grace=GRACE)
        self.children.append(child)
        self.replicas[name] = child
        return child

    def start_haproxy(self, haproxy: str) -> None:
        env = {"KESTREL_BOARD1": f"{HOST}:{self.ports[VICTIM]}", "KESTREL_BOARD2": f"{HOST}:{self.ports[SURVIVOR]}",
               "KESTREL_LB_BIND": f"{HOST}:{self.lb_port}", "KESTREL_STATS_BIND": f"{HOST}:{self.stats_port}"}
        argv = [haproxy, "-db", "-f", str(DEPLOY / "haproxy.cfg")]
        self.children.append(Child("haproxy", argv, self.tmp_path / "haproxy.log", env=env, stop_signal=signal.SIGTERM))

    def states(self) -> dict[str, str]:
        return haproxy_server_states(self.stats_port)

    def client(self) -> OpenAI:
        # No client retries: a connection error must show, not be papered over.
        return OpenAI(base_url=f"http://{HOST}:{self.lb_port}/v1", api_key=API_KEY, max_retries=0, timeout=30.0)

    def logs(self) -> str:
        return "\n".join(f"--- {child.name}\n{child.log_tail(1500)}" for child in self.children)

    def close(self) -> None:
        for child in reversed(self.children):
            child.stop()


def _start_long_streams(pool, cluster: Cluster) -> list[concurrent.futures.Future]:
    def one(started: threading.Event) -> Outcome:
        with cluster.client() as client:
            return chat_stream(client, LONG_TOKENS, started)

    events = [threading.Event() for _ in range(LONG_STREAMS)]
    futures = [pool.submit(one, event) for event in events]
    for event in events:
        assert event.wait(timeout=30), "a long stream never got its first token"
    return futures


def _print_figures(load_outcomes: list[Outcome], streams: list[Outcome], times: dict[str, float]) -> None:
    phases = [("SIGTERM to DOWN (draining, still serving)", float("-inf"), times["down"]),
              ("DOWN to restart (out of the pool)", times["down"], times["restart"]),
              ("restart to served again", times["restart"], float("inf"))]
    print(f"\nfailover figures (loopback, a busy 2-core machine; drain-delay {DRAIN_DELAY} s, grace {GRACE} s):")
    print(f"  requests sent from SIGTERM until the restarted replica served again: {_count(load_outcomes)}")
    for label, start, end in phases:
        print(f"    {label}: {_count([o for o in load_outcomes if start <= o.started < end])}")
    print(f"  long streams ({LONG_TOKENS} tokens max): "
          + ", ".join(f"{o.replica} {o.kind} after {o.chunks} events" for o in streams))
    print(f"  HAProxy marked {VICTIM} DOWN {times['down'] - times['term']:.2f} s after SIGTERM; it exited "
          f"{times['exit_code']:.0f} {times['exit'] - times['term']:.2f} s after SIGTERM")
    print(f"  restarted: /health 200 after {times['ready'] - times['restart']:.2f} s, HAProxy marked it UP "
          f"{times['up'] - times['ready']:.2f} s later ({times['up'] - times['restart']:.2f} s after the restart)")


def _count(outcomes: list[Outcome]) -> str:
    served = sum(o.kind == "completed" for o in outcomes)
    by_replica = {name: sum(o.replica == name for o in outcomes) for name in (VICTIM, SURVIVOR)}
    return (f"sent {len(outcomes)}, served {served}, failed {len(outcomes) - served} "
            f"(by replica: {VICTIM} {by_replica[VICTIM]}, {SURVIVOR} {by_replica[SURVIVOR]})")


def test_haproxy_drops_a_draining_replica_and_readmits_it(tmp_path):
    haproxy = require_tool("haproxy")
    cluster = Cluster(tmp_path)
    try:
        for name in (VICTIM, SURVIVOR):
            cluster.start_replica(name)
        for name in (VICTIM, SURVIVOR):
            wait_healthy(cluster.replicas[name], cluster.ports[name])
        cluster.start_haproxy(haproxy)
        wait_until(lambda: cluster.states() == {VICTIM: "UP", SURVIVOR: "UP"}, 15, "both replicas UP in HAProxy")
        _failover(cluster)
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.close()


def _stop_victim(cluster: Cluster) -> dict[str, float]:
    """SIGTERM the victim; wait for HAProxy to mark it DOWN and for it to exit. Returns monotonic times (s)."""
    times = {"term": time.monotonic()}
    cluster.replicas[VICTIM].terminate()
    wait_until(lambda: cluster.states().get(VICTIM) == "DOWN", DRAIN_DELAY + 10, "HAProxy to mark it DOWN")
    times["down"] = time.monotonic()
    times["exit_code"] = cluster.replicas[VICTIM].wait(timeout=DRAIN_DELAY + GRACE + 15)
    times["exit"] = time.monotonic()
    return times


def _restart_victim(cluster: Cluster, loads: list[LoadLoop]) -> dict[str, float]:
    """Start the victim again on its port; wait until HAProxy marks it UP and sends it a request."""
    times = {"restart": time.monotonic()}
    wait_healthy(cluster.start_replica(VICTIM), cluster.ports[VICTIM])
    times["ready"] = time.monotonic()
    wait_until(lambda: cluster.states().get(VICTIM) == "UP", 15, "HAProxy to mark it UP again")
    times["up"] = up = time.monotonic()
    wait_until(lambda: any(o.replica == VICTIM and o.started > up for load in loads for o in load.outcomes),
               15, "a request served by the restarted replica")
    return times


def _failover(cluster: Cluster) -> None:
    loads = [LoadLoop(cluster.client) for _ in range(2)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=LONG_STREAMS + len(loads)) as pool:
        try:
            long_streams = _start_long_streams(pool, cluster)
            load_runs = [pool.submit(load.run) for load in loads]
            times = _stop_victim(cluster)
            times.update(_restart_victim(cluster, loads))
        finally:
            for load in loads:
                load.stop()
        streams = [future.result(timeout=60) for future in long_streams]
        for run in load_runs:
            run.result(timeout=30)  # re-raises if a load loop died

    load_outcomes = sorted((o for load in loads for o in load.outcomes), key=lambda o: o.started)
    _print_figures(load_outcomes, streams, times)

    failed = [o for o in load_outcomes + streams if o.kind == "failed"]
    assert not failed, failed
    assert times["exit_code"] == 0
    assert times["down"] - times["term"] < DRAIN_DELAY, "HAProxy still sent work when the listener closed"
    assert {o.replica for o in streams} == {VICTIM, SURVIVOR}, "leastconn should spread the long streams"
    for stream in streams:
        assert stream.ended > times["term"], "a long stream ended before SIGTERM: raise LONG_TOKENS"
        assert stream.kind == "completed" or stream.replica == VICTIM, stream
    between = [o for o in load_outcomes if times["down"] <= o.started < times["restart"]]
    assert between, "no request was sent while the replica was out of the pool"
    assert {o.replica for o in between} == {SURVIVOR}, between
    assert all(o.kind == "completed" for o in load_outcomes), "a short request got an error event"
