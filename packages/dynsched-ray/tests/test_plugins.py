"""Engines and trainers as plug-ins: the built-in entry points and the contracts' rules."""

from __future__ import annotations

import pickle
import sys
from importlib import metadata
from pathlib import Path

import attrs
import pytest
from dynsched_core import ConfigError
from dynsched_core.plugins import Plugin, PluginGroup
from dynsched_ray.engines import EngineLookupError, engine_names, load_engine
from dynsched_ray.plugins import (
    ENGINES,
    EnginePlugin,
    LazyFactory,
    PluginKind,
    RunContext,
    TrainerPlugin,
)
from dynsched_ray.trainers import TrainerLookupError, load_trainer, trainer_names
from dynsched_ray.training import TrainSettings
from hypothesis import given
from hypothesis import strategies as st


def test_built_in_engines_and_trainers_are_entry_points() -> None:
    assert {"hf", "vllm"} <= set(engine_names())
    assert {"megatron", "torch"} <= set(trainer_names())
    from dynsched_ray.engines.hf import HFReplica
    from dynsched_ray.engines.vllm import VLLMReplica

    assert load_engine("hf").factory is HFReplica
    assert load_engine("vllm").factory is VLLMReplica
    assert load_trainer("torch").factory == LazyFactory(
        "dynsched_ray.trainers.torch.trainer:TorchTrainer"
    )
    assert load_trainer("megatron").factory == LazyFactory(
        "dynsched_ray.trainers.megatron.trainer:MegatronTrainer"
    )


def test_engine_options_for_a_run() -> None:
    run = RunContext(model="/m", temperature=0.5, seed=3, device="cpu", lr=0.1)
    assert dict(load_engine("hf").options(run)) == {
        "model": "/m",
        "temperature": 0.5,
        "seed": 3,
        "device": "cpu",
    }
    assert dict(load_engine("vllm").options(run)) == {
        "model": "/m",
        "sampling": {"temperature": 0.5},
        "seed": 3,
    }
    import torch  # noqa: F401  (the test environment installs the torch extra)

    (options,) = load_trainer("torch").options(run).values()
    assert (options.lr, options.device) == (0.1, "cpu")


def test_unknown_names_get_the_loaders_message() -> None:
    with pytest.raises(EngineLookupError, match=r"unknown engine 'vlm'\. Did you mean 'vllm'\?"):
        load_engine("vlm")
    with pytest.raises(TrainerLookupError, match=r"Did you mean 'torch'\?.*dynsched\.trainers"):
        load_trainer("troch")
    with pytest.raises(ConfigError, match=r"TrainSettings.engine: unknown engine 'sglang'") as e:
        TrainSettings(engine="sglang")
    assert e.value.key == "engine"
    with pytest.raises(ConfigError, match=r"TrainSettings.trainer must be a trainer name"):
        TrainSettings(trainer=3)  # type: ignore[arg-type]


@given(st.text(min_size=1, max_size=12))
def test_any_name_is_either_installed_or_refused_listing_the_installed(name: str) -> None:
    known = engine_names()
    if name in known:
        ENGINES.check(name, key="engine")
        return
    with pytest.raises(ConfigError) as exc:
        ENGINES.check(name, key="engine")
    assert f"Available: {known}" in str(exc.value)


def _group(value: str) -> PluginGroup:
    """A group with one fake entry point ``fake`` pointing at ``value``."""
    group = PluginGroup("dynsched.test_fake", kind="engine", error=EngineLookupError)
    ep = metadata.EntryPoint("fake", value, "dynsched.test_fake")
    group._found = {"fake": [Plugin("fake", value, "fake-dist", ep)]}
    return group


def test_an_entry_point_naming_something_else_is_refused() -> None:
    group = _group("dynsched_ray.plugins:RunContext")
    with pytest.raises(EngineLookupError, match=r"must name a EnginePlugin, got type"):
        PluginKind(group, EnginePlugin).load("fake")
    with pytest.raises(EngineLookupError, match=r"fake-dist.*failed to import"):
        PluginKind(_group("no_such_module_xyz:ENGINE"), EnginePlugin).load("fake")


def test_plugin_records_check_their_fields() -> None:
    with pytest.raises(TypeError, match=r"EnginePlugin.factory must be callable"):
        EnginePlugin(factory="HFReplica")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TrainerPlugin.options must be callable"):
        TrainerPlugin(factory=dict, options={"lr": 1})  # type: ignore[arg-type]
    plugin = EnginePlugin(factory=dict)
    assert plugin.options(RunContext(model="m")) == {}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        plugin.description = "x"  # type: ignore[misc]


@pytest.mark.parametrize("target", ["fractions.Fraction", ":Fraction", "fractions:", ""])
def test_lazy_factory_needs_module_and_attribute(target: str) -> None:
    with pytest.raises(ValueError, match=r"LazyFactory.target must be 'module:attribute'"):
        LazyFactory(target)


def test_lazy_factory_imports_on_call_and_pickles_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "lazy_target_h4.py").write_text(
        "class Thing:\n    def __init__(self, n):\n        self.n = n\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "lazy_target_h4", raising=False)
    factory = LazyFactory("lazy_target_h4:Thing")
    copy = pickle.loads(pickle.dumps(factory))
    assert copy == factory
    assert "lazy_target_h4" not in sys.modules  # nothing imported before the call
    thing = copy(7)
    assert type(thing).__name__ == "Thing" and thing.n == 7
    assert "lazy_target_h4" in sys.modules
