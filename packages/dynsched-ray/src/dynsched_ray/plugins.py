"""Engines and trainers as plug-ins: the contracts and their two entry-point groups.

A rollout engine is an entry point of the group ``dynsched.engines``, a trainer one of
``dynsched.trainers``; both are read through core's one plug-in loader
(`dynsched_core.plugins.PluginGroup`), so they follow the rules of policies: discovery
once, only the plug-in asked for is imported, a name two distributions provide is refused
with both named, an unknown name is answered with the known names and the closest match.

An engine entry point names an `EnginePlugin`; a trainer entry point a `TrainerPlugin`.
A package adds one with no change to dynsched-ray::

    # pyproject.toml of the plug-in's distribution
    [project.entry-points."dynsched.engines"]
    echo = "my_engine:ENGINE"       # ENGINE = EnginePlugin(factory=EchoReplica, ...)

    [project.entry-points."dynsched.trainers"]
    sgd = "my_trainer:TRAINER"      # TRAINER = TrainerPlugin(factory=SGDTrainer)

and ``dynsched train --engine echo --trainer sgd`` then runs them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import attrs
from dynsched_core import ConfigError
from dynsched_core.errors import PluginError
from dynsched_core.plugins import PluginGroup

__all__ = [
    "ENGINES",
    "ENGINE_GROUP",
    "TRAINERS",
    "TRAINER_GROUP",
    "EngineLookupError",
    "EnginePlugin",
    "LazyFactory",
    "PluginKind",
    "RunContext",
    "TrainerLookupError",
    "TrainerPlugin",
    "engine_plugins",
    "trainer_options",
    "trainer_plugins",
]

ENGINE_GROUP = "dynsched.engines"
TRAINER_GROUP = "dynsched.trainers"


class EngineLookupError(PluginError):
    """An engine name is unknown, provided by two distributions, or fails to load."""


class TrainerLookupError(PluginError):
    """A trainer name is unknown, provided by two distributions, or fails to load."""


engine_plugins = PluginGroup(ENGINE_GROUP, kind="engine", error=EngineLookupError)
"""The installed engines (entry-point group ``dynsched.engines``)."""

trainer_plugins = PluginGroup(TRAINER_GROUP, kind="trainer", error=TrainerLookupError)
"""The installed trainers (entry-point group ``dynsched.trainers``)."""


def _module_attr(instance: Any, attribute: attrs.Attribute[Any], value: str) -> None:
    module, sep, attr = value.partition(":")
    if not (module and sep and attr):
        raise ValueError(
            f"LazyFactory.{attribute.name} must be 'module:attribute' "
            f"(e.g. 'my_engine.replica:EchoReplica'), got {value!r}"
        )


@attrs.frozen
class LazyFactory:
    """A class named by ``"module:attribute"``, imported on the first call.

    Picklable by name, so a factory sent to a Ray actor imports the engine or trainer (and
    its tensor library) only inside the actor, never in the driver.

    Example:
        >>> LazyFactory("fractions:Fraction")(1, 2)
        Fraction(1, 2)
    """

    target: str = attrs.field(validator=_module_attr)

    def resolve(self) -> Callable[..., Any]:
        """The class (or function) ``target`` names."""
        module, _, attr = self.target.partition(":")
        obj: Callable[..., Any] = getattr(importlib.import_module(module), attr)
        return obj

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.resolve()(*args, **kwargs)


@attrs.frozen(kw_only=True)
class RunContext:
    """What a training run tells an engine or trainer plug-in (`EnginePlugin.options`).

    Attributes:
        model: Folder of the model the run starts from (Hugging Face layout).
        temperature: Rollout sampling temperature.
        seed: Seed of the sampling and the trainer.
        device: ``cpu``, ``cuda`` or ``auto``.
        lr: Trainer learning rate.
    """

    model: str
    temperature: float = 1.0
    seed: int = 0
    device: str = "cpu"
    lr: float = 1e-3


def _no_options(run: RunContext) -> Mapping[str, Any]:
    return {}


def trainer_options(run: RunContext) -> Mapping[str, Any]:
    """The built-in trainers' keyword arguments: ``options=TrainerOptions(lr, device)``."""
    from dynsched_ray.trainers.base import TrainerOptions

    return {"options": TrainerOptions(lr=run.lr, device=run.device)}


def _callable(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not callable(value):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be callable (a class, a "
            f"function or a LazyFactory), got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True)
class EnginePlugin:
    """What an entry point of ``dynsched.engines`` names.

    Attributes:
        factory: Builds one replica inside its actor:
            ``factory(replica_id, *, role, num_gpus, **options(run))`` returning a core
            ``RolloutReplica`` (a class, or a `LazyFactory` to import it in the actor).
        options: The factory's keyword arguments for a run (``options(run) -> mapping``).
        description: One line for listings.
    """

    factory: Callable[..., Any] = attrs.field(validator=_callable)
    options: Callable[[RunContext], Mapping[str, Any]] = attrs.field(
        default=_no_options, validator=_callable
    )
    description: str = ""


@attrs.frozen(kw_only=True)
class TrainerPlugin:
    """What an entry point of ``dynsched.trainers`` names.

    Attributes:
        factory: Builds the trainer inside each trainer actor:
            ``factory(model_dir, **options(run))`` returning a core ``Trainer``.
        options: The factory's keyword arguments for a run (default: the built-in
            trainers' ``options=TrainerOptions(lr=..., device=...)``).
        description: One line for listings.
    """

    factory: Callable[..., Any] = attrs.field(validator=_callable)
    options: Callable[[RunContext], Mapping[str, Any]] = attrs.field(
        default=trainer_options, validator=_callable
    )
    description: str = ""


T = TypeVar("T")


@attrs.frozen
class PluginKind(Generic[T]):
    """One plug-in kind: its entry-point group and the record its entry points name.

    Attributes:
        group: The entry-point group, read through core's loader.
        record: What every entry point must name (`EnginePlugin`, `TrainerPlugin`).
    """

    group: PluginGroup
    record: type[T]

    def names(self) -> list[str]:
        """The installed names, sorted (nothing imported)."""
        return self.group.names()

    def load(self, name: str) -> T:
        """The plug-in ``name``.

        Raises:
            PluginError: (the group's error type) unknown, with the known names and the
                closest match; provided by two distributions; failing to import; or not
                naming a ``record``.
        """
        plugin = self.group.load(name)
        if not isinstance(plugin, self.record):
            raise self.group.error(
                f"{self.group.kind} {name!r} ({self.group.get(name).value}) must name a "
                f"{self.record.__name__}, got {type(plugin).__name__}"
            )
        return plugin

    def check(self, name: str, *, key: str, where: str | None = None) -> None:
        """Refuse a name the group does not know (or two distributions provide).

        Nothing is imported. The `ConfigError` carries ``key``; its message, prefixed with
        ``where`` (default ``key``), is the loader's: the known names and the closest
        match, or both providers.
        """
        try:
            self.group.get(name)
        except PluginError as exc:
            raise ConfigError(f"{where or key}: {exc}", key=key) from exc


ENGINES: PluginKind[EnginePlugin] = PluginKind(engine_plugins, EnginePlugin)
"""The engine plug-ins: ``ENGINES.load("vllm")``, ``ENGINES.names()``."""

TRAINERS: PluginKind[TrainerPlugin] = PluginKind(trainer_plugins, TrainerPlugin)
"""The trainer plug-ins: ``TRAINERS.load("torch")``, ``TRAINERS.names()``."""
