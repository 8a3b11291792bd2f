"""The public API's names: no parameter shadows a Python builtin, and the synchronous and
asynchronous clients offer the same operations under the same names and parameters."""

from __future__ import annotations

import builtins
import inspect
from typing import Any, Iterator, List, Tuple

import allot
import allot.plugin

#: Builtins that are also ordinary words of the API's JSON and stay allowed: none.
BUILTINS = {name for name in dir(builtins) if not name.startswith("_")}


def public_callables() -> Iterator[Tuple[str, Any]]:
    """Every public function and method of the package (the generated ``models`` are the wire's
    field names, not parameters people type)."""
    for module in (allot, allot.plugin):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.isclass(value):
                for member, function in inspect.getmembers(value, callable):
                    if not member.startswith("_") or member == "__init__":
                        yield f"{module.__name__}.{name}.{member}", function
            elif callable(value):
                yield f"{module.__name__}.{name}", value


def parameters(function: Any) -> List[str]:
    try:
        return list(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return []


def test_no_public_parameter_shadows_a_builtin() -> None:
    checked = list(public_callables())
    assert any(name == "allot.Client.accept" for name, _ in checked), "the clients' methods are checked"
    shadowing = [
        f"{name}({parameter})" for name, function in checked for parameter in parameters(function) if parameter in BUILTINS
    ]
    assert shadowing == [], f"parameters named like builtins: {shadowing}"


def test_the_check_finds_a_builtin_name() -> None:
    def bad(id: str, max: int) -> None:  # noqa: A002 - on purpose
        pass

    assert [p for p in parameters(bad) if p in BUILTINS] == ["id", "max"]


def test_the_sync_and_async_clients_name_their_operations_alike() -> None:
    def operations(cls: type) -> dict[str, List[str]]:
        return {
            name: parameters(function)
            for name, function in inspect.getmembers(cls, callable)
            if not name.startswith("_")
        }

    assert operations(allot.Client) == operations(allot.AsyncClient)
