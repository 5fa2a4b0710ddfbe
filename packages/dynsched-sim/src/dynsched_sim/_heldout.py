"""The held-out scenario family: random variations of the seed deployment, drawn by seed.

Policies are developed on the built-in scenarios and reported on draws of this family
that nobody tuned them on. Each draw starts from the physics and configuration of
``seed-qwen35`` (every parameter keeps its provenance label there) and draws five
things from the documented ranges `HELD_OUT_RANGES`; the drawn values are labelled
``judgement`` with the range they came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs
import numpy as np

from dynsched_sim._scenario import Configuration, Scenario, load_scenario
from dynsched_sim._workload import LengthDistribution

__all__ = ["HELD_OUT_FIRST_DRAW", "HELD_OUT_RANGES", "heldout_scenario"]

#: Draws of the family start here (far from the built-ins' workload seeds 0..4).
HELD_OUT_FIRST_DRAW = 1000

HELD_OUT_RANGES: Mapping[str, str] = {
    "model.params_b": "log-uniform in [7, 70] B parameters (weights moved by switches and "
    "syncs, memory); decode iteration times scale with sqrt(params_b / 35)",
    "trainer.gpu_s_per_token": "seed-qwen35's value times a trainer-speed factor, "
    "log-uniform in [0.5, 2]",
    "configurations": "total GPUs one of 24, 32, 48, 64; trainer share one of 1/4, 3/8, 1/2, "
    "5/8, 3/4, rounded to whole 8-GPU replicas with at least one on each side; the static "
    "split, the splits one replica either way, and the dynamic split with hybrid replicas",
    "workload.response_len": "lognormal, median log-uniform in [2000, 12000] tokens, sigma "
    "uniform in [0.4, 1.2]",
    "workload.length_trajectory": "linear growth (or shrinkage) to a final factor uniform "
    "in [0.8, 2.0] over the run",
}
"""What a held-out draw varies, and over which range (all ranges are judgement: wide
enough to hold training-bound, balanced and rollout-bound deployments)."""


@attrs.frozen
class _Draw:
    """The five things a held-out draw varies (`HELD_OUT_RANGES`), drawn in this order."""

    params_b: float
    speed: float
    total_gpus: int
    trainer_share: float
    median: float
    sigma: float
    growth: float

    @classmethod
    def of(cls, draw: int) -> _Draw:
        rng = np.random.Generator(np.random.PCG64(draw))
        return cls(
            params_b=float(math.exp(rng.uniform(math.log(7.0), math.log(70.0)))),
            speed=float(math.exp(rng.uniform(math.log(0.5), math.log(2.0)))),
            total_gpus=int(rng.choice([24, 32, 48, 64])),
            trainer_share=float(rng.choice([0.25, 0.375, 0.5, 0.625, 0.75])),
            median=float(math.exp(rng.uniform(math.log(2000.0), math.log(12000.0)))),
            sigma=float(rng.uniform(0.4, 1.2)),
            growth=float(rng.uniform(0.8, 2.0)),
        )


def _configurations(total_gpus: int, share: float, g: int) -> tuple[Configuration, ...]:
    """The static split of ``share`` (whole replicas of ``g`` GPUs, at least one each side),
    the static splits one replica either way, and the dynamic split."""
    replicas = total_gpus // g
    trainer = min(replicas - 1, max(1, round(share * replicas)))
    rollout = replicas - trainer
    splits = [(trainer, rollout)]
    if trainer > 1:
        splits.append((trainer - 1, rollout + 1))
    if rollout > 1:
        splits.append((trainer + 1, rollout - 1))
    confs = [
        Configuration(name=f"static-{t * g}-{r * g}", trainer_gpus=t * g, rollout_gpus=r * g)
        for t, r in splits
    ]
    confs.append(
        Configuration(
            name=f"dynamic-{trainer * g}-{rollout * g}",
            trainer_gpus=trainer * g,
            rollout_gpus=rollout * g,
            hybrid=True,
        )
    )
    return tuple(confs)


def _provenance(base: Scenario, draw: int, steps: int) -> dict[str, str]:
    """The seed scenario's labels, with the drawn values labelled by their range."""
    prov = dict(base.provenance)
    prov.pop("published", None)
    for path, rng_text in HELD_OUT_RANGES.items():
        prov[path] = f"judgement: held-out draw {draw}: {rng_text}"
    prov["engine.decode_base_s"] = "judgement: seed-qwen35's fitted value times sqrt(params_b / 35)"
    prov["engine.decode_per_seq_s"] = prov["engine.decode_base_s"]
    prov["seed"] = f"judgement: the draw ({draw})"
    prov["steps"] = f"judgement: {steps} micro-steps"
    return prov


def heldout_scenario(draw: int, *, steps: int = 40) -> Scenario:
    """Held-out scenario number ``draw`` (deterministic; also its workload seed).

    Args:
        draw: The draw (use ``HELD_OUT_FIRST_DRAW + i`` for the i-th of the family).
        steps: Micro-steps of the run (default 40: ten weight-sync cycles).
    """
    d = _Draw.of(draw)
    base = load_scenario("seed-qwen35")
    scale = math.sqrt(d.params_b / base.model.params_b)
    return attrs.evolve(
        base,
        name=f"heldout-{draw}",
        description=f"held-out draw {draw} of dynsched_sim.heldout_scenario",
        seed=draw,
        seeds=1,
        steps=steps,
        published={},
        configurations=_configurations(d.total_gpus, d.trainer_share, base.engine.gpus_per_replica),
        model=attrs.evolve(base.model, params_b=d.params_b),
        engine=attrs.evolve(
            base.engine,
            decode_base_s=base.engine.decode_base_s * scale,
            decode_per_seq_s=base.engine.decode_per_seq_s * scale,
        ),
        trainer=attrs.evolve(base.trainer, gpu_s_per_token=base.trainer.gpu_s_per_token * d.speed),
        workload=attrs.evolve(
            base.workload,
            response_len=LengthDistribution(kind="lognormal", median=d.median, sigma=d.sigma),
            length_trajectory=((0.0, 1.0), (1.0, d.growth)),
        ),
        provenance=_provenance(base, draw, steps),
    )
