"""One test case of an "implement it" exercise (see lessons/implement/__init__.py)."""
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Case:
    name: str
    hint: str
    run: Callable
