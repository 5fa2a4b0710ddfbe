"""Scenario files: one cluster, one workload, several configurations to compare.

A scenario is a YAML (``.yaml``/``.yml``) or TOML (``.toml``) file validated into frozen
attrs classes. Unknown keys and bad values fail with `ScenarioError` naming the full key
path (``engine.decode_base_s``) and what is allowed. Built-in scenarios ship in
``dynsched_sim/scenarios/`` and are loaded by name (`load_scenario("seed-qwen35")`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
from dynsched_core import ConfigError, DynamicScheduleConfig

from dynsched_sim._models import EngineModel, HardwareModel, LLMModel, TrainerModel
from dynsched_sim._workload import LengthDistribution, WorkloadModel

__all__ = [
    "PROVENANCE_LABELS",
    "Configuration",
    "Scenario",
    "ScenarioError",
    "builtin_scenarios",
    "load_scenario",
    "scenario_from_dict",
    "scenario_to_dict",
    "static_splits",
]

PROVENANCE_LABELS = ("published", "public config", "judgement", "fitted")

#: Most training micro-steps a scenario (or ``--steps``) may run: the published runs have
#: 120; a million virtual steps already take hours of CPU.
MAX_STEPS = 1_000_000
#: Most workload seeds per configuration (``seeds`` / ``--seeds``).
MAX_SEEDS = 10_000
#: Largest workload seed (numpy seeds are 32-bit words).
MAX_SEED = 2**32 - 1 - MAX_SEEDS
"""Where a scenario parameter comes from: the published document, a public configuration
(the authors' scripts, model cards, hardware data sheets), an engineering judgement, or a
fit by `dynsched_sim.calibrate` (only the two rates the static runs identify)."""


class ScenarioError(ValueError):
    """A scenario file or mapping is invalid; the message names the key."""


@attrs.frozen(kw_only=True)
class Configuration:
    """One way of splitting the cluster.

    Attributes:
        name: Name shown in tables and ``result.json`` (e.g. ``static-16-16``).
        trainer_gpus: GPUs of the trainer pool (>= 1).
        rollout_gpus: GPUs of the standalone rollout pool (>= 0).
        hybrid: True to run hybrid replicas on the trainer GPUs (dynamic scheduling);
            False for a static split (no hybrid replicas; run once with
            ``static_fully_async``).
    """

    name: str
    trainer_gpus: int
    rollout_gpus: int
    hybrid: bool = False

    @property
    def total_gpus(self) -> int:
        """``trainer_gpus + rollout_gpus``."""
        return self.trainer_gpus + self.rollout_gpus


@attrs.frozen(kw_only=True)
class Scenario:
    """A complete simulation scenario.

    Attributes:
        name: Scenario name.
        description: One paragraph.
        seed: Default seed (workload draw).
        steps: Trainer micro-steps to run.
        hardware: GPUs and links.
        model: The model trained and served.
        engine: Inference engine cost model.
        trainer: Trainer cost model.
        workload: Prompts and response lengths.
        schedule: Flat `dynsched_core.DynamicScheduleConfig` keys (verl names:
            ``staleness_threshold``, ``trigger_parameter_sync_step``,
            ``ppo_mini_batch_size``, ...). Node counts, ``n``, tensor parallel size and
            ``use_dynamic_resource_scheduling`` are filled in per configuration.
        configurations: The splits to compare.
        published: Optional published wall-clock seconds per configuration name.
        seeds: Workload seeds run per configuration by default (``seed``, ``seed + 1``,
            ...); results are reported as mean and spread over them.
        provenance: ``parameter path -> "label: source"`` with the label one of
            `PROVENANCE_LABELS` (e.g. ``"engine.max_num_seqs": "public config: ..."``).
            A label on a section or distribution (``workload.response_len``) covers its
            fields.
    """

    name: str
    description: str = ""
    seed: int = 0
    steps: int
    hardware: HardwareModel = attrs.field(factory=HardwareModel)
    model: LLMModel = attrs.field(factory=LLMModel)
    engine: EngineModel = attrs.field(factory=EngineModel)
    trainer: TrainerModel = attrs.field(factory=TrainerModel)
    workload: WorkloadModel = attrs.field(factory=WorkloadModel)
    schedule: Mapping[str, Any] = attrs.field(factory=dict)
    configurations: tuple[Configuration, ...] = ()
    published: Mapping[str, float] = attrs.field(factory=dict)
    seeds: int = 1
    provenance: Mapping[str, str] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        # the trainer's communication costs read this scenario's model and links
        object.__setattr__(self, "trainer", self.trainer.bind(self.hardware, self.model))

    def configuration(self, name: str) -> Configuration:
        """The configuration called ``name``.

        Raises:
            ScenarioError: unknown name (lists the known ones).
        """
        for c in self.configurations:
            if c.name == name:
                return c
        raise ScenarioError(
            f"scenario {self.name!r} has no configuration {name!r}; "
            f"known: {[c.name for c in self.configurations]}"
        )

    def schedule_config(
        self, conf: Configuration, policy: str | None = None
    ) -> DynamicScheduleConfig:
        """The core's `DynamicScheduleConfig` of ``conf`` (validated by the core).

        ``policy``: the ``dynamic_schedule_policy`` to run (default: the scenario's).
        """
        flat = dict(self.schedule)
        if policy is not None:
            flat["dynamic_schedule_policy"] = policy
        flat.update(
            use_dynamic_resource_scheduling=conf.hybrid,
            n=self.workload.n,
            rollout_tensor_parallel_size=self.engine.gpus_per_replica,
            trainer_nnodes=1,
            trainer_n_gpus_per_node=conf.trainer_gpus,
            rollout_nnodes=1 if conf.rollout_gpus else 0,
            rollout_n_gpus_per_node=conf.rollout_gpus,
            total_training_steps=self.steps,
        )
        try:
            return DynamicScheduleConfig.from_dict(flat)
        except ConfigError as e:
            raise ScenarioError(f"scenario {self.name!r}, configuration {conf.name!r}: {e}") from e

    def with_steps(self, steps: int) -> Scenario:
        """A copy running ``steps`` micro-steps (shortened variants for tests)."""
        return attrs.evolve(self, steps=steps)

    def with_values(self, **changes: Mapping[str, Any]) -> Scenario:
        """A copy with section fields replaced, e.g. ``with_values(engine={"wake_overhead_s": 5})``
        (``schedule`` entries are merged)."""
        kw: dict[str, Any] = {}
        for section, values in changes.items():
            if section == "schedule":
                kw["schedule"] = {**self.schedule, **values}
            elif section in _SECTIONS:
                kw[section] = attrs.evolve(getattr(self, section), **values)
            else:
                raise ScenarioError(
                    f"with_values: unknown section {section!r}; allowed: "
                    f"{sorted([*_SECTIONS, 'schedule'])}"
                )
        return attrs.evolve(self, **kw)

    def label_of(self, path: str) -> tuple[str, str] | None:
        """``(label, source)`` of a parameter path, from the closest labelled prefix."""
        parts = path.split(".")
        for i in range(len(parts), 0, -1):
            text = self.provenance.get(".".join(parts[:i]))
            if text is not None:
                label, _, source = text.partition(":")
                return label.strip(), source.strip()
        return None

    def parameter_paths(self) -> list[str]:
        """Every parameter of the scenario (model sections, distributions, schedule, run)."""
        out = ["steps", "seed", "seeds"]
        for section, cls in _SECTIONS.items():
            for f in _parameters(cls):
                value = getattr(getattr(self, section), f.name)
                if isinstance(value, LengthDistribution):
                    out += [
                        f"{section}.{f.name}.{g.name}" for g in attrs.fields(LengthDistribution)
                    ]
                else:
                    out.append(f"{section}.{f.name}")
        out += [f"schedule.{k}" for k in self.schedule]
        return out

    def unlabelled(self) -> list[str]:
        """Parameters without a provenance label."""
        return [p for p in self.parameter_paths() if self.label_of(p) is None]

    def fitted(self) -> list[str]:
        """Parameters labelled ``fitted``."""
        return [p for p in self.parameter_paths() if (self.label_of(p) or ("",))[0] == "fitted"]


# ------------------------------------------------------------------------------ parsing
def _build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{path}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in _parameters(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ScenarioError(f"{path}: unknown key(s) {unknown}; allowed: {sorted(fields)}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        sub = f"{path}.{key}" if path else key
        if cls is WorkloadModel and key in ("prompt_len", "response_len"):
            value = _build(LengthDistribution, value, sub)
        elif cls is TrainerModel and key == "phase_shares":
            if not isinstance(value, Mapping):
                raise ScenarioError(f"{sub}: expected a mapping of timing key -> share")
            value = tuple((str(k), float(v)) for k, v in value.items())
        kwargs[key] = value
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise ScenarioError(f"{path or cls.__name__}: {e}") from e


def _parameters(cls: type) -> tuple[Any, ...]:
    """The fields of a model section a scenario sets (not `TrainerModel.links`, which a
    scenario derives from its hardware and model)."""
    return tuple(f for f in attrs.fields(cls) if f.name != "links")


_SECTIONS: dict[str, type] = {
    "hardware": HardwareModel,
    "model": LLMModel,
    "engine": EngineModel,
    "trainer": TrainerModel,
    "workload": WorkloadModel,
}


def scenario_from_dict(data: Mapping[str, Any]) -> Scenario:
    """Validate a scenario mapping (as read from YAML/TOML).

    Raises:
        ScenarioError: a key is unknown, missing or has a bad value (named in the message).
    """
    _check_keys(data)
    kw: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            kw[key] = _build(_SECTIONS[key], value, key)
        elif key in _PARSERS:
            kw[key] = _PARSERS[key](value)
        else:
            kw[key] = value
    if not isinstance(kw["name"], str) or not kw["name"]:
        raise ScenarioError("name: expected a non-empty string")
    _check_count("steps", kw["steps"], 1, MAX_STEPS)
    _check_count("seed", kw.get("seed", 0), 0, MAX_SEED)
    _check_count("seeds", kw.get("seeds", 1), 1, MAX_SEEDS)
    sc = Scenario(**kw)
    _check_provenance_paths(sc)
    for c in sc.configurations:
        _check_fits_cluster(sc, c)
    return sc


def scenario_to_dict(sc: Scenario) -> dict[str, Any]:
    """A scenario as plain data (loadable by `dynsched_sim.scenario_from_dict`)."""
    d = attrs.asdict(sc, recurse=True)
    d["trainer"]["phase_shares"] = {k: v for k, v in sc.trainer.phase_shares}
    d["trainer"].pop("links", None)  # derived from hardware and model when loaded
    for key in ("prompt_len", "response_len"):
        d["workload"][key]["values"] = list(d["workload"][key]["values"])
    for key in ("length_trajectory", "difficulty_trajectory"):
        d["workload"][key] = [list(p) for p in getattr(sc.workload, key)]
    d["configurations"] = [attrs.asdict(c) for c in sc.configurations]
    d["schedule"] = dict(sc.schedule)
    d["published"] = dict(sc.published)
    d["provenance"] = dict(sc.provenance)
    return d


def _check_keys(data: Any) -> None:
    """``data`` is a mapping of known scenario keys holding the required ones."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"scenario: expected a mapping, got {type(data).__name__}")
    allowed = {f.name for f in attrs.fields(Scenario)}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ScenarioError(f"scenario: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    for req in ("name", "steps", "configurations"):
        if req not in data:
            raise ScenarioError(f"scenario: missing required key {req!r}")


def _configurations(value: Any) -> tuple[Configuration, ...]:
    """The ``configurations`` list: each entry valid, the names distinct."""
    if not isinstance(value, list | tuple) or not value:
        raise ScenarioError("configurations: expected a non-empty list")
    confs = tuple(_build(Configuration, c, f"configurations[{i}]") for i, c in enumerate(value))
    for i, c in enumerate(confs):
        _check_configuration(c, f"configurations[{i}]")
    names = [c.name for c in confs]
    if len(set(names)) != len(names):
        raise ScenarioError(f"configurations: duplicate names in {names}")
    return confs


def _check_configuration(c: Configuration, where: str) -> None:
    """One configuration's fields have their types and ranges, and something generates."""
    if not isinstance(c.name, str) or not c.name:
        raise ScenarioError(f"{where}.name: expected a non-empty string")
    if not isinstance(c.trainer_gpus, int) or c.trainer_gpus < 1:
        raise ScenarioError(
            f"{where}.trainer_gpus: expected an integer >= 1, got {c.trainer_gpus!r}"
        )
    if not isinstance(c.rollout_gpus, int) or c.rollout_gpus < 0:
        raise ScenarioError(
            f"{where}.rollout_gpus: expected an integer >= 0, got {c.rollout_gpus!r}"
        )
    if not isinstance(c.hybrid, bool):
        raise ScenarioError(f"{where}.hybrid: expected true or false, got {c.hybrid!r}")
    if c.rollout_gpus == 0 and not c.hybrid:
        raise ScenarioError(
            f"{where}: rollout_gpus is 0 and hybrid is false: nothing would generate"
        )


def _schedule(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ScenarioError("schedule: expected a mapping of DynamicScheduleConfig keys")
    return dict(value)


def _published(value: Any) -> dict[str, float]:
    if not isinstance(value, Mapping):
        raise ScenarioError("published: expected a mapping configuration -> seconds")
    return {str(k): float(v) for k, v in value.items()}


def _check_provenance_paths(sc: Scenario) -> None:
    """Every provenance path names a parameter of ``sc`` (or a section holding some)."""
    known = set(sc.parameter_paths()) | {"configurations", "published"}
    known |= {f"published.{k}" for k in sc.published}
    known |= {f"configurations.{c.name}" for c in sc.configurations}
    prefixes = {p.rsplit(".", 1)[0] for p in known if "." in p} | set(_SECTIONS) | {"schedule"}
    for path in sc.provenance:
        if path not in known and path not in prefixes:
            raise ScenarioError(
                f"provenance.{path}: not a parameter of the scenario (e.g. 'engine.max_num_seqs', "
                "'schedule.staleness_threshold', 'workload.response_len')"
            )


def _check_fits_cluster(sc: Scenario, c: Configuration) -> None:
    """``c``'s pools hold whole replicas, its schedule is valid for the core, and an awake
    hybrid replica fits next to a resident trainer."""
    g = sc.engine.gpus_per_replica
    if c.trainer_gpus % g and c.hybrid:
        raise ScenarioError(
            f"configurations: {c.name}.trainer_gpus ({c.trainer_gpus}) must be a multiple of "
            f"engine.gpus_per_replica ({g}) to host hybrid replicas"
        )
    if c.rollout_gpus % g:
        raise ScenarioError(
            f"configurations: {c.name}.rollout_gpus ({c.rollout_gpus}) must be a multiple of "
            f"engine.gpus_per_replica ({g})"
        )
    sc.schedule_config(c)  # validated by the core
    if c.hybrid and not sc.trainer.offload_state:
        mem = sc.hardware.gpu_memory_gib * 2**30
        engine = sc.engine.hybrid_memory_fraction * mem
        trainer = sc.trainer.resident_bytes_per_gpu(sc.model, c.trainer_gpus)
        if engine + trainer > mem:
            raise ScenarioError(
                f"configurations: {c.name}: an awake hybrid replica "
                f"(engine.hybrid_memory_fraction {sc.engine.hybrid_memory_fraction}: "
                f"{engine / 2**30:.1f} GiB per GPU) does not fit next to the resident "
                f"trainer state ({trainer / 2**30:.1f} GiB per GPU) in "
                f"{sc.hardware.gpu_memory_gib} GiB; lower the fraction or set "
                "trainer.offload_state: true"
            )


def static_splits(scenario: Scenario, total_gpus: int | None = None) -> tuple[Configuration, ...]:
    """Every static split of ``total_gpus`` GPUs (default: the scenario's largest
    configuration): the standalone rollout pool in whole replicas (at least one), the rest
    to the trainer (at least one GPU, its weights, gradients and optimizer state fitting its
    GPUs during a step), each accepted by the core; named ``static-<trainer>-<rollout>``
    (the scenario's own configuration where one has that split). "Best static split" in
    the benchmarks is the best of these.

    Raises:
        ScenarioError: ``total_gpus`` holds no split.
    """
    total = total_gpus or max(c.total_gpus for c in scenario.configurations)
    g = scenario.engine.gpus_per_replica
    own = {(c.trainer_gpus, c.rollout_gpus): c for c in scenario.configurations if not c.hybrid}
    mem = scenario.hardware.gpu_memory_gib * 2**30
    out = []
    for rollout in range(g, total, g):
        trainer = total - rollout
        if scenario.trainer.resident_bytes_per_gpu(scenario.model, trainer) > mem:
            continue
        conf = own.get((trainer, rollout)) or Configuration(
            name=f"static-{trainer}-{rollout}", trainer_gpus=trainer, rollout_gpus=rollout
        )
        try:
            scenario.schedule_config(conf)
        except ScenarioError:
            continue
        out.append(conf)
    if not out:
        raise ScenarioError(
            f"scenario {scenario.name!r}: {total} GPUs hold no static split of "
            f"{g}-GPU replicas next to a trainer"
        )
    return tuple(out)


def _check_count(name: str, value: Any, lo: int, hi: int) -> None:
    """``value`` is an int in ``[lo, hi]`` (a ScenarioError naming ``name`` otherwise)."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        huge = isinstance(value, int) and abs(value) >= 10**30
        shown = "a huge number" if huge else repr(value)
        raise ScenarioError(f"{name}: expected an integer >= {lo} and <= {hi:,}, got {shown}")


def check_run_size(steps: int | None, seed: int | None, seeds: int | None) -> None:
    """The ``--steps``, ``--seed`` and ``--seeds`` flags of ``dynsched simulate`` in range.

    Raises:
        ScenarioError: naming the flag and the allowed range.
    """
    for flag, value, lo, hi in (
        ("--steps", steps, 1, MAX_STEPS),
        ("--seed", seed, 0, MAX_SEED),
        ("--seeds", seeds, 1, MAX_SEEDS),
    ):
        if value is not None and not lo <= value <= hi:
            shown = str(value) if abs(value) < 10**30 else "a huge number"
            raise ScenarioError(f"{flag} must be an integer >= {lo} and <= {hi:,}, got {shown}")


def _provenance(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ScenarioError("provenance: expected a mapping parameter path -> 'label: source'")
    out: dict[str, str] = {}
    for path, text in value.items():
        if not isinstance(text, str) or ":" not in text:
            raise ScenarioError(
                f"provenance.{path}: expected 'label: source' with the label one of "
                f"{list(PROVENANCE_LABELS)}, got {text!r}"
            )
        label, _, source = text.partition(":")
        if label.strip() not in PROVENANCE_LABELS:
            raise ScenarioError(
                f"provenance.{path}: label {label.strip()!r} is not one of {list(PROVENANCE_LABELS)}"
            )
        if not source.strip():
            raise ScenarioError(f"provenance.{path}: the source is empty")
        out[str(path)] = text
    return out


#: Parsers of the scenario keys that are neither model sections nor plain values.
_PARSERS: dict[str, Callable[[Any], Any]] = {
    "configurations": _configurations,
    "schedule": _schedule,
    "published": _published,
    "provenance": _provenance,
}


def _read(path: Path) -> Any:
    """A scenario file through the core's guarded reader (size, expanded size, depth and
    huge numbers capped before anything is built; one-line syntax errors)."""
    from dynsched_core._loading import read_config_file

    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ScenarioError(f"unsupported scenario file type {suffix!r}; use .yaml, .yml or .toml")
    try:
        return read_config_file(path)
    except ConfigError as e:
        raise ScenarioError(str(e)) from None
    except OSError as e:
        raise ScenarioError(f"cannot read it ({e.strerror or e})") from None


def builtin_scenarios() -> list[str]:
    """Names of the scenarios shipped with the package."""
    root = resources.files("dynsched_sim") / "scenarios"
    return sorted(p.name.rsplit(".", 1)[0] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_scenario(
    name_or_path: str | os.PathLike[str], *, base: str | os.PathLike[str] | None = None
) -> Scenario:
    """Load a built-in scenario by name, or a scenario file by path, or a verl config file
    mapped onto a base scenario (`dynsched_sim.scenario_from_verl`).

    Args:
        name_or_path: A built-in name, or a ``.yaml``/``.yml``/``.toml`` file holding a
            scenario or a verl config (told apart by `dynsched_sim.is_verl_config`).
        base: For a verl config: the scenario its cost models, model and workload come
            from (default `dynsched_sim.DEFAULT_VERL_BASE`); refused for anything else.

    Raises:
        ScenarioError: unknown name (lists the built-ins), unreadable or invalid file,
            ``base`` given for a scenario.
    """
    s = os.fspath(name_or_path)
    p = Path(s)
    if p.suffix.lower() in (".yaml", ".yml", ".toml") or os.sep in s:
        if p.is_dir():
            raise ScenarioError(f"scenario {s!r} is a directory; give a .yaml or .toml file")
        if not p.is_file():
            raise ScenarioError(f"scenario file {s!r} does not exist")
        try:
            data = _read(p)
            from dynsched_sim import _verl

            if _verl.is_verl_config(data):
                return _verl.scenario_from_verl(
                    data, base=base or _verl.DEFAULT_VERL_BASE, source=p.name
                )
            if isinstance(data, Mapping) and "configurations" not in data:
                raise ScenarioError(
                    "neither a scenario (no 'configurations' key) nor a verl config (no "
                    f"{' / '.join(sorted(_verl.VERL_SECTIONS))} section); its top-level keys: "
                    f"{sorted(map(str, data))}"
                )
            _no_base(base, "a scenario file")
            return scenario_from_dict(data)
        except ScenarioError as e:
            raise ScenarioError(f"{s}: {e}") from e
    names = builtin_scenarios()
    if s not in names:
        raise ScenarioError(
            f"unknown scenario {s!r}; built-in scenarios: {names} (or give a .yaml/.toml path)"
        )
    _no_base(base, "a built-in scenario")
    res = resources.files("dynsched_sim") / "scenarios" / f"{s}.yaml"
    import yaml

    return scenario_from_dict(yaml.safe_load(res.read_text()))


def _no_base(base: str | os.PathLike[str] | None, what: str) -> None:
    if base is not None:
        raise ScenarioError(
            f"base {os.fspath(base)!r}: only a verl config is mapped onto a base scenario, "
            f"not {what}"
        )
