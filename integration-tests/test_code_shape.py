"""The shape issue 28 asked of the production code, kept from sliding back.

Read from the sources (no import): every ``packages/*/src`` module.

- At most 8 functions over 80 lines, and none in dynsched-optimus over 120.
- No behaviour class takes more than 10 constructor parameters: settings go in frozen
  options records (frozen attrs classes are records and exempt), and per-call bookkeeping
  that always starts at zero is not a constructor parameter (``attrs.field(init=False)``).
  The one mutable record exempt is named below with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src/**/*.py"))

MAX_LONG_FUNCTIONS = 8
LONG_FUNCTION_LINES = 80
MAX_OPTIMUS_FUNCTION_LINES = 120
MAX_CONSTRUCTOR_PARAMETERS = 10

#: Mutable records with more fields than that, and why each is not a behaviour class.
RECORDS = {
    # the sans-I/O driver's checkpointed counters: every field has a default, and a
    # restored checkpoint sets any of them by keyword
    "DriverState": "dynsched_core/_decide.py",
}


def _modules() -> Iterator[tuple[Path, ast.Module]]:
    for path in SOURCES:
        yield path, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _decorators(cls: ast.ClassDef) -> list[str]:
    return [ast.unparse(d) for d in cls.decorator_list]


def _is_attrs(decorators: list[str]) -> bool:
    return any(
        d.startswith(("attrs.define", "attrs.frozen", "attr.s", "dataclass")) for d in decorators
    )


def _is_frozen(decorators: list[str]) -> bool:
    return any(d.startswith("attrs.frozen") or "frozen=True" in d for d in decorators)


def _init_fields(cls: ast.ClassDef) -> int:
    """Constructor parameters of an attrs/dataclass class: its annotated fields less the
    ``init=False`` ones and class variables."""
    n = 0
    for stmt in cls.body:
        if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
            continue
        if "ClassVar" in ast.unparse(stmt.annotation):
            continue
        value = stmt.value
        if isinstance(value, ast.Call) and any(
            kw.arg == "init" and isinstance(kw.value, ast.Constant) and kw.value.value is False
            for kw in value.keywords
        ):
            continue
        n += 1
    return n


def _init_parameters(cls: ast.ClassDef) -> int | None:
    """Parameters of a hand-written ``__init__`` (less ``self``), or None without one."""
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef) and stmt.name == "__init__":
            a = stmt.args
            return len(a.posonlyargs) + len(a.args) - 1 + len(a.kwonlyargs)
    return None


def _function_lengths() -> list[tuple[int, str]]:
    out = []
    for path, tree in _modules():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                out.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.lineno} {node.name}"))
    return out


def test_the_sources_are_found() -> None:
    assert len(SOURCES) > 100
    assert {p.relative_to(ROOT).parts[1] for p in SOURCES} >= {
        "dynsched-core",
        "dynsched-optimus",
        "dynsched-ray",
        "dynsched-sim",
    }


def test_few_functions_are_long() -> None:
    long = sorted(x for x in _function_lengths() if x[0] > LONG_FUNCTION_LINES)
    assert len(long) <= MAX_LONG_FUNCTIONS, "\n".join(f"{n} lines: {w}" for n, w in long)


def test_no_optimus_function_is_over_120_lines() -> None:
    over = [
        (n, w)
        for n, w in _function_lengths()
        if "dynsched-optimus" in w and n > MAX_OPTIMUS_FUNCTION_LINES
    ]
    assert not over, over


def _constructor_sizes() -> Iterator[tuple[str, str, int]]:
    for path, tree in _modules():
        rel = path.relative_to(ROOT).as_posix()
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            decorators = _decorators(node)
            explicit = _init_parameters(node)
            if explicit is not None:
                yield rel, node.name, explicit
            elif _is_attrs(decorators) and not _is_frozen(decorators):
                yield rel, node.name, _init_fields(node)


def test_no_behaviour_class_takes_more_than_ten_constructor_parameters() -> None:
    big = [
        f"{rel}: {name} takes {n}"
        for rel, name, n in _constructor_sizes()
        if n > MAX_CONSTRUCTOR_PARAMETERS and not rel.endswith(RECORDS.get(name, "\0"))
    ]
    assert not big, "\n".join(big)


def test_the_exempt_records_still_exist() -> None:
    found = {name: rel for rel, name, _ in _constructor_sizes()}
    for name, where in RECORDS.items():
        assert name in found and found[name].endswith(where), name


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "@attrs.define\nclass A:\n    x: int\n    y: int = attrs.field(default=0, init=False)\n",
            1,
        ),
        ("@attrs.define\nclass A:\n    x: ClassVar[int] = 1\n    y: int\n", 1),
        ("class A:\n    def __init__(self, a, b, *, c):\n        pass\n", 3),
    ],
)
def test_the_counter_counts_what_a_caller_passes(source: str, expected: int) -> None:
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)
    explicit = _init_parameters(cls)
    assert (explicit if explicit is not None else _init_fields(cls)) == expected
