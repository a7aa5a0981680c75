"""Which modules the training needs: a script's imports (read with ast), or what a function
reaches (its globals, closure and defaults, the functions and classes it uses, the
modules it imports in its body, the types of its arguments).

Functions and classes of modules that no installed package provides (the notebook's
``__main__``, a ``.py`` file beside it) are looked into, as they travel by value; of
anything else only the module is noted.
"""

from __future__ import annotations

import ast
import dis
import functools
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import BuiltinFunctionType, CodeType, FunctionType, MethodType, ModuleType
from typing import Any

# A big container holds data of a few kinds: its first items show which modules it needs.
_ITEMS_LOOKED_AT = 1000


def top_level(module: str) -> str:
    return module.partition(".")[0]


def is_standard(module: str) -> bool:
    return top_level(module) in sys.stdlib_module_names or module == "builtins"


def script_imports(source: str, filename: str) -> set[str]:
    """The top-level modules a script imports anywhere (relative imports left out).

    SyntaxError for a script that does not parse.
    """
    modules: set[str] = set()
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            modules.update(top_level(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(top_level(node.module))
    return modules


@dataclass
class Reach:
    """What a function and its arguments reach: ``modules`` (top-level names), and
    ``local`` (those of them that no installed package provides)."""

    modules: set[str] = field(default_factory=set)
    local: set[str] = field(default_factory=set)


def function_reach(fn: Callable[..., Any], values: Iterable[Any],
                   is_installed: Callable[[str], bool]) -> Reach:
    """The modules ``fn`` and ``values`` (its arguments) reach. ``is_installed(top)`` says
    whether a top-level module comes from an installed package (so it travels by name)."""
    walker = _Walker(is_installed)
    walker.walk([fn, *values])
    return walker.reach


class _Walker:
    def __init__(self, is_installed: Callable[[str], bool]) -> None:
        self.is_installed = is_installed
        self.reach = Reach()
        self.seen: set[int] = set()

    def walk(self, start: list[Any]) -> None:
        stack = list(start)
        while stack:
            value = stack.pop()
            if id(value) in self.seen:
                continue
            self.seen.add(id(value))
            stack.extend(self._inside(value))

    def _note(self, module: str | None) -> bool:
        """Note the module; whether what it defines travels by value (so is looked into):
        so does what was defined outside any module (``exec``)."""
        if module is None:
            return True
        if is_standard(module):
            return False
        top = top_level(module)
        self.reach.modules.add(top)
        if top == "__main__" or not self.is_installed(top):
            self.reach.local.add(top)
            return True
        return False

    def _inside(self, value: Any) -> Iterator[Any]:
        """What ``value`` holds that needs looking at too."""
        if isinstance(value, ModuleType):
            self._note(value.__name__)
        elif isinstance(value, FunctionType):
            if self._note(value.__module__):
                yield from _function_parts(value, self._note)
        elif isinstance(value, type):
            if self._note(value.__module__):
                yield from (*vars(value).values(), *value.__bases__)
        elif isinstance(value, BuiltinFunctionType):  # torch.tanh: named by its module
            self._note(value.__module__)
        elif isinstance(value, MethodType):
            yield from (value.__func__, value.__self__)
        elif isinstance(value, staticmethod | classmethod):
            yield value.__func__
        elif isinstance(value, property):
            yield from (value.fget, value.fset, value.fdel)
        elif isinstance(value, functools.partial):
            yield from (value.func, *value.args, *value.keywords.values())
        elif isinstance(value, dict):
            yield from itertools.islice(itertools.chain.from_iterable(value.items()),
                                        2 * _ITEMS_LOOKED_AT)
        elif isinstance(value, list | tuple | set | frozenset):
            yield from itertools.islice(value, _ITEMS_LOOKED_AT)
        elif value is not None and not isinstance(value, str | bytes | int | float | bool):
            yield type(value)
            yield from getattr(value, "__dict__", {}).values()


def _function_parts(fn: FunctionType, note: Callable[[str], bool]) -> Iterator[Any]:
    """The globals ``fn`` names, its closure and defaults; notes the modules its body
    imports."""
    for code in _code_objects(fn.__code__):
        for instruction in dis.get_instructions(code):
            if instruction.opname == "IMPORT_NAME" and instruction.argval:
                note(str(instruction.argval))
        yield from (fn.__globals__[name] for name in code.co_names
                    if name in fn.__globals__)
    for cell in fn.__closure__ or ():
        try:
            yield cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue
    yield from fn.__defaults__ or ()
    yield from (fn.__kwdefaults__ or {}).values()


def _code_objects(code: CodeType) -> Iterator[CodeType]:
    """``code`` and the code nested in it (inner functions, comprehensions, lambdas)."""
    yield code
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            yield from _code_objects(constant)

