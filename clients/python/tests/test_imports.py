"""No module imports, through others, a module that imports it: in this package (an import inside
a function counts too) and among the dashboard's script modules (``crates/allot-server/ui``). The
Rust crates have the same check (``crates/allot/tests/it/architecture.rs``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Dict, List, Set

from .conftest import REPO

PACKAGE = REPO / "clients" / "python" / "allot"
UI = REPO / "crates" / "allot-server" / "ui"


def python_imports(source: str, modules: Set[str]) -> Set[str]:
    """The modules of the package (names as in ``modules``) that ``source`` imports, anywhere in
    it: ``from .a import x``, ``from . import a``, ``import allot.a``, ``from allot.a import x``."""
    found: Set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level == 0:
                if module.split(".")[0] != "allot":
                    continue
                module = module[len("allot") :].lstrip(".")
            if module:
                found.add(module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "allot" and len(parts) > 1:
                    found.add(parts[1])
    return found & modules


def script_imports(source: str, modules: Set[str]) -> Set[str]:
    """The modules (file names) that a script module imports: ``import ... from "./a.js"``,
    ``import "./a.js"``, ``import("./a.js")``."""
    named = re.findall(r"""\bimport\b[^"'`;()]*?(?:\bfrom\s*)?["']([^"']+)["']|\bimport\s*\(\s*["']([^"']+)["']""", source)
    return {Path(a or b).name for a, b in named} & modules


def circles(edges: Dict[str, Set[str]]) -> List[str]:
    """Each module that reaches itself, with the way it does: ``a -> b -> a``."""
    found = []
    for start in sorted(edges):
        # Each module reached, from the one it was first reached from: a way back to `start`.
        came_from: Dict[str, str] = {}
        todo = [start]
        while todo and start not in came_from:
            module = todo.pop()
            for target in sorted(edges.get(module, ())):
                if target not in came_from:
                    came_from[target] = module
                    todo.append(target)
        if start in came_from:
            way = [start, came_from[start]]
            while way[-1] != start:
                way.append(came_from[way[-1]])
            found.append(" -> ".join(reversed(way)))
    return found


def test_no_module_of_the_package_imports_itself_through_others() -> None:
    files = {path.stem: path for path in PACKAGE.glob("*.py")}
    assert {"errors", "_codes", "_util", "_async"} <= set(files), "the package's modules are found"
    edges = {name: python_imports(path.read_text(), set(files)) - {name} for name, path in files.items()}
    assert "_error_bases" in edges["_codes"], "the reader sees what a module imports"
    assert circles(edges) == []


def test_no_script_of_the_dashboard_imports_itself_through_others() -> None:
    files = {path.name: path for path in UI.glob("*.js")}
    assert "app.js" in files
    edges = {name: script_imports(path.read_text(), set(files)) - {name} for name, path in files.items()}
    assert circles(edges) == []


def test_the_readers_see_every_kind_of_import_and_the_circle_between_errors_and_codes() -> None:
    modules = {"errors", "_codes", "models", "_util"}
    lazy = 'from .models import X\nfrom . import _util\ndef f():\n    from ._codes import ERRORS\nimport json\n'
    assert python_imports(lazy, modules) == {"models", "_util", "_codes"}
    assert python_imports("import allot.errors\nfrom allot._codes import X\n", modules) == {"errors", "_codes"}
    # The circle this package had: each of the two imported the other.
    assert circles({"errors": {"_codes"}, "_codes": {"errors"}, "_util": {"errors"}}) == [
        "_codes -> errors -> _codes",
        "errors -> _codes -> errors",
    ]
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}})[0] == "a -> b -> c -> a"
    scripts = {"app.js", "resources.js", "sse.js"}
    text = 'import { parseResources } from "./resources.js";\nimport "./sse.js";\nconst m = await import("./app.js");\n'
    assert script_imports(text, scripts) == scripts
