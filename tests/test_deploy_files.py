"""Docker does not run on our machines, so the compose file is checked by reading it."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path
from typing import Any

import yaml
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parents[1]


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def command_of(service: dict[str, Any]) -> list[str]:
    command = service.get("command", [])
    return shlex.split(command) if isinstance(command, str) else list(command)


def test_every_app_service_runs_a_command_that_exists() -> None:
    checked = []
    for name, service in compose()["services"].items():
        if "build" not in service:
            continue
        argv = command_of(service)
        if argv[:2] == ["python", "manage.py"]:
            assert argv[2] in get_commands(), f"{name}: no management command {argv[2]!r}"
        elif argv[0] == "gunicorn":
            module, _, attribute = argv[1].partition(":")
            assert hasattr(importlib.import_module(module), attribute or "application"), name
        else:
            raise AssertionError(f"{name}: unknown command {argv}")
        checked.append(name)
    assert {"web", "worker", "migrate", "scheduler"} <= set(checked)


def test_redis_persists_jobs_and_every_long_running_service_has_a_health_check() -> None:
    services = compose()["services"]
    assert "--appendonly" in command_of(services["redis"])
    for name in ("redis", "postgres", "web", "worker"):
        assert services[name]["healthcheck"]["test"], name
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])


def test_the_dockerfile_builds_what_compose_runs() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert ".[project,postgres]" in dockerfile
    assert "collectstatic" in dockerfile


def test_the_observability_profile_wires_grafana_to_prometheus() -> None:
    services = compose()["services"]
    prometheus, grafana = services["prometheus"], services["grafana"]
    assert prometheus["profiles"] == grafana["profiles"] == ["observability"]
    assert "./deploy/prometheus:/etc/prometheus:ro" in prometheus["volumes"]
    assert "./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro" in grafana["volumes"]
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090"
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/jobs.json").read_text())
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {datasource["uid"]}
    # The app services stay out of the profile: a plain `up` runs them
    assert "profiles" not in services["web"]


def test_the_ha_profile_adds_a_replica_and_three_sentinels_and_app_services_can_use_them() -> None:
    services = compose()["services"]
    ha = {name for name, service in services.items() if "ha" in service.get("profiles", [])}
    assert ha == {"redis-replica", "sentinel1", "sentinel2", "sentinel3"}
    assert "--replicaof" in command_of(services["redis-replica"])
    for name in ("sentinel1", "sentinel2", "sentinel3"):
        script = " ".join(command_of(services[name]))
        assert "sentinel monitor mymaster redis 6379 2" in script, name
        assert "--sentinel" in script, name
    for name in ("web", "worker", "scheduler", "migrate"):
        env = services[name]["environment"]
        assert "REDIS_SENTINELS" in env, name
        assert "REDIS_SENTINEL_MASTER" in env, name


def test_the_worker_scales_without_fixed_names_or_host_ports() -> None:
    worker = compose()["services"]["worker"]
    assert "container_name" not in worker
    assert "ports" not in worker


def test_the_observability_ports_listen_on_loopback_only() -> None:
    services = compose()["services"]
    for name in ("prometheus", "grafana"):
        assert all(port.startswith("127.0.0.1:") for port in services[name]["ports"]), name
    assert services["grafana"]["environment"]["GF_AUTH_ANONYMOUS_ENABLED"] == "false"


def test_gunicorn_writes_its_access_log_as_json_lines(tmp_path: Path) -> None:
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "JOBS_"))},
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DJANGO_DEBUG": "0",
        "DJANGO_SECRET_KEY": "k" * 60 + "-production-like-secret-value",
        "DJANGO_SECURE_SSL_REDIRECT": "0",
        "VAR_DIR": str(tmp_path),
    }
    gunicorn = Path(sys.executable).with_name("gunicorn")
    server = subprocess.Popen(
        [str(gunicorn), "--bind", f"127.0.0.1:{port}", "--workers", "1", "project.wsgi"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/healthz?token=s3cr3t-in-the-query&page=2",
                headers={"User-Agent": 'quote " agent'},
            )
            try:
                urllib.request.urlopen(request, timeout=5)
                break
            except urllib.error.HTTPError:
                break  # an answer (503 on an empty database) is all it takes
            except OSError:
                time.sleep(0.2)
    finally:
        server.terminate()
        out, _ = server.communicate(timeout=30)
    [line] = [json.loads(text) for text in out.splitlines() if text.strip()]
    assert line["logger"] == "gunicorn.access"
    # The query string's secret is masked: the line goes through RedactFilter.
    assert '"GET /healthz?token=[redacted]&page=2 HTTP/1.1"' in line["message"]
    assert "s3cr3t-in-the-query" not in out
    assert 'quote \\" agent' in line["message"] or 'quote " agent' in line["message"]
