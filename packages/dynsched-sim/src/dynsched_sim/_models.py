"""Cost models of the simulated cluster: hardware, model, inference engine, trainer.

Every formula the simulator uses lives here, as a method of a frozen attrs class, so the
README can point at one place and the lower bound can reuse the exact same numbers.

Units: seconds, tokens, bytes, GiB/s for bandwidths (``1 GiB = 2**30`` bytes).
"""

from __future__ import annotations

import math

import attrs
from dynsched_core import validators as v

__all__ = ["EngineModel", "HardwareModel", "LLMModel", "TrainerModel"]

_GIB = float(2**30)


#: Validators of the cost models (core's: errors name ``Class.field`` and the range).
_pos = v.float_gt(0.0)
_nonneg = v.float_ge(0.0)
_frac = v.float_in(0.0, 1.0, lo_open=True)
_bool = v.bool_()
_posint = v.int_ge(1)


@attrs.frozen(kw_only=True)
class HardwareModel:
    """GPUs and links.

    Attributes:
        gpu_memory_gib: Memory of one GPU.
        h2d_bandwidth_gib_s: Host<->device copy bandwidth per GPU (offload / onload).
        network_bandwidth_gib_s: Trainer -> standalone replica broadcast bandwidth.
        network_latency_s: Fixed latency of one broadcast (collective set-up, barriers).
        local_sync_bandwidth_gib_s: Trainer -> colocated (hybrid) engine bandwidth per GPU
            (same device, CUDA IPC).
        gpus_per_node: GPUs per server; a hybrid replica's node is the trainer server
            its GPUs are on (published: the seed's 16 GPUs are "2 dedicated trainer
            nodes"). Only labels replicas for per-node lending; no cost depends on it.
    """

    gpu_memory_gib: float = attrs.field(default=80.0, validator=_pos)
    h2d_bandwidth_gib_s: float = attrs.field(default=20.0, validator=_pos)
    network_bandwidth_gib_s: float = attrs.field(default=10.0, validator=_pos)
    network_latency_s: float = attrs.field(default=2.0, validator=_nonneg)
    local_sync_bandwidth_gib_s: float = attrs.field(default=100.0, validator=_pos)
    gpus_per_node: int = attrs.field(default=8, validator=_posint)


@attrs.frozen(kw_only=True)
class LLMModel:
    """The policy model being trained and served.

    Attributes:
        params_b: Parameters, in billions.
        bytes_per_param: Bytes per served weight (2 for bf16).
        kv_bytes_per_token: KV-cache bytes per token of context, whole model.
        trainer_state_bytes_per_param: Bytes per parameter the trainer holds besides the
            weights (gradients + optimizer state: e.g. 4 for fp32 gradients plus 12 for
            fp32 master weights and two Adam moments).
        state_bytes_per_seq: Fixed-size per-sequence state of the served model besides its
            KV cache (recurrent state of linear-attention layers), whole model.
    """

    params_b: float = attrs.field(default=35.0, validator=_pos)
    bytes_per_param: float = attrs.field(default=2.0, validator=_pos)
    kv_bytes_per_token: float = attrs.field(default=65536.0, validator=_pos)
    trainer_state_bytes_per_param: float = attrs.field(default=12.0, validator=_nonneg)
    state_bytes_per_seq: float = attrs.field(default=0.0, validator=_nonneg)

    @property
    def weight_bytes(self) -> float:
        """``params_b * 1e9 * bytes_per_param``."""
        return self.params_b * 1e9 * self.bytes_per_param

    @property
    def trainer_state_bytes(self) -> float:
        """``params_b * 1e9 * trainer_state_bytes_per_param``."""
        return self.params_b * 1e9 * self.trainer_state_bytes_per_param


