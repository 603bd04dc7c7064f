"""Each package's docstring says what it may import, on a `May import:` line, and that line is the
truth: the first-party modules the package's code imports (its subpackages' included, TYPE_CHECKING
imports too, as import-linter counts them) are exactly those the line names, no more and no fewer.
So the layering stated in prose cannot drift from the code; `lint-imports` checks the contracts.

The line's grammar: `May import: <item>, <item>, ...` ending at the first sentence end; an item is a
dotted module name (it covers its submodules) or `nothing`; parenthesised notes are ignored.
Example: "May import: pipeline.request, pipeline.loading (the tokenizer). Never scheduling."
-> {"pipeline.request", "pipeline.loading"}.
"""

from __future__ import annotations

import ast
import pathlib
import re

import grimp
import pytest

ROOTS = ("pipeline", "actors", "queue_adapters")
REPO = pathlib.Path(__file__).resolve().parents[1]
_GRAPH = grimp.build_graph(*ROOTS, include_external_packages=False, cache_dir=None)  # never a stale cache


def packages() -> list[str]:
    found = []
    for root in ROOTS:
        for init in sorted((REPO / root).rglob("__init__.py")):
            found.append(".".join(init.parent.relative_to(REPO).parts))
    return found


def stated_imports(docstring: str) -> set[str] | None:
    """The names on the docstring's `May import:` line; None when it has none."""
    match = re.search(r"May import:(.*)", docstring, re.S)
    if match is None:
        return None
    text = re.sub(r"\([^()]*\)", "", match[1])
    text = re.split(r"\.(?=\s|$)", text, maxsplit=1)[0]
    items = {" ".join(item.split()) for item in text.split(",")}
    return {item for item in items if item and item != "nothing"}


def real_imports(package: str) -> set[str]:
    """First-party modules outside `package` that modules inside it import."""
    inside = {package} | _GRAPH.find_descendants(package)
    imported = set().union(*(_GRAPH.find_modules_directly_imported_by(module) for module in inside))
    return imported - inside


def docstring_of(package: str) -> str:
    init = REPO.joinpath(*package.split("."), "__init__.py")
    return ast.get_docstring(ast.parse(init.read_text())) or ""


def _covers(item: str, module: str) -> bool:
    return module == item or module.startswith(item + ".")


@pytest.mark.parametrize("package", packages())
def test_package_docstring_states_exactly_what_it_imports(package):
    stated = stated_imports(docstring_of(package))
    assert stated is not None, f"{package}/__init__.py: the docstring has no 'May import:' line"
    imported = real_imports(package)
    unstated = sorted(module for module in imported if not any(_covers(item, module) for item in stated))
    unused = sorted(item for item in stated if not any(_covers(item, module) for module in imported))
    assert not unstated, f"{package} imports modules its docstring does not allow: {unstated}"
    assert not unused, f"{package}'s docstring allows imports it does not make: {unused}"


def test_stated_imports_grammar():
    docstring = "Intake.\n\nMay import: pipeline.request, pipeline.loading (the\ntokenizer). Never scheduling."
    assert stated_imports(docstring) == {"pipeline.request", "pipeline.loading"}
    assert stated_imports("Leaves.\n\nMay import: nothing.") == set()
    assert stated_imports("No line here.") is None
