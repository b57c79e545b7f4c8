"""Every third-party module the package imports is installed by what the image installs (`.[deploy]`, as
deploy/requirements.lock pins it, each distribution by version and hash).

A module present in the test environment only through a test tool's dependencies (pydantic-settings came with
cfn-lint's) passes every test here and fails the image at its first import: this finds it without building the image.
"""

import ast
import re
import sys
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from ddb_athena.lib.settings import REPO_ROOT

PACKAGE = REPO_ROOT / "ddb_athena"
LOCKS = [REPO_ROOT / "deploy" / "requirements.lock", REPO_ROOT / "deploy" / "build-requirements.lock"]
PIN = re.compile(r"^([A-Za-z0-9._-]+)==(\S+)")
# The local stack (ddb_athena/dev) runs from a developer's checkout, installed with the `dev` extra.
EXTRAS_BY_PART = {"dev": ("deploy", "dev")}
IMAGE_EXTRAS = ("deploy",)


def _requirements(name: str, wanted_extras: tuple[str, ...]) -> list[Requirement]:
    environments = [{"extra": extra} for extra in wanted_extras] or [{"extra": ""}]
    requirements = [Requirement(line) for line in distribution(name).requires or []]
    return [requirement for requirement in requirements if requirement.marker is None or any(requirement.marker.evaluate(e) for e in environments)]


def _installed_closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions `pip install '.[extras]'` brings, read from the installed metadata."""
    seen: set[str] = set()
    pending = [("ddb_athena", extras)]
    while pending:
        name, wanted_extras = pending.pop()
        seen.add(canonicalize_name(name))
        for requirement in _requirements(name, wanted_extras):
            if canonicalize_name(requirement.name) not in seen:
                pending.append((requirement.name, tuple(requirement.extras)))
    return seen


def _imported_top_level_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module.split(".")[0])
    return modules - set(sys.stdlib_module_names) - {"ddb_athena", "__future__"}


def test_every_module_the_package_imports_comes_with_its_install_requirements():
    providers = packages_distributions()
    closures = {extras: _installed_closure(extras) for extras in {IMAGE_EXTRAS, *EXTRAS_BY_PART.values()}}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        part = path.relative_to(PACKAGE).parts[0]
        closure = closures[EXTRAS_BY_PART.get(part, IMAGE_EXTRAS)]
        for module in sorted(_imported_top_level_modules(path)):
            distributions = {canonicalize_name(name) for name in providers.get(module, [])}
            if not distributions & closure:
                missing.append(f"{path.relative_to(PACKAGE.parent)} imports {module} (from {sorted(distributions) or 'nothing installed'})")
    assert not missing, "not installed by setup.py's requirements:\n" + "\n".join(missing)


def test_the_check_finds_a_module_that_only_a_test_tool_brings():
    # cfn-lint (the `test` extra) brings jsonschema; nothing the image installs does.
    assert "jsonschema" not in _installed_closure(IMAGE_EXTRAS)
    assert "jsonschema" in _installed_closure(("test",))


def _locked(path) -> dict[str, tuple[str, int]]:
    """name: (version, number of hashes) for each distribution the lock pins."""
    pins, name = {}, None
    for line in path.read_text().splitlines():
        if match := PIN.match(line):
            name = canonicalize_name(match.group(1))
            pins[name] = (match.group(2), 0)
        elif name and line.strip().startswith("--hash=sha256:"):
            pins[name] = (pins[name][0], pins[name][1] + 1)
    return pins


def test_the_lock_pins_by_hash_what_setup_py_requires_at_versions_it_allows():
    """`make lock` after a change to setup.py's requirements: the image installs only what the lock pins."""
    locked = _locked(LOCKS[0])
    unhashed = [name for name, (_, hashes) in locked.items() if hashes == 0]
    assert unhashed == []
    wrong = [
        f"{requirement} (locked: {locked.get(canonicalize_name(requirement.name), ('nothing',))[0]})"
        for requirement in _requirements("ddb_athena", IMAGE_EXTRAS)
        if canonicalize_name(requirement.name) not in locked or locked[canonicalize_name(requirement.name)][0] not in requirement.specifier
    ]
    assert wrong == [], "deploy/requirements.lock is behind setup.py (`make lock`): " + ", ".join(wrong)
    # Not compared: what those requirements bring, as this environment resolved them (a release tomorrow may bring
    # another); the image's `pip check` holds the lock to itself.
    assert {"setuptools", "wheel"} <= set(_locked(LOCKS[1]))
