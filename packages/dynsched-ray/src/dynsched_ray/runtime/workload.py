"""What a `RayRunner` runs: the *workload* it is configured with.

The runner owns the run (the fleet, the `ReplicaSet`, the driver, the loop, failures,
checkpoints of the driver, the ``dynamic_resource/*`` metrics). A workload says what the
run is about: where the prompts come from, how the replicas and the hybrid replicas of
real trainers are set up, what a checkpoint and a resume add, and what is recorded per
event. ``dynsched run`` is the runner with the default `StandInWorkload` (synthetic
prompts, in-memory replicas, stand-in or ``options.trainer`` trainers); ``dynsched train``
is the same runner with `dynsched_ray.training.TrainWorkload` (the addition task, an
engine plug-in, a trainer plug-in).

A workload subclasses `RunWorkload` and overrides the hooks it needs; every hook gets the
runner, whose public fields (``config``, ``options``, ``loop``, ``fleet``,
``trainer_group``, ``step_offset``, ``consumed_sample_ids``, ``metrics_aggregator``) and
methods (``say``, ``output_failed``) it may read or call. The hooks, by concern:

- rollout: `prompts` (the prompt source), `id_prefix` (the form of their ids, checked
  in a checkpoint), `replica_kwargs` (what every replica is built with);
- trainer: `hybrid` (a hybrid replica as the loop sees it over real trainers),
  `weights_synced` (after every weight sync of real trainers);
- checkpoint: `checkpoint_extras` (keys added to the driver checkpoint),
  `fingerprint_extras` (what a resumed run must share besides the config), `restore`
  (the workload's own state, before the resume's weight sync);
- outputs: `prepare_outputs` (a fresh run clears, a resumed one trims), `on_event`
  (every core event, before the runner's own handling: per-step rows).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dynsched_core import InMemoryReplicaOptions, Prompt

if TYPE_CHECKING:
    from dynsched_core import FullyAsyncLoop

    from dynsched_ray.runtime.runner import RayRunner, RayRunOptions
    from dynsched_ray.trainers.group import RayTrainerGroup

__all__ = ["RunWorkload", "StandInWorkload", "synthetic_prompts"]


def synthetic_prompts(
    num_prompts: int,
    *,
    max_tokens: int,
    prompt_len: int,
    n: int,
    min_len: int,
    max_len: int,
    skip: frozenset[str] = frozenset(),
) -> Iterator[Prompt]:
    """Deterministic prompts ``p0, p1, ...`` with varied natural response lengths."""
    span = max_len - min_len + 1
    for i in range(num_prompts):
        pid = f"p{i}"
        if pid in skip:
            continue
        lens = tuple(min_len + (i * 7 + j * 13) % span for j in range(n))
        yield Prompt(prompt_id=pid, prompt_len=prompt_len, max_tokens=max_tokens, target_lens=lens)


class RunWorkload:
    """Base of the workloads: every hook but `prompts` does nothing special.

    Attributes:
        id_prefix: Prompt ids are ``<id_prefix><index>``; a resumed run refuses a
            checkpoint whose consumed ids are of another form (None: not checked).
    """

    id_prefix: str | None = None

    # ------------------------------------------------------------------ rollout
    def prompts(self, runner: RayRunner) -> Iterable[Any]:
        """The run's prompt source; it skips ``runner.consumed_sample_ids`` on a resume."""
        raise NotImplementedError(f"{type(self).__name__}.prompts")

    def replica_kwargs(self, options: RayRunOptions) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """Keyword arguments of the standalone and of the hybrid replicas: by default the
        settings of the in-memory replicas (`dynsched_core.InMemoryReplica`)."""
        standalone = {"tokens_per_s": options.tokens_per_s, "chunk_tokens": options.chunk_tokens}
        hybrid: dict[str, Any] = dict(standalone)
        if options.switch_delay_s:
            d = options.switch_delay_s
            hybrid["options"] = InMemoryReplicaOptions(
                sleep_delay_s=d, wake_delay_s=d, update_delay_s=d
            )
        return standalone, hybrid

    # ------------------------------------------------------------------ trainer
    def hybrid(
        self, runner: RayRunner, group: RayTrainerGroup, replica: Any, gpus: Sequence[Hashable]
    ) -> Any:
        """A hybrid replica on ``gpus`` as the loop sees it when real trainers run
        (``options.trainer``): by default `RayTrainerGroup.hybrid`, which wakes it only
        after the trainers on its GPUs offloaded."""
        return group.hybrid(replica, gpus)

    async def weights_synced(self, runner: RayRunner, version: int, weights: Any) -> None:
        """After every weight sync of real trainers (the standalone replicas have them)."""

    # ------------------------------------------------------------------ checkpoint
    def checkpoint_extras(self, runner: RayRunner, state: Mapping[str, Any]) -> dict[str, Any]:
        """Keys added to the driver checkpoint ``state`` (written after every sync)."""
        return {}

    def fingerprint_extras(self, runner: RayRunner) -> dict[str, Any]:
        """What a resumed run must share besides the config (`config_fingerprint`)."""
        return {}

    async def restore(
        self, runner: RayRunner, loop: FullyAsyncLoop, restored: Mapping[str, Any]
    ) -> None:
        """Load the workload's checkpointed state; called after the driver's state is
        loaded and before the resume's weight sync exports weights from the trainer."""

    # ------------------------------------------------------------------ outputs
    def prepare_outputs(self, runner: RayRunner, steps_done: int | None) -> None:
        """Before the fleet starts: a fresh run (``steps_done`` None) clears an earlier
        run's outputs; a resumed one drops what was written after ``steps_done``."""

    def on_event(self, runner: RayRunner, event: Any) -> None:
        """Every core event of the run, before the runner's own handling (progress line,
        checkpoint); a `TrainStepEvent` carries the run's own step number (add
        ``runner.step_offset`` for the global one)."""


class StandInWorkload(RunWorkload):
    """``dynsched run``'s workload: the synthetic prompts ``p0, p1, ...``
    (`synthetic_prompts`, lengths from the options), in-memory replicas, and the stand-in
    trainer (or the real trainers of ``options.trainer``)."""

    id_prefix: str | None = "p"

    def prompts(self, runner: RayRunner) -> Iterable[Any]:
        opt, cfg = runner.options, runner.config
        total = runner.step_offset + runner.num_steps
        return synthetic_prompts(
            opt.num_prompts or 2 * total * cfg.required_samples + 8,
            max_tokens=opt.max_tokens,
            prompt_len=opt.prompt_len,
            n=cfg.n,
            min_len=opt.min_response_len,
            max_len=opt.max_response_len,
            skip=frozenset(runner.consumed_sample_ids),
        )
