"""Real training jobs under the Optimus scheduler: the job contract and the job file.

A training script follows the contract of :func:`context` (rank, world size, batch,
``report`` every step, ``save``/``restore`` checkpoints, stop when told); a job file
(:func:`load_job_file`) names the script, its batch, workers and completion rule, and
optionally the batch range the scheduler may choose from (``adaptive_batch``) and whether
a new batch applies in place (``batch_change``).
:func:`run_local` runs a script here to try it; ``dynsched optimus serve`` (the
``dynsched-ray`` package) runs jobs on a Ray cluster under the scheduler, building the
same observation records as the simulator (:func:`observe_record`, :func:`make_decider`).
Nothing here imports torch or Ray until a job runs.
"""

from __future__ import annotations

from dynsched_optimus.jobs._context import (
    BatchControl,
    CheckpointError,
    ContextOptions,
    Control,
    JobContext,
    JobContractError,
    agreed_batch,
    context,
    load_checkpoint,
    save_checkpoint,
)
from dynsched_optimus.jobs._decide import (
    DECIDERS,
    GRAD_WINDOW,
    LOSS_POINTS,
    MIN_SPEED_REPORTS,
    Decider,
    Decision,
    JobRecord,
    bucket_loss_points,
    make_decider,
    observe_record,
    progress_by_step,
)
from dynsched_optimus.jobs._runner import (
    JobRunner,
    LocalResult,
    one_line_error,
    run_local,
    silent_error,
)
from dynsched_optimus.jobs._spec import (
    ADAPTIVE_BATCH_KEYS,
    BATCH_CHANGES,
    COMPLETION_KEYS,
    RESOURCE_NAMES,
    JobSpec,
    load_job_file,
    parse_job,
)

__all__ = [
    "ADAPTIVE_BATCH_KEYS",
    "BATCH_CHANGES",
    "COMPLETION_KEYS",
    "DECIDERS",
    "GRAD_WINDOW",
    "LOSS_POINTS",
    "MIN_SPEED_REPORTS",
    "RESOURCE_NAMES",
    "BatchControl",
    "CheckpointError",
    "ContextOptions",
    "Control",
    "Decider",
    "Decision",
    "JobContext",
    "JobContractError",
    "JobRecord",
    "JobRunner",
    "JobSpec",
    "LocalResult",
    "agreed_batch",
    "bucket_loss_points",
    "context",
    "load_checkpoint",
    "load_job_file",
    "make_decider",
    "observe_record",
    "one_line_error",
    "parse_job",
    "progress_by_step",
    "run_local",
    "save_checkpoint",
    "silent_error",
]
