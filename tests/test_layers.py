"""The layer contract (pyproject.toml, ``[tool.importlinter]``, architecture.md §2) covers the whole
tree: every module outside migrations stands in exactly one layer, so a new module cannot slip past
``lint-imports`` by being in none."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layers() -> list[list[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return [
        [name.strip() for name in layer.replace("|", ":").split(":")]
        for layer in contract["layers"]
    ]


def _modules() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    names = []
    for package in config["root_packages"]:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "migrations" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join(parts))
    return names


def _homes(module: str, layers: list[list[str]]) -> list[str]:
    return [
        name
        for layer in layers
        for name in layer
        if module == name or module.startswith(name + ".")
    ]


def test_every_module_stands_in_exactly_one_layer() -> None:
    layers = _layers()
    names = [name for layer in layers for name in layer]
    homeless, twice = [], []
    for module in _modules():
        homes = _homes(module, layers)
        if not homes and any(name.startswith(module + ".") for name in names):
            # A package that holds layers (``agentops``, ``inference``): its __init__ hands
            # names on.
            continue
        if not homes:
            homeless.append(module)
        elif len(homes) > 1:
            twice.append(f"{module}: {homes}")
    assert not homeless, (
        f"modules in no layer of the contract (place them in pyproject.toml): {homeless}"
    )
    assert not twice, f"modules in more than one layer: {twice}"


def test_every_layer_name_is_a_module_of_the_tree() -> None:
    modules = set(_modules())
    unknown = [name for layer in _layers() for name in layer if name not in modules]
    assert not unknown, f"layers that name no module (moved or removed?): {unknown}"
