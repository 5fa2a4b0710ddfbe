"""dynsched-ray: Ray actors and adapters that run the dynsched core across a Ray cluster.

The sub-packages, one per concern:

- `dynsched_ray.runtime`: the runner, the replica fleet and its supervisor, actors, proxies;
- `dynsched_ray.engines`: rollout engines, one folder each (``vllm``, ``hf``), plug-ins of
  the entry-point group ``dynsched.engines``;
- `dynsched_ray.trainers`: trainers, one folder each (``torch``, ``megatron``), plug-ins of
  ``dynsched.trainers``, and the trainer group;
- `dynsched_ray.task`: the addition task, the RL objective, the tiny model;
- `dynsched_ray.drills`: chaos under load;
- `dynsched_ray.training`: `TrainRunner`, the one runner (`RayRunner`) configured with a
  `TrainWorkload` (an engine, a trainer and the task);
- `dynsched_ray.cli`: ``dynsched run`` and ``dynsched train`` and their one config loader;
- `dynsched_ray.plugins`: the engine and trainer plug-in contracts.

The names below (and, for compatibility, every name a sub-package exports) are imported
on first access, so ``import dynsched_ray`` loads neither Ray, a tensor library nor an engine.
"""

from __future__ import annotations

from dynsched_ray._lazy import lazy_getattr

__version__ = "0.1.0"

_RUNTIME = "dynsched_ray.runtime"
#: name -> module it is imported from on first access.
_LAZY = {
    # the main entry points (__all__)
    "RayRunner": f"{_RUNTIME}.runner",
    "RayRunOptions": f"{_RUNTIME}.runner",
    "RayRunResult": f"{_RUNTIME}.runner",
    "run_ray": f"{_RUNTIME}.runner",
    "TrainRunner": "dynsched_ray.training",
    "TrainSettings": "dynsched_ray.training",
    "TrainSummary": "dynsched_ray.training",
    "TrainRunnerOptions": "dynsched_ray.training",
    "TrainWorkload": "dynsched_ray.training",
    "RunWorkload": f"{_RUNTIME}.workload",
    "StandInWorkload": f"{_RUNTIME}.workload",
    "EnginePlugin": "dynsched_ray.plugins",
    "TrainerPlugin": "dynsched_ray.plugins",
    "LazyFactory": "dynsched_ray.plugins",
    "run_chaos_soak": "dynsched_ray.drills.chaos",
    # runtime
    "load_checkpoint": f"{_RUNTIME}.runner",
    "synthetic_prompts": f"{_RUNTIME}.runner",
    "QueueActor": f"{_RUNTIME}.actors",
    "ReplicaActor": f"{_RUNTIME}.actors",
    "RouterActor": f"{_RUNTIME}.actors",
    "TrainerWorkerActor": f"{_RUNTIME}.actors",
    "placement_info": f"{_RUNTIME}.actors",
    "remote_class": f"{_RUNTIME}.actors",
    "ActorUnavailableError": f"{_RUNTIME}.errors",
    "AllReplicasLostError": f"{_RUNTIME}.errors",
    "CheckpointWriteError": f"{_RUNTIME}.errors",
    "EngineStartError": f"{_RUNTIME}.errors",
    "ModelFilesError": f"{_RUNTIME}.errors",
    "RemoteCallTimeoutError": f"{_RUNTIME}.errors",
    "ReplicaActorDiedError": f"{_RUNTIME}.errors",
    "TrainerOffloadedError": f"{_RUNTIME}.errors",
    "FleetSpec": f"{_RUNTIME}.fleet",
    "RayFleet": f"{_RUNTIME}.fleet",
    "ReplicaFactory": f"{_RUNTIME}.fleet",
    "default_replica_factory": f"{_RUNTIME}.fleet",
    "ResourcePools": f"{_RUNTIME}.placement",
    "RayQueue": f"{_RUNTIME}.proxies",
    "RayReplica": f"{_RUNTIME}.proxies",
    "RayRouter": f"{_RUNTIME}.proxies",
    "await_ref": f"{_RUNTIME}.remote",
    "inject_call_delay": f"{_RUNTIME}.remote",
    "ReplicaRestart": f"{_RUNTIME}.supervisor",
    "ReplicaSupervisor": f"{_RUNTIME}.supervisor",
    "RestartOptions": f"{_RUNTIME}.supervisor",
    # drills
    "FAULT_KINDS": "dynsched_ray.drills.chaos",
    "ChaosFault": "dynsched_ray.drills.chaos",
    "ChaosMonkey": "dynsched_ray.drills.chaos",
    "ChaosReport": "dynsched_ray.drills.chaos",
    "ChaosSchedule": "dynsched_ray.drills.chaos",
    "SampleAccounting": "dynsched_ray.drills.chaos",
    "account_samples": "dynsched_ray.drills.chaos",
    # engines
    "VLLMReplica": "dynsched_ray.engines.vllm.replica",
    "VLLMOptions": "dynsched_ray.engines.vllm.options",
    "VLLMReplicaState": "dynsched_ray.engines.vllm.replica",
    "SleepReport": "dynsched_ray.engines.vllm.replica",
    "check_model_folder": "dynsched_ray.engines.vllm.replica",
    "HFReplica": "dynsched_ray.engines.hf.replica",
    # trainers
    "RayTrainerBackend": "dynsched_ray.trainers.standin",
    "RayTrainerGroup": "dynsched_ray.trainers.group",
    "RayTrainerGroupBackend": "dynsched_ray.trainers.group",
    "RayTrainerSpec": "dynsched_ray.trainers.group",
    "TrainerActor": "dynsched_ray.trainers.group",
    "TrainerOptions": "dynsched_ray.trainers.base",
    "TorchTrainer": "dynsched_ray.trainers.torch.trainer",
    "MegatronTrainer": "dynsched_ray.trainers.megatron.trainer",
    "LlamaShape": "dynsched_ray.trainers.megatron.convert",
    "hf_llama_to_megatron": "dynsched_ray.trainers.megatron.convert",
    "megatron_to_hf_llama": "dynsched_ray.trainers.megatron.convert",
    # task
    "RLObjective": "dynsched_ray.task.objective",
    "AdditionTask": "dynsched_ray.task.addition",
    "WarmUpOptions": "dynsched_ray.task.addition",
    "warm_up": "dynsched_ray.task.addition",
    "TinyModelSpec": "dynsched_ray.task.tiny_model",
    "build_tiny_model": "dynsched_ray.task.tiny_model",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


__all__ = [
    "EnginePlugin",
    "LazyFactory",
    "RayRunOptions",
    "RayRunResult",
    "RayRunner",
    "TrainRunner",
    "TrainSettings",
    "TrainSummary",
    "TrainerPlugin",
    "run_chaos_soak",
    "run_ray",
]
