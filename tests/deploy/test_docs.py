"""docs/operations.md's Kubernetes section read against the manifests: every name its commands
use (namespace, Secret and its keys, Job, Deployments, overlay paths, the image) is one the
overlays make, and the steps come in the order a newcomer must run them (issue 56)."""

from __future__ import annotations

import re
import shlex

import yaml

from tests.conftest import BASE_DIR
from tests.deploy.manifests import (
    KUBERNETES,
    OVERLAYS,
    containers,
    load_yaml_documents,
    render,
    workloads,
)

OPERATIONS = BASE_DIR / "docs" / "operations.md"
README = BASE_DIR / "README.md"


def section() -> str:
    text = OPERATIONS.read_text()
    start = text.index("\n## Kubernetes\n")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def commands() -> list[list[str]]:
    """Every shell command of the section's ```sh blocks, continuation lines joined, as words."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", section(), flags=re.DOTALL):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split(" # ")[0].strip()
            if line and not line.startswith("#"):
                out.append(shlex.split(line.replace("$(", "").replace(")", "")))
    return out


def kubectl_commands() -> list[list[str]]:
    found = []
    for words in commands():
        for i, word in enumerate(words):
            if word == "kubectl":  # also inside TOKEN=$(kubectl ...) and after &&
                found.append(words[i:])
    return found


def all_objects() -> dict[tuple[str, str], dict]:
    return {(o["kind"].lower(), o["metadata"]["name"]): o for ov in OVERLAYS for o in render(ov)}


def test_every_kubectl_command_names_the_namespace_the_overlays_use() -> None:
    namespaces = {o["metadata"].get("namespace") for ov in OVERLAYS for o in render(ov)}
    for words in kubectl_commands():
        if words[1:3] == ["create", "namespace"] or words[1:3] == ["label", "namespace"]:
            assert words[3] in namespaces | {"agentops"}
            continue
        if words[1:3] == ["apply", "-k"]:
            continue  # the overlay names the namespace itself
        assert words[1] == "-n", words
        if namespaces != {None}:  # rendered: the overlays set it
            assert {words[2]} == namespaces - {None} or namespaces == {words[2]}, words


def test_every_object_a_command_names_is_one_the_overlays_make() -> None:
    objects = all_objects()
    aliases = {"deploy": "deployment", "job": "job", "deployment": "deployment", "secret": "secret"}
    referenced = 0
    for words in kubectl_commands():
        for word in words:
            match = re.fullmatch(r"(deployment|deploy|job)/([a-z0-9-]+)", word)
            if match:
                kind, name = aliases[match.group(1)], match.group(2)
                assert (kind, name) in objects, f"{word}: no such object in the overlays"
                referenced += 1
    assert referenced >= 5


def test_the_secret_the_docs_create_is_the_one_every_pod_reads_with_the_keys_it_needs() -> None:
    (create,) = [w for w in kubectl_commands() if w[3:6] == ["create", "secret", "generic"]]
    name = create[6]
    literals = [w.removeprefix("--from-literal=") for w in create if w.startswith("--from-")]
    keys = {literal.split("=", 1)[0] for literal in literals}
    for overlay in OVERLAYS:
        for workload in workloads(render(overlay)):
            for container in containers(workload):
                refs = [s["secretRef"]["name"] for s in container["envFrom"] if "secretRef" in s]
                assert refs == [name]
    example = load_yaml_documents(KUBERNETES / "secret.example.yaml")[0]
    assert example["metadata"]["name"] == name
    # What every process needs, and the docs create; provider keys match *_API_KEY.
    assert {"DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL"} <= keys
    assert all(
        k.endswith("_API_KEY") for k in keys - {"DJANGO_SECRET_KEY", "DATABASE_URL", "REDIS_URL"}
    )
    assert set(example["stringData"]) >= keys


def test_the_paths_applied_exist_and_the_image_built_is_the_one_the_overlays_run() -> None:
    applied = [w[3] for w in kubectl_commands() if w[1:3] == ["apply", "-k"]]
    assert "deploy/kubernetes/overlays/small" in applied
    for path in applied:
        assert (BASE_DIR / path / "kustomization.yaml").exists(), path
    built = [w[w.index("-t") + 1] for w in commands() if w[:2] == ["docker", "build"]]
    first = built[0]
    kustomization = yaml.safe_load((KUBERNETES / "overlays/small/kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert first == f"{image['newName']}:{image['newTag']}"
    for words in commands():
        if words[:2] == ["docker", "push"]:
            assert words[2] in built


def test_the_install_steps_come_in_the_order_they_must_run() -> None:
    """Image, namespace, Secret, apply, the migrations' end: the first occurrence of each."""
    lines = [" ".join(w) for w in commands()]

    def first(pattern: str) -> int:
        return next(i for i, line in enumerate(lines) if re.search(pattern, line))

    steps = [
        first(r"^docker build"),
        first(r"^docker push"),
        first(r"create namespace"),
        first(r"create secret generic"),
        first(r"apply -k deploy/kubernetes/overlays/small"),
        first(r"wait --for=condition=complete job/agentops-migrate"),
        first(r"rollout status deployment/agentops-web"),
    ]
    assert steps == sorted(steps)
    upgrade_delete = first(r"delete job agentops-migrate")
    assert upgrade_delete > steps[-1]  # the upgrade deletes the finished Job before applying
    assert any(i > upgrade_delete and "apply -k" in line for i, line in enumerate(lines))


def test_the_documented_grace_periods_are_the_manifests() -> None:
    text = section()
    worker = render("small")
    graces = {
        w["metadata"]["name"]: w["spec"]["template"]["spec"].get("terminationGracePeriodSeconds")
        for w in workloads(worker)
    }
    assert f"`terminationGracePeriodSeconds` is {graces['agentops-worker']} s" in text
    assert f"grace {graces['agentops-web']} s" in text


def test_the_readme_points_at_the_kubernetes_section() -> None:
    readme = README.read_text()
    assert "(docs/operations.md#kubernetes)" in readme
    assert "kubectl apply -k deploy/kubernetes/overlays/small" in readme
