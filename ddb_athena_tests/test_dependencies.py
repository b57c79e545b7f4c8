"""Every third-party module the package imports is installed by what the image installs (`pip install '.[deploy]'`).

A module present in the test environment only through a test tool's dependencies (pydantic-settings came with
cfn-lint's) passes every test here and fails the image at its first import: this finds it without building the image.
"""

import ast
import sys
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PACKAGE = Path(__file__).resolve().parents[1] / "ddb_athena"
# The local stack (ddb_athena/dev) runs from a developer's checkout, installed with the `dev` extra.
EXTRAS_BY_PART = {"dev": ("deploy", "dev")}
IMAGE_EXTRAS = ("deploy",)


def _installed_closure(extras: tuple[str, ...]) -> set[str]:
    """The distributions `pip install '.[extras]'` brings, read from the installed metadata."""
    seen: set[str] = set()
    pending = [("ddb_athena", extras)]
    while pending:
        name, wanted_extras = pending.pop()
        seen.add(canonicalize_name(name))
        for line in distribution(name).requires or []:
            requirement = Requirement(line)
            environments = [{"extra": extra} for extra in wanted_extras] or [{"extra": ""}]
            if requirement.marker is not None and not any(requirement.marker.evaluate(environment) for environment in environments):
                continue
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