@attrs.frozen(kw_only=True)
class EngineModel:
    """Continuous-batching inference engine (one replica).

    Decode: every engine iteration produces one token for every running sequence and
    takes ``decode_base_s + decode_per_seq_s * n`` seconds with ``n`` sequences running,
    so each sequence decodes at ``r(n) = 1 / (decode_base_s + decode_per_seq_s * n)``
    tokens/s and the replica at ``n * r(n)``.

    Memory: a replica of ``g`` GPUs with memory fraction ``f`` (the engine's
    ``gpu_memory_utilization``: weights plus KV pool) has ``free = g * gpu_memory * f -
    weight_bytes`` for sequences; each running sequence reserves ``kv_tokens_per_seq``
    tokens of KV cache plus the model's fixed per-sequence state, so at most
    ``min(max_num_seqs, floor(free / (kv_tokens_per_seq * kv_bytes_per_token +
    state_bytes_per_seq)))`` sequences run; others wait. A hybrid replica that is awake
    holds this memory on the trainer's GPUs: the trainer cannot train there until it
    sleeps (`SimTrainer`).

    Prefill: ``prefill_s_per_token`` per prompt (and, after an abort, per re-prefilled
    output) token, one request at a time, overlapped with decoding (chunked prefill).

    Attributes:
        gpus_per_replica: GPUs of one replica (tensor parallel size).
        decode_base_s: Fixed part of one decode iteration.
        decode_per_seq_s: Added per running sequence.
        prefill_s_per_token: Prefill cost per token.
        max_num_seqs: Engine cap on running sequences.
        kv_tokens_per_seq: KV reservation per running sequence (mean context).
        standalone_memory_fraction: GPU memory fraction of standalone replicas.
        hybrid_memory_fraction: GPU memory fraction of hybrid replicas (they share the
            GPUs with the trainer, so they get less).
        sleep_overhead_s: Fixed cost of a sleep besides the weight offload.
        wake_overhead_s: Fixed cost of a wake-up besides the weight reload (KV
            allocation, graph capture).
    """

    gpus_per_replica: int = attrs.field(default=8, validator=_posint)
    decode_base_s: float = attrs.field(default=0.02, validator=_pos)
    decode_per_seq_s: float = attrs.field(default=0.0002, validator=_nonneg)
    prefill_s_per_token: float = attrs.field(default=2e-6, validator=_nonneg)
    max_num_seqs: int = attrs.field(default=256, validator=_posint)
    kv_tokens_per_seq: float = attrs.field(default=16384.0, validator=_pos)
    standalone_memory_fraction: float = attrs.field(default=0.9, validator=_frac)
    hybrid_memory_fraction: float = attrs.field(default=0.5, validator=_frac)
    sleep_overhead_s: float = attrs.field(default=2.0, validator=_nonneg)
    wake_overhead_s: float = attrs.field(default=5.0, validator=_nonneg)

    def per_seq_rate(self, n: int) -> float:
        """Tokens/s of one sequence when ``n >= 1`` sequences run: ``1/(base + per_seq*n)``."""
        return 1.0 / (self.decode_base_s + self.decode_per_seq_s * n)

    def max_running(self, role: str, hw: HardwareModel, llm: LLMModel) -> int:
        """Largest number of sequences that run at once on a replica of ``role``."""
        frac = self.hybrid_memory_fraction if role == "hybrid" else self.standalone_memory_fraction
        free = self.gpus_per_replica * hw.gpu_memory_gib * _GIB * frac - llm.weight_bytes
        if free <= 0:
            raise ValueError(
                f"a {role} replica of {self.gpus_per_replica} GPU(s) with memory fraction {frac} "
                f"cannot even hold the weights ({llm.weight_bytes / _GIB:.1f} GiB)"
            )
        per_seq = llm.kv_bytes_per_token * self.kv_tokens_per_seq + llm.state_bytes_per_seq
        seqs = math.floor(free / per_seq)
        return max(1, min(self.max_num_seqs, seqs))

    def peak_throughput(self, role: str, hw: HardwareModel, llm: LLMModel) -> float:
        """Highest decode throughput of one replica, tokens/s: ``m * r(m)``, ``m = max_running``.

        ``n * r(n)`` increases with ``n``, so the peak is at the KV-capacity limit.
        """
        m = self.max_running(role, hw, llm)
        return m * self.per_seq_rate(m)

    def sleep_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """Sleep: offload the weight shard to host: ``weight_bytes/g / h2d + sleep_overhead_s``."""
        shard = llm.weight_bytes / self.gpus_per_replica
        return shard / (hw.h2d_bandwidth_gib_s * _GIB) + self.sleep_overhead_s

    def wake_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """Wake-up: reload the weight shard: ``weight_bytes/g / h2d + wake_overhead_s``."""
        shard = llm.weight_bytes / self.gpus_per_replica
        return shard / (hw.h2d_bandwidth_gib_s * _GIB) + self.wake_overhead_s

    def broadcast_sync_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """Weight sync to a standalone replica: ``weight_bytes / network_bw + latency``."""
        return llm.weight_bytes / (hw.network_bandwidth_gib_s * _GIB) + hw.network_latency_s

    def local_sync_s(self, hw: HardwareModel, llm: LLMModel) -> float:
        """Weight sync to a hybrid replica (same GPUs): ``weight_bytes/g / local_bw``."""
        shard = llm.weight_bytes / self.gpus_per_replica
        return shard / (hw.local_sync_bandwidth_gib_s * _GIB)


