"""`MegatronTrainer`: megatron-core's ``GPTModel`` trained on the shared RL objective.

The model is Megatron's GPT with local (non Transformer-Engine) layer specs and the
shapes of a Hugging Face Llama folder (RMSNorm, SwiGLU, rotary embeddings, grouped-query
attention, no biases, untied embeddings); its weights are loaded from that folder
through `hf_llama_to_megatron` and exported with `megatron_to_hf_llama`.

One process is one rank; tensor and pipeline parallel size are 1, and the data-parallel
size is the world size of the default process group (1 unless the process joined a
group first, as the Ray trainer workers do).

**On a GPU** it runs as Megatron runs: NCCL process group, ``parallel_state``, the CUDA
RNG tracker seeded by ``model_parallel_cuda_manual_seed``, Megatron's
``DistributedDataParallel`` (contiguous gradient buffer) and ``get_megatron_optimizer``
(Adam with decoupled weight decay and Megatron's gradient clipping). Offload frees the
DDP parameter and gradient buffers (``offload_to_cpu`` of each buffer: pinned host copy,
storage resized to 0) and moves the optimizer state to pinned host memory.

**On CPU** megatron-core builds the model and runs forward and backward, but several of
its pieces allocate on CUDA unconditionally. The CPU-only substitutes, each the smallest
that works, are (`CPU_SUBSTITUTES` lists them for reports):

1. ``torch.distributed`` with the **gloo** backend and an in-process ``HashStore``
   (GPU: NCCL) — ``parallel_state.initialize_model_parallel(1, 1)`` needs a process group.
2. ``parallel_state``'s global memory buffer replaced by `_CpuMemoryBuffer`, which
   allocates on CPU (megatron's ``GlobalMemoryBuffer.get_tensor`` allocates on
   ``torch.cuda.current_device()``; the attention core uses it for its score matrix).
3. The model-parallel RNG tracker replaced by `_CpuRngTracker`, whose ``fork`` swaps the
   CPU generator state (megatron's ``CudaRNGStatesTracker`` stores CUDA generator states;
   the attention core forks it around attention dropout).
4. The model's ``RotaryEmbedding`` switched to `_CpuRotaryEmbedding`, which computes the
   rotary table where its ``inv_freq`` lives (megatron's ``get_emb`` moves ``inv_freq`` to
   ``torch.cuda.current_device()``).
5. An explicit causal attention mask is passed to the forward (megatron builds its
   default mask with ``device="cuda"``).
6. A plain ``torch.optim.AdamW`` over the model's parameters, with
   ``torch.nn.utils.clip_grad_norm_``, instead of Megatron's DDP and
   ``get_megatron_optimizer`` (both allocate their buffers on CUDA), and the
   gradient-accumulation loop of `RLTrainerBase` instead of Megatron's
   ``forward_backward_no_pipelining`` (it counts tokens in a CUDA tensor). With one rank
   and float32 parameters Megatron's DDP and optimizer reduce to exactly this.
7. Offload through ``TensorOffloader`` (the same code as `TorchTrainer`): Megatron's
   buffer offload pins host memory, which needs CUDA.

Items 1-5 are process-wide and installed once (idempotently) by
`init_megatron_runtime`.
"""

from __future__ import annotations

import contextlib
import logging
import operator
from collections.abc import Iterator, Mapping
from functools import reduce
from pathlib import Path
from typing import Any

import torch

from dynsched_ray.trainers.base import (
    Offloader,
    RLTrainerBase,
    TrainerOffloadedError,
    TrainerOptions,
    optimizer_bytes,
    tensor_bytes,
)
from dynsched_ray.trainers.megatron.convert import (
    LlamaShape,
    hf_llama_to_megatron,
    megatron_to_hf_llama,
)

__all__ = ["CPU_SUBSTITUTES", "MegatronTrainer", "init_megatron_runtime"]

logger = logging.getLogger(__name__)

CPU_SUBSTITUTES = (
    "torch.distributed gloo backend with an in-process HashStore (GPU: NCCL)",
    "parallel_state global memory buffer allocating on CPU (GPU: GlobalMemoryBuffer on CUDA)",
    "model-parallel RNG tracker over the CPU generator (GPU: CudaRNGStatesTracker)",
    "RotaryEmbedding computing its table on CPU (GPU: megatron moves inv_freq to CUDA)",
    "explicit causal attention mask in the forward (GPU: megatron's default CUDA mask)",
    "torch.optim.AdamW + clip_grad_norm_ and a plain accumulation loop "
    "(GPU: Megatron DDP + get_megatron_optimizer)",
    "TensorOffloader for offload/reload (GPU: DDP buffer offload_to_cpu + optimizer state moves)",
)

