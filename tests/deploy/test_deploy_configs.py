"""The files in deploy/ agree with each other, with the CLI and with docs/deployment.md."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from deploy_kit import (
    DEPLOY, HOST, NGINX_VARIABLES, REPO, Child, free_ports, haproxy_server_states, http_get, render_nginx_site,
    require_tool, wait_until,
)
from kestrel_trio.cli.parser import build_parser
from kestrel_trio.server import HTTP_GRACE_MARGIN

UNIT = DEPLOY / "kestrel-trio.service"
MANIFEST = DEPLOY / "k8s" / "kestrel-trio.yaml"
CONTAINERFILE = DEPLOY / "Containerfile"
HAPROXY_CFG = DEPLOY / "haproxy.cfg"
DOCS = REPO / "docs" / "deployment.md"
BOARDS = {"KESTREL_BOARD1": f"{HOST}:9", "KESTREL_BOARD2": f"{HOST}:9"}  # the discard port: nothing answers


def _unit_settings() -> dict[str, str]:
    settings = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


def _serve_flags(argv: list[str]):
    """``argv`` (starting at "serve") as the CLI parses it: a flag the CLI lacks fails here."""
    args = build_parser().parse_args(argv)
    assert args.command == "serve"
    return args


def _seconds(text: str) -> float:
    return float(text[:-2]) / 1000 if text.endswith("ms") else float(text.rstrip("s"))


def _haproxy_drop_seconds() -> float:
    """Longest time (s) from a replica's first 503 to HAProxy marking it DOWN: inter + (fall - 1) * fastinter."""
    words = re.search(r"^\s*default-server (.+)$", HAPROXY_CFG.read_text(), re.M).group(1).split()
    value = {key: words[words.index(key) + 1] for key in ("inter", "fastinter", "fall")}
    return _seconds(value["inter"]) + (int(value["fall"]) - 1) * _seconds(value["fastinter"])


def test_the_unit_stops_within_its_timeout_and_drains_longer_than_haproxy_needs():
    settings = _unit_settings()
    command = shlex.split(settings["ExecStart"])
    assert command[0].endswith("/kestrel-trio") and command[-1] == "$KESTREL_ARGS"
    args = _serve_flags(command[1:-1])
    assert args.host == "0.0.0.0" and args.port == 8000
    assert float(settings["TimeoutStopSec"]) > args.drain_delay + args.grace + HTTP_GRACE_MARGIN
    assert args.drain_delay > _haproxy_drop_seconds()
    assert settings["KillSignal"] == "SIGTERM" and settings["Restart"] == "on-failure"
    assert settings["User"] not in ("", "root")


def test_the_unit_passes_systemd_analyze_verify(tmp_path: Path):
    analyze = require_tool("systemd-analyze", "systemd")
    installed = Path(sys.executable).parent / "kestrel-trio"
    if not installed.exists():
        pytest.skip(f"no kestrel-trio console script beside {sys.executable}")
    unit = tmp_path / "kestrel-trio.service"
    unit.write_text(UNIT.read_text().replace("/opt/kestrel-trio/bin/kestrel-trio", str(installed)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_kubernetes_example_probes_and_terminates_as_documented():
    text = MANIFEST.read_text()
    args = _serve_flags(json.loads(re.search(r"args: (\[.*?\])", text, re.S).group(1)))
    grace_period = int(re.search(r"terminationGracePeriodSeconds: (\d+)", text).group(1))
    assert grace_period > args.drain_delay + args.grace + HTTP_GRACE_MARGIN
    readiness = text[text.index("readinessProbe:"):text.index("livenessProbe:")]
    liveness = text[text.index("livenessProbe:"):text.index("resources:")]
    assert "path: /health," in readiness and "path: /metrics," in liveness
    period = int(re.search(r"periodSeconds: (\d+)", readiness).group(1))
    failures = int(re.search(r"failureThreshold: (\d+)", readiness).group(1))
    assert period * failures < args.drain_delay, "a loading or stalled pod must leave the Service quickly"
    container_cmd = json.loads(re.search(r"^CMD (\[.*\])$", CONTAINERFILE.read_text(), re.M).group(1))
    assert _serve_flags(container_cmd).drain_delay == args.drain_delay


def _haproxy_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    haproxy = require_tool("haproxy")
    return subprocess.run([haproxy, "-c", "-f", str(HAPROXY_CFG)], capture_output=True, text=True, timeout=30,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", **env})


@pytest.mark.parametrize("extra", [{}, {"KESTREL_BOARD3": f"{HOST}:9", "KESTREL_BOARD4": f"{HOST}:9"},
                                   {"KESTREL_HAPROXY_USER": "root"}])
def test_haproxy_accepts_the_config(extra):
    result = _haproxy_check({**BOARDS, **extra})
    assert result.returncode == 0, result.stderr
    assert "WARNING" not in result.stderr, result.stderr


def test_haproxy_refuses_to_start_without_the_replicas_addresses():
    result = _haproxy_check({"KESTREL_BOARD1": f"{HOST}:9"})
    assert result.returncode != 0
    assert "set KESTREL_BOARD1 and KESTREL_BOARD2" in result.stderr


def test_haproxy_answers_in_the_openai_envelope_when_no_replica_is_up(tmp_path: Path):
    haproxy = require_tool("haproxy")
    lb_port, stats_port = free_ports(2)
    env = {**BOARDS, "KESTREL_LB_BIND": f"{HOST}:{lb_port}", "KESTREL_STATS_BIND": f"{HOST}:{stats_port}"}
    child = Child("haproxy", [haproxy, "-db", "-f", str(HAPROXY_CFG)], tmp_path / "haproxy.log", env=env)
    try:
        wait_until(lambda: haproxy_server_states(stats_port) == {"board1": "DOWN", "board2": "DOWN"}, 15,
                   "HAProxy to mark both replicas DOWN")
        status, body = http_get(f"http://{HOST}:{lb_port}/v1/models")
    finally:
        child.stop()
    assert status == 503
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"} and "no kestrel-trio replica" in error["message"]


def test_the_nginx_template_replaces_only_its_own_variables(tmp_path: Path):
    envsubst = require_tool("envsubst", "gettext-base")
    env = {"KESTREL_LB_LISTEN": f"{HOST}:8080", "KESTREL_BOARD1": "10.0.0.1:8000", "KESTREL_BOARD2": "10.0.0.2:8000"}
    site = render_nginx_site(envsubst, env, tmp_path / "kestrel-trio.conf").read_text()
    assert "${KESTREL" not in site
    assert f"listen {HOST}:8080;" in site and "server 10.0.0.2:8000 max_fails=1" in site
    assert "$upstream_addr" in site and "$proxy_add_x_forwarded_for" in site and "$host;" in site


def test_the_docs_give_the_commands_the_tests_run():
    docs = DOCS.read_text()
    assert "haproxy -db -f deploy/haproxy.cfg" in docs
    assert f"envsubst '{NGINX_VARIABLES}' < deploy/nginx.conf" in docs
    for path in set(re.findall(r"deploy/[\w./-]+\w", docs)):
        assert (REPO / path).exists(), f"docs/deployment.md names {path}, which does not exist"
