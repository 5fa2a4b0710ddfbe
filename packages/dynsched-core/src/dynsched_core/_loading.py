"""Reading config and scenario files without trusting them: one loader for every command.

Every ``dynsched`` command that reads a YAML, JSON or TOML file (``run``/``train``
configs, ``simulate`` scenarios) reads it through `read_config_file`, and every
configuration mapping handed to `DynamicScheduleConfig.from_dict` is checked by
`check_tree`, so a hostile or mistaken file is refused cheaply, in one line, before
anything expands it:

- the file is at most `LoadLimits.max_bytes` (1 MiB) long;
- YAML is *composed* first (a node graph, in which an alias is a reference to its anchor,
  never a copy) with the nesting depth counted as it is built, then the graph's *expanded*
  size (every alias counted as often as it is used) and depth are computed by a walk that
  visits each node once: a 790-byte file of nested anchors ("billion laughs") is refused
  in milliseconds, before a value is built;
- integers are at most `LoadLimits.max_int_digits` digits long (Python's own limit on
  int conversion, 4,300 digits, would otherwise end in a traceback deep inside the parser;
  a 400-digit one in an ``OverflowError`` later);
- a self-referencing structure (``&a [*a]``) is refused.

The module is stdlib-only; PyYAML (the ``dynsched-core[yaml]`` extra) is imported only
when a YAML file is read.

Example:
    >>> parse_yaml("a: {b: 1}")
    {'a': {'b': 1}}
    >>> parse_yaml("a: " + "[" * 100 + "]" * 100)
    Traceback (most recent call last):
    ...
    dynsched_core._errors.ConfigError: nested deeper than 64 levels (line 1); a config may nest at most 64 mappings/lists
"""

from __future__ import annotations

import functools
import json
import os
import re
import tomllib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from dynsched_core._errors import ConfigError

__all__ = ["LoadLimits", "check_tree", "parse_yaml", "read_config_file"]

#: Largest config or scenario file read (bytes). A verl config is a few KiB.
MAX_FILE_BYTES = 1 << 20
#: Most values (mappings, lists, scalars, keys included) a config may expand to, aliases
#: counted as often as they are used. verl's full ``ppo_trainer.yaml`` has about 1,500.
MAX_NODES = 100_000
#: Deepest nesting of mappings and lists (verl's configs nest 5 levels).
MAX_DEPTH = 64
#: Longest integer, in digits (an int64 has 19; a seed of 2**64 has 20).
MAX_INT_DIGITS = 30


@attrs.frozen(kw_only=True)
class LoadLimits:
    """What a config or scenario file may hold.

    Attributes:
        max_bytes: File size in bytes.
        max_nodes: Values after expanding YAML aliases (keys, scalars, mappings, lists).
        max_depth: Nesting depth of mappings and lists.
        max_int_digits: Digits of an integer.
    """

    max_bytes: int = MAX_FILE_BYTES
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    max_int_digits: int = MAX_INT_DIGITS


DEFAULT_LIMITS = LoadLimits()


def read_config_file(path: str | os.PathLike[str], *, limits: LoadLimits = DEFAULT_LIMITS) -> Any:
    """Read a YAML (``.yaml``, ``.yml``, anything else), JSON (``.json``) or TOML (``.toml``) file.

    Returns:
        The parsed value (None for an empty YAML file).

    Raises:
        ConfigError: the file is too large, is not text, does not parse (``YAML syntax
            error at line L, column C: ...``), or breaks a limit (the message names the key
            and the limit). The message does not repeat the path: the caller adds it with
            the flag it came from.
        OSError: the file cannot be opened or read (``FileNotFoundError`` ...).
    """
    name = os.fspath(path)
    with open(name, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        raw = fh.read(limits.max_bytes + 1)
    if size > limits.max_bytes or len(raw) > limits.max_bytes:
        raise ConfigError(
            f"the file is {max(size, len(raw)):,} bytes; a config or scenario file may be at "
            f"most {limits.max_bytes:,} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not a text file ({exc.reason})") from None
    suffix = os.path.splitext(name)[1].lower()
    if suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"TOML syntax error: {exc}") from None
        except (ValueError, RecursionError) as exc:  # huge int, deep nesting
            raise ConfigError(f"cannot read the TOML: {_short(exc)}") from None
        check_tree(data, limits=limits)
        return data
    if suffix == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            ) from None
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"cannot read the JSON: {_short(exc)}") from None
        check_tree(data, limits=limits)
        return data
    return parse_yaml(text, limits=limits)