_RNG_NAMES = ("model-parallel-rng", "data-parallel-rng", "expert-parallel-rng")


def _megatron_classes() -> tuple[Any, Any, Any]:
    import warnings

    with warnings.catch_warnings():
        # megatron-core warns at import when Transformer Engine / Apex are absent
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core import parallel_state
        from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
        from megatron.core.tensor_parallel import random as mrandom
    return parallel_state, RotaryEmbedding, mrandom


def _cpu_classes() -> tuple[type, type, type]:
    from megatron.core.utils import GlobalMemoryBuffer

    parallel_state, rotary_cls, mrandom = _megatron_classes()
    del parallel_state

    class _CpuMemoryBuffer(GlobalMemoryBuffer):  # type: ignore[misc]
        """``GlobalMemoryBuffer`` that allocates on CPU."""

        def get_tensor(
            self, tensor_shape: Any, dtype: torch.dtype, name: str, mem_alloc_context: Any = None
        ) -> torch.Tensor:
            need = reduce(operator.mul, tensor_shape, 1)
            buf = self.buffer.get((name, dtype))
            if buf is None or buf.numel() < need:
                buf = torch.empty(need, dtype=dtype, device="cpu", requires_grad=False)
                self.buffer[(name, dtype)] = buf
            return buf[:need].view(*tensor_shape)

    class _CpuRngTracker(mrandom.CudaRNGStatesTracker):  # type: ignore[misc,name-defined]
        """``CudaRNGStatesTracker`` over the CPU generator."""

        def add(self, name: str, seed: int) -> None:
            if seed in self.seeds_:
                raise RuntimeError(f"seed {seed} already exists")
            if name in self.states_:
                raise RuntimeError(f"rng state {name} already exists")
            self._is_initialized = True
            self.seeds_.add(seed)
            gen = torch.Generator(device="cpu")
            gen.manual_seed(seed)
            self.states_[name] = gen.get_state()

        @contextlib.contextmanager
        def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
            if name not in self.states_:
                raise RuntimeError(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    class _CpuRotaryEmbedding(rotary_cls):  # type: ignore[misc,valid-type]
        """``RotaryEmbedding`` whose table is computed where ``inv_freq`` lives."""

        def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
            freqs = self.get_freqs_non_repeated(max_seq_len, offset)
            if not self.rotary_interleaved:
                emb = torch.cat((freqs, freqs), dim=-1)
            else:
                emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(
                    freqs.shape[0], -1
                )
            return emb[:, None, None, :]

    return _CpuMemoryBuffer, _CpuRngTracker, _CpuRotaryEmbedding


def init_megatron_runtime(device: torch.device, *, seed: int = 1234) -> None:
    """Set up megatron-core for this rank (tp = pp = 1); idempotent.

    Without a default process group it creates a one-rank group; with one (a
    data-parallel group the caller joined first) every rank is a data-parallel rank. On
    CPU also installs the CPU substitutes 1-3 of the module docstring.
    """
    import torch.distributed as dist

    parallel_state, _rotary, mrandom = _megatron_classes()
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    if device.type == "cuda":
        if not mrandom.get_cuda_rng_tracker().is_initialized():
            mrandom.model_parallel_cuda_manual_seed(seed)
        return
    mem_cls, tracker_cls, _ = _cpu_classes()
    if type(parallel_state._GLOBAL_MEMORY_BUFFER).__name__ != mem_cls.__name__:
        parallel_state._GLOBAL_MEMORY_BUFFER = mem_cls()
    if type(mrandom._CUDA_RNG_STATE_TRACKER).__name__ != tracker_cls.__name__:
        tracker = tracker_cls()
        for i, name in enumerate(_RNG_NAMES):
            tracker.add(name, seed + 2718 * (i + 1))
        mrandom._CUDA_RNG_STATE_TRACKER = tracker
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True


def _transformer_config(shape: LlamaShape, device: torch.device) -> Any:
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(
        num_layers=shape.num_layers,
        hidden_size=shape.hidden_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads,
        kv_channels=shape.head_dim,
        ffn_hidden_size=shape.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=shape.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=torch.float32,
        use_cpu_initialization=device.type == "cpu",
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        cuda_graph_scope=[],
    )


class _MegatronGpuOffloader(Offloader):
    """Offload of Megatron's DDP buffers and optimizer state (GPU only)."""

    def __init__(self, ddp: Any, optimizer: Any, device: torch.device) -> None:
        self.ddp = ddp
        self.optimizer = optimizer
        self.device = device
        self.params = [p for _, p in ddp.named_parameters()]
        self._moved: list[tuple[dict[str, Any], str]] = []

    def _buffers(self) -> list[Any]:
        return list(self.ddp.buffers) + list(getattr(self.ddp, "expert_parallel_buffers", []))

    def _torch_optimizers(self) -> list[torch.optim.Optimizer]:
        chained = getattr(self.optimizer, "chained_optimizers", None)
        opts = chained if chained is not None else [self.optimizer]
        return [o.optimizer for o in opts if getattr(o, "optimizer", None) is not None]

    def param_host(self, index: int) -> torch.Tensor:
        raise TrainerOffloadedError(
            "MegatronTrainer on GPU exports and checkpoints only while resident: call reload()"
        )

    def memory(self) -> tuple[int, int]:
        dev = host = 0
        for buf in self._buffers():
            for name in ("param_data", "grad_data"):
                t = getattr(buf, name, None)
                if t is not None:
                    dev += t.untyped_storage().nbytes()
            cpu = getattr(buf, "param_data_cpu", None)
            if cpu is not None:
                host += tensor_bytes(cpu)
        for opt in self._torch_optimizers():
            opt_dev, opt_host = optimizer_bytes(opt, lambda t: t.device.type == "cuda")
            dev, host = dev + opt_dev, host + opt_host
        return dev, host

    def _offload(self) -> int:
        torch.cuda.synchronize(self.device)
        moved = 0
        for buf in self._buffers():
            moved += tensor_bytes(getattr(buf, "param_data", None))
            buf.offload_to_cpu(move_params=True, move_grads=True)
        self._moved = []
        for opt in self._torch_optimizers():
            for state in opt.state.values():
                for key, t in list(state.items()):
                    if torch.is_tensor(t) and t.device.type == "cuda":
                        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                        host.copy_(t, non_blocking=True)
                        state[key] = host
                        moved += tensor_bytes(t)
                        self._moved.append((state, key))
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        return moved

    def _reload(self) -> int:
        moved = 0
        for buf in self._buffers():
            buf.reload_from_cpu(move_params=True, move_grads=True)
            moved += tensor_bytes(getattr(buf, "param_data", None))
        for state, key in self._moved:
            state[key] = state[key].to(self.device, non_blocking=True)
            moved += tensor_bytes(state[key])
        self._moved = []
        torch.cuda.synchronize(self.device)
        return moved


class MegatronTrainer(RLTrainerBase):
    """Implements the core `Trainer` over megatron-core's ``GPTModel`` (float32).

    Args:
        model: Folder of a Hugging Face Llama model; its shapes and weights are loaded
            into Megatron's layout.
        options: Optimizer and step settings (``device="cuda"`` for the GPU path).
        seed: Seed of Megatron's RNG tracker.

    Attributes:
        shape: The model's shapes.
        model: The ``GPTModel`` (on GPU wrapped in Megatron's DDP).
        cpu_substitutes: The CPU-only substitutes in use (empty on GPU).
    """

    #: ``parallel_state`` holds the groups of the world it was built in
    rebuild_on_resize = True

    def __init__(
        self, model: str | Path, options: TrainerOptions | None = None, *, seed: int = 1234
    ) -> None:
        import warnings

        from safetensors.torch import load_file

        path = self._setup(model, options, kind="Llama")
        self.shape = LlamaShape.from_hf_config(path)
        import json

        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
        pad = cfg.get("pad_token_id")
        self.pad_token_id = int(pad) if pad is not None else 0
        init_megatron_runtime(self.device, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            from megatron.core.models.gpt import GPTModel
            from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        tcfg = _transformer_config(self.shape, self.device)
        gpt = GPTModel(
            config=tcfg,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            vocab_size=self.shape.vocab_size,
            max_sequence_length=self.shape.max_position_embeddings,
            position_embedding_type="rope",
            rotary_base=int(self.shape.rope_theta)
            if float(self.shape.rope_theta).is_integer()
            else self.shape.rope_theta,
            share_embeddings_and_output_weights=False,
        )
        files = sorted(path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors weights in {str(path)!r}")
        hf: dict[str, torch.Tensor] = {}
        for f in files:
            hf.update(load_file(str(f)))
        self._gpt = gpt
        self._load_named(hf_llama_to_megatron(hf, self.shape))
        opt = self.options
        if self.device.type == "cpu":
            _, _, rotary_cls = _cpu_classes()
            gpt.rotary_pos_emb.__class__ = rotary_cls
            self.model = gpt
            self.cpu_substitutes: tuple[str, ...] = CPU_SUBSTITUTES
            self.optimizer = opt.adamw(gpt.parameters())
            self._megatron_opt: Any = None
            self._init_offloader()
        else:
            self._init_gpu(gpt, tcfg)
        self.model.train()
        self._version = 0
        self._masks: dict[int, torch.Tensor] = {}

    def _init_gpu(self, gpt: Any, tcfg: Any) -> None:
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        gpt.to(self.device)
        self.cpu_substitutes = ()
        ddp = DistributedDataParallel(
            config=tcfg,
            ddp_config=DistributedDataParallelConfig(
                grad_reduce_in_fp32=True, overlap_grad_reduce=False, use_distributed_optimizer=False
            ),
            module=gpt,
        )
        opt = self.options
        self._megatron_opt = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=opt.lr,
                weight_decay=opt.weight_decay,
                adam_beta1=opt.betas[0],
                adam_beta2=opt.betas[1],
                adam_eps=opt.adam_eps,
                clip_grad=opt.max_grad_norm,
                bf16=False,
                fp16=False,
                use_distributed_optimizer=False,
            ),
            [ddp],
        )
        self.model = ddp
        # checkpoints and the base class read the wrapped torch optimizer
        torch_opts = _MegatronGpuOffloader(ddp, self._megatron_opt, self.device)._torch_optimizers()
        self.optimizer = torch_opts[0]
        self._offloader = _MegatronGpuOffloader(ddp, self._megatron_opt, self.device)

    def leave_group(self) -> None:
        """Drop megatron-core's ``parallel_state`` groups (before an elastic resize leaves the
        default group; the trainer is built again on the new one)."""
        parallel_state, _rotary, _mrandom = _megatron_classes()
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()

    # ------------------------------------------------------------------ base-class hooks
    def _params(self) -> list[torch.nn.Parameter]:
        return list(self._gpt.parameters())

    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        return list(self._gpt.named_parameters())

    def _causal_mask(self, length: int) -> torch.Tensor:
        mask = self._masks.get(length)
        if mask is None:
            mask = torch.triu(
                torch.ones(length, length, dtype=torch.bool, device=self.device), diagonal=1
            )[None, None]
            self._masks = {length: mask}
        return mask

    def _logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        b, length = input_ids.shape
        pos = torch.arange(length, device=input_ids.device).unsqueeze(0).expand(b, -1)
        out: torch.Tensor = self.model(input_ids, pos, attention_mask=self._causal_mask(length))
        return out

    def _hf_weights(self, named: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return megatron_to_hf_llama(named, self.shape)

    def _zero_grad(self) -> None:
        if self._megatron_opt is None:
            super()._zero_grad()
            return
        self.model.zero_grad_buffer()
        self._megatron_opt.zero_grad()

    def _clip_and_step(self) -> float:
        if self._megatron_opt is None:
            return super()._clip_and_step()
        self.model.finish_grad_sync()
        ok, grad_norm, _zeros = self._megatron_opt.step()
        if not ok:
            logger.warning("Megatron optimizer skipped the update (non-finite gradients)")
        return float(grad_norm) if grad_norm is not None else float("nan")

    def logits(self, input_ids: Any) -> torch.Tensor:
        """Forward pass without gradient: ``[B, L, V]`` logits of ``[B, L]`` token ids."""
        self._require_resident("logits")
        ids = torch.as_tensor(input_ids, dtype=torch.long, device=self.device)
        with torch.no_grad():
            return self._logits(ids)
