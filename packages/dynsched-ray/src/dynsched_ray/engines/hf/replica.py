"""`HFReplica`: a small real rollout engine over a ``transformers`` causal LM.

It implements the core `RolloutReplica` protocol by sampling token after token from the
model (with its KV cache), so it returns real tokens and the engine's per-token
log-probabilities, honours aborts between tokens, continues a partial output, and loads
new weights (safetensors bytes in Hugging Face names, as the trainers export them).
It exists next to `VLLMReplica` for runs where starting vLLM engines costs more than the
run itself (tiny models on a CPU: CI, the comparison script); it has no batching, no
paged attention and no memory to give back on ``sleep`` (like vLLM on CPU: sleep only
stops serving).

Sampling is reproducible per request: the random generator of an attempt is seeded from
``(seed, request_id, partial_len)``, so the same request continued at the same point
draws the same tokens whatever else runs on the replica.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from dynsched_core import GenerateRequest, GenerateResult, ReplicaCapabilities
from dynsched_core.rollout import ReplicaIdentity

from dynsched_ray.engines.lifecycle import ReplicaLifecycle, mark_aborted

__all__ = ["HFReplica"]


def _result_fields() -> frozenset[str]:
    return frozenset(a.name for a in attrs.fields(GenerateResult))


class HFReplica(ReplicaIdentity):
    """A `RolloutReplica` that samples from a Hugging Face causal LM (float32).

    Args:
        replica_id: Stable id.
        model: Hugging Face model folder.
        role: ``"standalone"`` (starts awake) or ``"hybrid"`` (starts asleep).
        num_gpus: Reported in the capabilities.
        temperature: Sampling temperature (0: greedy).
        seed: Base seed of the per-request generators.
        eos_token_id: Stop token (default: the model config's).
        device: Torch device (``"cpu"``, ``"cuda"``, ``"auto"``).
        yield_every: Give the event loop a turn every this many tokens (aborts and
            other requests interleave there).
    """

    def __init__(
        self,
        replica_id: str,
        *,
        model: str | Path,
        role: str = "standalone",
        num_gpus: int = 1,
        temperature: float = 1.0,
        seed: int = 0,
        eos_token_id: int | None = None,
        device: str = "cpu",
        yield_every: int = 1,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from dynsched_ray.runtime.model_files import hf_model_folder

        if role not in ("standalone", "hybrid"):
            raise ValueError(f"HFReplica.role must be 'standalone' or 'hybrid', got {role!r}")
        if temperature < 0:
            raise ValueError(f"HFReplica.temperature must be >= 0, got {temperature!r}")
        self._id = replica_id
        self._caps = ReplicaCapabilities(role=role, num_gpus=num_gpus)  # type: ignore[arg-type]
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        # a local folder only, as the trainers load (never a download from a model hub)
        folder = hf_model_folder(model, "HFReplica")
        self.model = AutoModelForCausalLM.from_pretrained(  # nosec B615: a local folder (local_files_only), no download
            str(folder), dtype=torch.float32, local_files_only=True
        )
        self.model.to(self.device).eval()
        eos = eos_token_id if eos_token_id is not None else self.model.config.eos_token_id
        self.eos_token_id = int(eos) if eos is not None else None
        self.temperature = float(temperature)
        self.seed = int(seed)
        self.yield_every = max(1, int(yield_every))
        self._life = ReplicaLifecycle(replica_id, asleep=role == "hybrid")
        self._version = 0
        self._abort: dict[str, bool] = {}
        self._fields = _result_fields()
        self.generated_tokens = 0

    # ------------------------------------------------------------------ protocol
    # replica_id, capabilities, role: from `ReplicaIdentity`
    @property
    def weights_version(self) -> int:
        """Version of the loaded weights."""
        return self._version

    def _generator(self, request: GenerateRequest) -> Any:
        import torch

        key = f"{self.seed}:{request.request_id}:{request.partial_len}".encode()
        g = torch.Generator(device="cpu")
        g.manual_seed(int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % (2**63))
        return g

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Sample up to ``max_tokens`` tokens after the prompt and ``partial_output``.

        Raises:
            ReplicaNotReadyError: asleep or paused.
        """
        import torch

        rid = request.request_id
        self._life.require_serving(f"generate({rid!r})")
        if rid in self._abort:
            raise RuntimeError(f"request {rid!r} is already running on replica {self._id!r}")
        prompt = request.prompt
        if not isinstance(prompt, Sequence) or isinstance(prompt, str | bytes) or not prompt:
            raise ValueError(
                f"HFReplica needs GenerateRequest.prompt as token ids, got {type(prompt).__name__}"
            )
        self._abort[rid] = False
        tokens: list[int] = []
        logprobs: list[float] = []
        reason = "length"
        version = self._version
        gen = self._generator(request)
        cuts: list[tuple[int, int]] = []  # (tokens so far, version that made them)
        try:
            context = torch.tensor([[*prompt, *request.partial_output]], device=self.device)
            past = None
            for n in range(request.max_tokens):
                if self._abort.get(rid):
                    reason = "abort"
                    break
                with torch.no_grad():
                    out = self.model(input_ids=context, past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
                logp = torch.log_softmax(logits, dim=-1)
                if self.temperature == 0:
                    tok = int(torch.argmax(logits))
                else:
                    probs = torch.softmax(logits / self.temperature, dim=-1).cpu()
                    tok = int(torch.multinomial(probs, 1, generator=gen))
                tokens.append(tok)
                logprobs.append(float(logp[tok]))
                context = torch.tensor([[tok]], device=self.device)
                if tok == self.eos_token_id:
                    reason = "stop"
                    break
                if (n + 1) % self.yield_every == 0:
                    await asyncio.sleep(0)
                if self._version != version:
                    # new weights arrived: prefill again under them (the KV cache is stale)
                    cuts.append((len(tokens), version))
                    version = self._version
                    context = torch.tensor(
                        [[*prompt, *request.partial_output, *tokens]], device=self.device
                    )
                    past = None
        finally:
            self._abort.pop(rid, None)
        self.generated_tokens += len(tokens)
        kw: dict[str, Any] = {}
        if "output_logprobs" in self._fields:
            kw["output_logprobs"] = tuple(logprobs)
        if cuts and "segments" in self._fields:
            kw["segments"] = self._segments(tokens, logprobs, [*cuts, (len(tokens), version)])
        return GenerateResult(
            request_id=rid,
            replica_id=self._id,
            output_tokens=tuple(tokens),
            num_tokens=len(tokens),
            finish_reason=reason,  # type: ignore[arg-type]
            param_version=version,
            **kw,
        )

    def _segments(
        self, tokens: list[int], logprobs: list[float], cuts: list[tuple[int, int]]
    ) -> tuple[Any, ...]:
        """Version-stamped runs of an attempt whose weights changed while it ran."""
        from dynsched_core import _protocols

        segment = _protocols.TokenSegment
        out, start = [], 0
        for end, version in cuts:
            if end > start:
                out.append(
                    segment(
                        num_tokens=end - start,
                        param_version=version,
                        output_tokens=tuple(tokens[start:end]),
                        output_logprobs=tuple(logprobs[start:end]),
                        replica_id=self._id,
                    )
                )
            start = end
        return tuple(out)

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort running requests (all when None); return how many."""
        return mark_aborted(self._abort, request_ids)

    async def sleep(self) -> None:
        """Abort what runs and stop serving (no memory is given back)."""
        self._life.apply("pause")
        await self.abort(None)
        self._life.apply("sleep")

    async def wake_up(self) -> None:
        """Serve again after `resume`."""
        self._life.apply("wake_up")

    async def resume(self) -> None:
        """Accept generation requests.

        Raises:
            ReplicaNotReadyError: asleep.
        """
        self._life.apply("resume")

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load ``weights`` (safetensors bytes or a name -> tensor mapping) as ``version``.

        ``weights=None`` keeps the loaded weights and only records the version.
        """
        if weights is not None:
            self.load_weights(weights)
        self._version = int(version)

    def load_weights(self, weights: bytes | Mapping[str, Any]) -> None:
        """Copy weights in Hugging Face names into the model (every parameter required)."""
        import torch

        if isinstance(weights, bytes | bytearray):
            from safetensors.torch import load

            loaded: Mapping[str, Any] = load(bytes(weights))
            weights = loaded
        state = dict(weights)
        params = dict(self.model.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise ValueError(f"HFReplica.update_weights: weights lack {missing[:5]}")
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(state[name].to(p.device, p.dtype))

    async def in_flight(self) -> int:
        """Requests generating now."""
        return len(self._abort)