@attrs.frozen(kw_only=True)
class TrainerModel:
    """The trainer (actor update + log-prob passes).

    A micro-step over ``tokens`` tokens (prompt + response tokens of all responses of
    its samples) on ``g`` trainer GPUs takes
    ``step_overhead_s + gpu_s_per_token * tokens / g`` seconds of compute, plus, when
    ``offload_state`` is set, the reload and offload of the trainer's state
    (`state_swap_s`); the step is split into verl's timing keys by ``phase_shares``.

    Attributes:
        gpu_s_per_token: GPU-seconds of training compute per token.
        step_overhead_s: Fixed, non-scaling part of a micro-step.
        offload_state: The trainer moves its weights, gradients and optimizer state to
            host memory after every step and back before the next one (Megatron's
            ``param_offload``/``grad_offload``/``optimizer_offload``), so its GPUs are
            free between steps. When False the state stays resident and must fit next
            to an awake hybrid replica.
        phase_shares: Share of a step per timing key (sums to 1).
    """

    gpu_s_per_token: float = attrs.field(default=0.002, validator=_pos)
    step_overhead_s: float = attrs.field(default=5.0, validator=_nonneg)
    offload_state: bool = attrs.field(default=False, validator=_bool)
    phase_shares: tuple[tuple[str, float], ...] = (
        ("reward", 0.02),
        ("old_log_prob", 0.18),
        ("ref", 0.15),
        ("adv", 0.01),
        ("update_actor", 0.64),
    )

    def step_s(self, tokens: int, gpus: int, swap_s: float = 0.0) -> float:
        """Duration of one micro-step (``swap_s``: `state_swap_s`, 0 without offload)."""
        return self.step_overhead_s + self.gpu_s_per_token * tokens / gpus + swap_s

    def timings(self, tokens: int, gpus: int, swap_s: float = 0.0) -> dict[str, float]:
        """The step's duration split into verl's ``timing_raw`` keys."""
        total = self.step_s(tokens, gpus, swap_s)
        return {k: total * share for k, share in self.phase_shares}

    def resident_bytes_per_gpu(self, llm: LLMModel, gpus: int) -> float:
        """Trainer state (weights + gradients + optimizer) per GPU."""
        return (llm.trainer_state_bytes + llm.weight_bytes) / gpus

    def state_swap_s(self, hw: HardwareModel, llm: LLMModel, gpus: int) -> float:
        """Reload plus offload of the trainer state around one step when ``offload_state``:
        ``2 * (trainer_state_bytes + weight_bytes) / gpus / h2d``; 0 otherwise."""
        if not self.offload_state:
            return 0.0
        return 2.0 * self.resident_bytes_per_gpu(llm, gpus) / (hw.h2d_bandwidth_gib_s * _GIB)
