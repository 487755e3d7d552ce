"""The deploy/ tree as the tests read it: each overlay rendered by ``kubectl kustomize`` when
kubectl is installed (it carries kustomize), else the plain files of the base and the overlay."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import BASE_DIR

DEPLOY = BASE_DIR / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
OVERLAYS = ("small", "production", "keda")
# AGENTOPS_DEPLOY_PLAIN=1 reads the plain files even where kubectl is installed (to try that path).
KUBECTL = None if os.environ.get("AGENTOPS_DEPLOY_PLAIN") else shutil.which("kubectl")
WORKLOAD_KINDS = ("Deployment", "Job")
# Kinds of custom resources, which the Kubernetes schemas do not have; their own tests check them.
CUSTOM_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}

Obj = dict[str, Any]


def load_yaml_documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _plain(directory: Path) -> list[Obj]:
    """The full objects a kustomization lists as resources, recursively (its patches, namespace
    and images are kustomize's: not applied here)."""
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects += _plain(path) if path.is_dir() else load_yaml_documents(path)
    return objects


@functools.cache
def _render(overlay: str) -> tuple[Obj, ...]:
    directory = KUBERNETES / "overlays" / overlay
    if KUBECTL is None:
        return tuple(_plain(directory))
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"kubectl kustomize {overlay}: {done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def render(overlay: str) -> list[Obj]:
    return list(_render(overlay))


def rendered() -> bool:
    """True when the overlays were rendered by kustomize (patches, namespace, images applied)."""
    return KUBECTL is not None


def find(objects: list[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def named(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def pod_spec(workload: Obj) -> Obj:
    return workload["spec"]["template"]["spec"]


def containers(workload: Obj, *, init: bool = True) -> list[Obj]:
    spec = pod_spec(workload)
    return [*(spec.get("initContainers", []) if init else []), *spec["containers"]]


def workloads(objects: list[Obj]) -> list[Obj]:
    return [o for o in objects if o["kind"] in WORKLOAD_KINDS]


def settings_data(objects: list[Obj]) -> dict[str, str]:
    return find(objects, "ConfigMap", "agentops-settings")["data"]


def entrypoint_roles() -> set[str]:
    """The roles deploy/docker/entrypoint.sh answers (its ``case`` labels, the catch-all aside)."""
    roles = set()
    for line in (DEPLOY / "docker" / "entrypoint.sh").read_text().splitlines():
        stripped = line.strip()
        if stripped.endswith(")") and stripped[:-1].replace("-", "").isalpha():
            roles.add(stripped[:-1])
    return roles
