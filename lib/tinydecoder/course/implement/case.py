"""One test case of an "implement it" exercise (see course/implement/__init__.py)."""
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    name: str
    hint: str
    run: Callable
