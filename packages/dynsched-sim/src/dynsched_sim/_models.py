"""Cost models of the simulated cluster: hardware, model, inference engine, trainer.

Every formula the simulator uses lives here, as a method of a frozen attrs class, so the
README can point at one place and the lower bound can reuse the exact same numbers.

Units: seconds, tokens, bytes, GiB/s for bandwidths (``1 GiB = 2**30`` bytes).
"""

from __future__ import annotations

import math

import attrs
from dynsched_core import validators as v

__all__ = ["EngineModel", "HardwareModel", "LLMModel", "TrainerLinks", "TrainerModel"]

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
            nodes"). Labels replicas for per-node lending, and decides whether a
            trainer collective stays inside a server (`TrainerModel`).
        intra_node_bandwidth_gib_s: Collective (bus) bandwidth per GPU between the GPUs
            of one server (NVLink): the trainer's collectives inside a server.
        inter_node_bandwidth_gib_s: Collective (bus) bandwidth per GPU between servers
            (RDMA): the trainer's collectives that span servers.
    """

    gpu_memory_gib: float = attrs.field(default=80.0, validator=_pos)
    h2d_bandwidth_gib_s: float = attrs.field(default=20.0, validator=_pos)
    network_bandwidth_gib_s: float = attrs.field(default=10.0, validator=_pos)
    network_latency_s: float = attrs.field(default=2.0, validator=_nonneg)
    local_sync_bandwidth_gib_s: float = attrs.field(default=100.0, validator=_pos)
    gpus_per_node: int = attrs.field(default=8, validator=_posint)
    intra_node_bandwidth_gib_s: float = attrs.field(default=300.0, validator=_pos)
    inter_node_bandwidth_gib_s: float = attrs.field(default=40.0, validator=_pos)


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
    takes ``decode_base_s + decode_per_seq_s * n + decode_per_kv_token_s * L`` seconds
    with ``n`` sequences running that hold ``L`` tokens of context between them (prompt,
    re-prefilled partial output and the tokens decoded so far: attention reads every
    sequence's KV cache once per iteration), so each sequence decodes at
    ``1 / (decode_base_s + decode_per_seq_s * n + decode_per_kv_token_s * L)`` tokens/s.
    ``r(n) = 1 / (decode_base_s + decode_per_seq_s * n)`` (`per_seq_rate`) is the rate
    at zero context, the fastest a sequence ever decodes with ``n`` running.

    Memory: a replica of ``g`` GPUs with memory fraction ``f`` (the engine's
    ``gpu_memory_utilization``: weights plus KV pool) has ``free = g * gpu_memory * f -
    weight_bytes`` for sequences; each running sequence reserves ``kv_tokens_per_seq``
    tokens of KV cache plus the model's fixed per-sequence state, so at most
    ``min(max_num_seqs, floor(free / (kv_tokens_per_seq * kv_bytes_per_token +
    state_bytes_per_seq)))`` sequences run; others wait. A hybrid replica that is awake
    holds this memory on the trainer's GPUs: the trainer cannot train there until it
    sleeps (`SimTrainer`).

    Prefill: ``prefill_s_per_token`` per prompt (and, after an abort, per re-prefilled
    output) token, one request at a time. Prefill and decode share the GPUs (chunked
    prefill adds the prefill chunk's time to the decode iterations), so the replica's
    running sequences make no decode progress while a prefill runs: a request resumed
    after an abort costs the whole replica its re-prefill time.

    Attributes:
        gpus_per_replica: GPUs of one replica (tensor parallel size).
        decode_base_s: Fixed part of one decode iteration.
        decode_per_seq_s: Added per running sequence.
        decode_per_kv_token_s: Added per token of context of the running sequences
            (reading the KV cache; 0: decode speed independent of context length).
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
    decode_per_kv_token_s: float = attrs.field(default=0.0, validator=_nonneg)
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


@attrs.frozen
class TrainerLinks:
    """What the trainer's communication costs read from the other models (bound by
    `TrainerModel.bind`; a `Scenario` binds its trainer to its hardware and model).

    Attributes:
        params: Parameters of the trained model.
        gpus_per_node: GPUs per server (`HardwareModel.gpus_per_node`).
        intra_node_gib_s: Collective bandwidth per GPU inside a server.
        inter_node_gib_s: Collective bandwidth per GPU across servers.
    """

    params: float
    gpus_per_node: int
    intra_node_gib_s: float
    inter_node_gib_s: float

    def bandwidth_b_s(self, gpus: float) -> float:
        """Bytes/s per GPU of a collective over ``gpus`` GPUs (its slowest link)."""
        bw = self.intra_node_gib_s if gpus <= self.gpus_per_node else self.inter_node_gib_s
        return bw * _GIB


@attrs.frozen(kw_only=True)
class TrainerModel:
    """The trainer (actor update + log-prob passes) as a function of its GPU count.

    A micro-step (one optimizer step) over ``tokens`` tokens (prompt + response tokens of
    all responses of its samples) on ``w`` trainer GPUs takes (`step_time_s`)::

        step_overhead_s + compute + bubble + all_reduce + expert_traffic [+ state swap]

    with ``m = min(model_parallel_gpus, w)`` GPUs holding one model copy (tensor x
    pipeline parallel), ``d = w / m`` data-parallel copies and ``p = min(pipeline_stages,
    m)`` pipeline stages:

    - ``compute = gpu_s_per_token * tokens / w``: the work splits evenly;
    - ``bubble = (p - 1) * gpu_s_per_token * min(tokens / w, micro_batch_tokens / m)``:
      the 1F1B pipeline idles ``(p - 1)`` micro-batch times per step (Narayanan et al.,
      SC'21, bubble fraction ``(p - 1) / micro-batches``). Micro-batches hold
      ``micro_batch_tokens`` (dynamic batch size), so a data-parallel copy gets
      ``tokens / (d micro_batch_tokens)`` of them: more GPUs, smaller per-GPU batch,
      fewer micro-batches, a larger share of idle pipeline;
    - ``all_reduce = 2 (d - 1) / d * params * grad_bytes_per_param / m / bw(w)``: the ring
      all-reduce of the gradients across the data-parallel copies (each GPU holds ``1/m``
      of them) over NVLink inside one server, the inter-node links beyond
      (`TrainerLinks.bandwidth_b_s`);
    - ``expert_traffic = tokens / w * moe_alltoall_bytes_per_token * (e - 1) / e /
      bw(e)`` with ``e = min(expert_parallel_gpus, w)``: the MoE token dispatch and
      combine all-to-alls (0 for a dense model, ``expert_parallel_gpus = 1``).

    At ``w = 1`` (or with the defaults: one GPU per model copy, no pipeline, no experts,
    and a single GPU) every term but ``compute`` is 0: ``step_overhead_s +
    gpu_s_per_token * tokens``. The communication terms need the model's parameter count
    and the links (`bind`); an unbound model has none. With ``offload_state`` the reload
    and offload of the trainer's state is added (`state_swap_s`); the step is split into
    verl's timing keys by ``phase_shares``.

    Attributes:
        gpu_s_per_token: GPU-seconds of training compute per token.
        step_overhead_s: Fixed, non-scaling part of a micro-step.
        offload_state: The trainer moves its weights, gradients and optimizer state to
            host memory after every step and back before the next one (Megatron's
            ``param_offload``/``grad_offload``/``optimizer_offload``), so its GPUs are
            free between steps. When False the state stays resident and must fit next
            to an awake hybrid replica.
        phase_shares: Share of a step per timing key (sums to 1).
        model_parallel_gpus: GPUs holding one copy of the model (tensor x pipeline
            parallel size); the rest is data parallel.
        pipeline_stages: Pipeline-parallel size.
        micro_batch_tokens: Tokens per micro-batch (per data-parallel copy).
        grad_bytes_per_param: Bytes per parameter the data-parallel gradient reduction
            moves (4: fp32 gradients).
        expert_parallel_gpus: Expert-parallel size (1: no expert parallelism).
        moe_alltoall_bytes_per_token: Bytes one token sends through the expert
            all-to-alls in one step (every MoE layer, dispatch and combine, forward and
            backward passes).
        links: The parameter count and links the communication terms read (`bind`).
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
    model_parallel_gpus: int = attrs.field(default=1, validator=_posint)
    pipeline_stages: int = attrs.field(default=1, validator=_posint)
    micro_batch_tokens: float = attrs.field(default=16384.0, validator=_pos)
    grad_bytes_per_param: float = attrs.field(default=4.0, validator=_nonneg)
    expert_parallel_gpus: int = attrs.field(default=1, validator=_posint)
    moe_alltoall_bytes_per_token: float = attrs.field(default=0.0, validator=_nonneg)
    links: TrainerLinks | None = attrs.field(default=None, eq=False, repr=False)

    def bind(self, hw: HardwareModel, llm: LLMModel) -> TrainerModel:
        """A copy whose communication terms read ``llm``'s parameters and ``hw``'s links."""
        links = TrainerLinks(
            params=llm.params_b * 1e9,
            gpus_per_node=hw.gpus_per_node,
            intra_node_gib_s=hw.intra_node_bandwidth_gib_s,
            inter_node_gib_s=hw.inter_node_bandwidth_gib_s,
        )
        return self if links == self.links else attrs.evolve(self, links=links)

    def _split(self, gpus: float) -> tuple[float, float, float]:
        """``(m, d, p)``: GPUs per model copy, data-parallel copies, pipeline stages."""
        m = min(float(self.model_parallel_gpus), gpus)
        return m, gpus / m, min(float(self.pipeline_stages), m)

    def compute_s(self, gpus: float, tokens: float) -> float:
        """``gpu_s_per_token * tokens / gpus``: the evenly split work."""
        return self.gpu_s_per_token * tokens / gpus

    def bubble_s(self, gpus: float, tokens: float) -> float:
        """Idle pipeline time of one step (the per-GPU micro-batch effect, above)."""
        m, _, p = self._split(gpus)
        return (p - 1.0) * self.gpu_s_per_token * min(tokens / gpus, self.micro_batch_tokens / m)

    def all_reduce_s(self, gpus: float) -> float:
        """Ring all-reduce of the gradients over the data-parallel copies (0 unbound)."""
        if self.links is None:
            return 0.0
        m, d, _ = self._split(gpus)
        shard = self.links.params * self.grad_bytes_per_param / m
        return 2.0 * (d - 1.0) / d * shard / self.links.bandwidth_b_s(gpus)

    def expert_traffic_s(self, gpus: float, tokens: float) -> float:
        """Expert-parallel all-to-all time of one step (0 dense or unbound)."""
        e = min(float(self.expert_parallel_gpus), gpus)
        if self.links is None or e <= 1.0:
            return 0.0
        sent = tokens / gpus * self.moe_alltoall_bytes_per_token * (e - 1.0) / e
        return sent / self.links.bandwidth_b_s(e)

    def step_time_s(self, gpus: float, tokens: float, swap_s: float = 0.0) -> float:
        """Duration of one micro-step on ``gpus`` GPUs (``swap_s``: `state_swap_s`)."""
        if gpus <= 0:
            raise ValueError(f"TrainerModel.step_time_s: gpus must be > 0, got {gpus}")
        return (
            self.step_overhead_s
            + self.compute_s(gpus, tokens)
            + self.bubble_s(gpus, tokens)
            + self.all_reduce_s(gpus)
            + self.expert_traffic_s(gpus, tokens)
            + swap_s
        )

    def step_s(self, tokens: int, gpus: int, swap_s: float = 0.0) -> float:
        """`step_time_s` with the arguments in the older order (tokens first)."""
        return self.step_time_s(gpus, tokens, swap_s)

    def linear_lower(self, gpus: int, min_tokens: float = 0.0) -> tuple[float, float]:
        """``(fixed_s, per_token_s)`` with ``step_time_s(gpus, K) >= fixed_s + per_token_s
        * K`` for every ``K >= min_tokens`` (the lower bound's trainer; swap excluded). The
        bubble grows with ``K`` (concave), so its value at ``min_tokens`` is in the fixed
        part."""
        fixed = self.step_overhead_s + self.all_reduce_s(gpus) + self.bubble_s(gpus, min_tokens)
        per_token = self.compute_s(gpus, 1.0) + self.expert_traffic_s(gpus, 1.0)
        return fixed, per_token

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