def parse_yaml(text: str, *, limits: LoadLimits = DEFAULT_LIMITS) -> Any:
    """Parse one YAML document within ``limits`` (the value, or None when empty).

    Raises:
        ConfigError: a syntax error (line and column) or a broken limit (the key named).
    """
    import yaml

    if len(text) > limits.max_bytes:
        raise ConfigError(f"the text is {len(text):,} characters; at most {limits.max_bytes:,}")
    _check_flow_depth(text, limits)
    try:
        # the reader checks the characters here (e.g. a NUL byte raises ReaderError)
        loader = _guarded_loader_class()(text)
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(exc)) from None
    loader.limits = limits
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise ConfigError(
                f"nested too deeply to read; at most {limits.max_depth} levels"
            ) from None
        if node is None:
            return None
        _check_graph(node, limits)
        try:
            return loader.construct_document(node)
        except (ValueError, OverflowError, RecursionError) as exc:
            raise ConfigError(f"cannot read a value: {_short(exc)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(yaml_error_line(exc)) from None
    finally:
        loader.dispose()


def yaml_error_line(exc: BaseException) -> str:
    """``YAML syntax error at line L, column C: <problem>`` for a PyYAML error."""
    where = getattr(exc, "problem_mark", None)
    at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
    problem = getattr(exc, "problem", None)
    if problem is None and type(exc).__name__ == "ReaderError":
        # "unacceptable character #x0000: special characters are not allowed", one line
        position = getattr(exc, "position", None)
        at = f" at character {position}" if position is not None else ""
        problem = f"{str(exc).splitlines()[0]}"
    problem = problem or type(exc).__name__
    kind = "YAML error" if type(exc).__name__ == "ConstructorError" else "YAML syntax error"
    return f"{kind}{at}: {problem}"


def check_tree(data: Any, *, limits: LoadLimits = DEFAULT_LIMITS) -> None:
    """Check an already-built value (from JSON, TOML or a caller) against ``limits``.

    Shared sub-structures count as often as they are used (what expanding them would
    build), each is visited once; a structure that contains itself is refused.

    Raises:
        ConfigError: too many values, too deep, an integer too long, or a cycle (the key
            named).
    """

    def is_leaf(value: Any, path: str) -> bool:
        if isinstance(value, int) and not isinstance(value, bool):
            _check_int_value(value, path, limits)
        return not isinstance(value, Mapping | list | tuple)

    def children(value: Any, path: str) -> Iterator[tuple[str, tuple[Any, ...]]]:
        items = value.items() if isinstance(value, Mapping) else enumerate(value)
        for k, v in items:
            # a key counts as one value (None: a leaf) and is not checked itself
            yield _join(path, k if isinstance(value, Mapping) else f"[{k}]"), (None, v)

    _measure(data, limits, is_leaf, children, ("the config", "contains itself"))


# ------------------------------------------------------------------------------ internals
def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _join(path: str, key: Any) -> str:
    k = str(key)
    if len(k) > 60:
        k = k[:57] + "..."
    if k.startswith("["):
        return f"{path}{k}"
    return f"{path}.{k}" if path else k


def _too_deep(path: str, limits: LoadLimits) -> ConfigError:
    where = f" (at {path})" if path else ""
    return ConfigError(
        f"nested deeper than {limits.max_depth} levels{where}; a config may nest at most "
        f"{limits.max_depth} mappings/lists",
        key=path or None,
    )


def _too_big(path: str, limits: LoadLimits) -> ConfigError:
    return ConfigError(
        f"expands to more than {limits.max_nodes:,} values (at {path}; YAML aliases count "
        f"each time they are used); a config may hold at most {limits.max_nodes:,}",
        key=path or None,
    )


def _check_int_value(value: int, path: str, limits: LoadLimits) -> None:
    # compared, never converted to decimal (converting a huge number can itself raise)
    if abs(value) >= 10**limits.max_int_digits:
        raise _huge_int(path, f"{limits.max_int_digits + 1}+ digit", limits)


def _huge_int(path: str, size: str, limits: LoadLimits) -> ConfigError:
    where = path or "a value"
    return ConfigError(
        f"{where}: a {size} integer; integers may have at most {limits.max_int_digits} digits",
        key=path or None,
    )


_INT_TAG = "tag:yaml.org,2002:int"
_BRACKETS = re.compile(r"[\[\]{}]")


def _check_flow_depth(text: str, limits: LoadLimits) -> None:
    """Refuse deeply nested flow collections (``[[[[...``) before PyYAML scans them.

    PyYAML's scanner keeps every open ``[``/``{`` as a possible simple key and rescans
    them all for each new token (quadratic: 1.6 s for 1,000 levels on a loaded machine)
    before the composer sees the first one. Brackets inside quoted strings are counted
    too: only a text with more than ``max_depth`` of them unclosed is refused.
    """
    depth = 0
    for m in _BRACKETS.finditer(text):
        if m.group() in "[{":
            depth += 1
            if depth > limits.max_depth:
                line = text.count("\n", 0, m.start()) + 1
                raise ConfigError(
                    f"nested deeper than {limits.max_depth} levels (line {line}); a config "
                    f"may nest at most {limits.max_depth} mappings/lists"
                )
        elif depth:
            depth -= 1


def _check_graph(root: Any, limits: LoadLimits) -> None:
    """Expanded size and depth of a composed YAML node graph, each node visited once."""
    import yaml

    def is_leaf(node: Any, path: str) -> bool:
        if not isinstance(node, yaml.ScalarNode):
            return False
        if node.tag == _INT_TAG:
            digits = len(node.value.lstrip("+-").replace("_", ""))
            if digits > limits.max_int_digits:
                raise _huge_int(path, f"{digits}-digit", limits)
        return True

    def children(node: Any, path: str) -> Iterator[tuple[str, tuple[Any, ...]]]:
        if isinstance(node, yaml.MappingNode):
            for i, (k, v) in enumerate(node.value):
                label = k.value if isinstance(k, yaml.ScalarNode) else f"[{i}]"
                yield _join(path, label), (k, v)
        else:
            for i, child in enumerate(node.value):
                yield _join(path, f"[{i}]"), (child,)

    cycle = "refers to itself (a YAML alias inside its own anchor)"
    _measure(root, limits, is_leaf, children, ("the document", cycle))


def _measure(
    root: Any,
    limits: LoadLimits,
    is_leaf: Callable[[Any, str], bool],
    children: Callable[[Any, str], Iterator[tuple[str, tuple[Any, ...]]]],
    cycle: tuple[str, str],
) -> None:
    """Expanded size and depth of a value graph, each shared part visited once.

    ``is_leaf`` checks a leaf and says whether it is one; ``children`` yields each entry's
    path and the nodes it counts (its value last: the depth follows the value).
    ``cycle`` is (what the root is called, how a self-containing part is described).

    Raises:
        ConfigError: too many values, too deep, or a part that contains itself.
    """
    memo: dict[int, tuple[int, int]] = {}
    active: set[int] = set()

    def walk(node: Any, path: str, depth: int) -> tuple[int, int]:
        if is_leaf(node, path):
            return 1, 0
        key = id(node)
        if key in memo:
            return memo[key]
        if key in active:
            raise ConfigError(f"{path or cycle[0]} {cycle[1]}", key=path or None)
        if depth >= limits.max_depth:
            raise _too_deep(path, limits)
        active.add(key)
        size, height = 1, 0
        for sub, nodes in children(node, path):
            for child in nodes:
                n, h = walk(child, sub, depth + 1)
                size += n
            height = max(height, h + 1)
            if size > limits.max_nodes:
                raise _too_big(sub, limits)
        active.discard(key)
        memo[key] = (size, height)
        return size, height

    walk(root, "", 0)


@functools.cache
def _guarded_loader_class() -> type:
    """A `yaml.SafeLoader` that counts the nesting depth while composing."""
    import yaml

    class GuardedLoader(yaml.SafeLoader):  # type: ignore[misc]
        limits: LoadLimits = DEFAULT_LIMITS
        _depth = 0

        def compose_node(self, parent: Any, index: Any) -> Any:
            self._depth += 1
            try:
                if self._depth > self.limits.max_depth + 1:
                    mark = self.peek_event().start_mark
                    raise ConfigError(
                        f"nested deeper than {self.limits.max_depth} levels (line "
                        f"{mark.line + 1}, column {mark.column + 1}); a config may nest at "
                        f"most {self.limits.max_depth} mappings/lists"
                    )
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

    return GuardedLoader
