"""The Kubernetes manifests (deploy/kubernetes) as a cluster would take them: rendered by
kustomize (FLOE_KUSTOMIZE, from tests/tools/kustomize), every object valid against the
Kubernetes schemas (kubernetes-validate, strict: unknown fields fail), and what makes the
deployment work checked on the rendered objects — each job file a container runs exists and
passes `floe validate` with the container's environment, every probe and `$(VAR)` resolves,
every secret key exists, the CDC job runs alone, and a job has time for its final checkpoint.
"""

from __future__ import annotations

import base64
import os
import pathlib
import re
import subprocess
import tomllib

import kubernetes_validate
import pytest
import yaml

from conftest import _binary

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The oldest and the newest Kubernetes the manifests are meant for.
VERSIONS = ["1.30.0", "1.37.0"]


def _duration_seconds(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    number, unit = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text).groups()
    return float(number) * units[unit]


@pytest.fixture(scope="module")
def objects() -> list[dict]:
    kustomize = os.environ.get("FLOE_KUSTOMIZE")
    assert kustomize, "FLOE_KUSTOMIZE is unset: FLOE_KUSTOMIZE=$(tests/tools/kustomize)"
    out = subprocess.run(
        [kustomize, "build", str(ROOT / "deploy" / "kubernetes")],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _named(objects, kind, prefix):
    """The object of `kind` whose name is `prefix` (generated ones carry a hash suffix)."""
    found = [
        o
        for o in objects
        if o["kind"] == kind and re.fullmatch(re.escape(prefix) + r"(-[a-z0-9]{10})?", o["metadata"]["name"])
    ]
    assert len(found) == 1, f"{kind} {prefix}: {[o['metadata']['name'] for o in found]}"
    return found[0]


def _workloads(objects):
    return [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]


def _environment(objects, pod: dict, container: dict) -> dict[str, str]:
    """The container's environment as the kubelet makes it (envFrom, then env)."""
    env = {}
    for source in container.get("envFrom", []):
        if "configMapRef" in source:
            env.update(_named(objects, "ConfigMap", source["configMapRef"]["name"])["data"])
        else:
            secret = _named(objects, "Secret", source["secretRef"]["name"])
            env.update({k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()})
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = item["value"]
        else:
            ref = item["valueFrom"]["secretKeyRef"]
            env[item["name"]] = _environment(objects, pod, {"envFrom": [{"secretRef": {"name": ref["name"]}}]})[ref["key"]]
    return env


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_is_valid_against_the_kubernetes_schemas(objects, version):
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds
    for o in objects:
        kubernetes_validate.validate(o, version, strict=True)


def test_the_schema_check_refuses_what_a_cluster_would(objects):
    # The check above can fail: an unknown field and a wrong type are refused.
    deployment = _named(objects, "Deployment", "floe-otlp")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replica"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_every_container_has_probes_on_a_port_it_serves(objects):
    for workload in _workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
            assert "livenessProbe" in container and "readinessProbe" in container, where
            for probe in (container["livenessProbe"], container["readinessProbe"]):
                handler = probe.get("httpGet") or probe.get("tcpSocket")
                if handler:
                    assert handler["port"] in ports, f"{where}: probe port {handler['port']}"
            if container["image"].startswith("floe") and container.get("command") != ["floe-catalog"]:
                # A job or the daemon: /healthz and /readyz on the address it is told to serve.
                env = _environment(objects, pod, container)
                listen = env.get("FLOE_METRICS_LISTEN") or env.get("FLOE_MAINTENANCE_METRICS")
                assert listen and listen.startswith("0.0.0.0:"), where
                assert int(listen.rsplit(":", 1)[1]) == ports["metrics"], where
                assert container["livenessProbe"]["httpGet"]["path"] == "/healthz", where
                assert container["readinessProbe"]["httpGet"]["path"] == "/readyz", where
            assert container["resources"]["requests"]["memory"], where
            assert container["resources"]["limits"]["memory"], where


def test_every_reference_resolves(objects):
    for workload in _workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        claims = {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
        for volume in volumes.values():
            if "configMap" in volume:
                _named(objects, "ConfigMap", volume["configMap"]["name"])
        for container in pod["containers"]:
            where = f"{workload['metadata']['name']}/{container['name']}"
            env = _environment(objects, pod, container)  # raises on a missing secret key
            for text in container.get("command", []) + container.get("args", []):
                for name in re.findall(r"\$\((\w+)\)", text):
                    assert name in env, f"{where}: $({name}) in {text!r}"
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes or mount["name"] in claims, f"{where}: {mount['name']}"
        selector = workload["spec"]["selector"]["matchLabels"]
        labels = workload["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items(), workload["metadata"]["name"]
    for service in (o for o in objects if o["kind"] == "Service"):
        selected = [
            w
            for w in _workloads(objects)
            if service["spec"]["selector"].items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert selected, f"service {service['metadata']['name']} selects no pods"


def _job_containers(objects):
    """(workload, pod, container, job file name) of every `floe run` container."""
    for workload in _workloads(objects):
        pod = workload["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if container.get("command") == ["floe"] and container["args"][:1] == ["run"]:
                yield workload, pod, container, pathlib.PurePath(container["args"][-1]).name


def test_each_job_file_is_in_its_configmap_and_valid_with_the_container_s_environment(objects, tmp_path):
    jobs = _named(objects, "ConfigMap", "floe-jobs")["data"]
    floe = _binary("floe", "FLOE_BIN")
    ran = []
    for workload, pod, container, name in _job_containers(objects):
        assert name in jobs, f"{workload['metadata']['name']}: {name} not in floe-jobs"
        assert jobs[name] == (ROOT / "jobs" / name).read_text(), name
        path = tmp_path / name
        path.write_text(jobs[name])
        env = {"PATH": os.environ["PATH"], **_environment(objects, pod, container)}
        done = subprocess.run([floe, "validate", str(path)], env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{name}: {done.stdout}{done.stderr}"
        # The final checkpoint on SIGTERM fits in the grace period, with room.
        interval = tomllib.loads(jobs[name]).get("checkpoint", {}).get("interval", "10s")
        grace = pod.get("terminationGracePeriodSeconds", 30)
        assert grace >= 3 * _duration_seconds(interval) + 60, f"{name}: {grace} s"
        ran.append(name)
    assert sorted(ran) == ["otlp-rollups.toml", "otlp.toml", "postgres-cdc.toml"]
    # And `floe validate` does refuse: the same environment without the catalog address.
    workload, pod, container, name = next(_job_containers(objects))
    path = tmp_path / "broken.toml"
    path.write_text(jobs[name].replace('uri = "${FLOE_CATALOG_URI', 'uri = "ftp://${FLOE_CATALOG_URI'))
    env = {"PATH": os.environ["PATH"], **_environment(objects, pod, container)}
    done = subprocess.run([floe, "validate", str(path)], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "broken.toml:" in done.stdout + done.stderr


def test_the_cdc_job_runs_alone_and_a_drain_does_not_move_it(objects):
    cdc = _named(objects, "Deployment", "floe-cdc")
    assert cdc["spec"]["replicas"] == 1
    assert cdc["spec"]["strategy"]["type"] == "Recreate"
    budget = _named(objects, "PodDisruptionBudget", "floe-cdc")
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"]["matchLabels"].items() <= cdc["spec"]["template"]["metadata"]["labels"].items()


def test_the_stateful_job_keeps_its_state_directory_on_a_volume(objects):
    rollups = _named(objects, "StatefulSet", "floe-rollups")
    pod = rollups["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    state_dir = _environment(objects, pod, container)["FLOE_STATE_DIR"]
    claims = {c["metadata"]["name"] for c in rollups["spec"]["volumeClaimTemplates"]}
    mounted = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounted.get(state_dir) in claims
