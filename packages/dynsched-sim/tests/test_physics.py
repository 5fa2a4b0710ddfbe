"""The instrument's physics (issue 29, item 5): the trainer's time against its GPU count,
context-dependent decode, the cost of a re-prefill, and honest sleep / wake-up states."""

from __future__ import annotations

import asyncio
import math

import attrs
import pytest
from dynsched_core import GenerateRequest
from dynsched_sim import (
    EngineModel,
    GroupAccountant,
    HardwareModel,
    LLMModel,
    ReplicaNotServingError,
    SimReplica,
    TrainerModel,
    VirtualTimeEventLoop,
    load_scenario,
    run_virtual,
)
from hypothesis import example, given
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

# ------------------------------------------------------------------------ trainer physics
trainers = st.builds(
    TrainerModel,
    gpu_s_per_token=st.floats(1e-5, 1e-2),
    step_overhead_s=st.floats(0.0, 30.0),
    model_parallel_gpus=st.sampled_from([1, 2, 4, 8, 16]),
    pipeline_stages=st.sampled_from([1, 2, 4]),
    micro_batch_tokens=st.floats(1024.0, 131072.0),
    grad_bytes_per_param=st.sampled_from([2.0, 4.0]),
    expert_parallel_gpus=st.sampled_from([1, 4, 8, 16]),
    moe_alltoall_bytes_per_token=st.floats(0.0, 2e7),
)
hardware = st.builds(
    HardwareModel,
    gpus_per_node=st.sampled_from([4, 8]),
    intra_node_bandwidth_gib_s=st.floats(50.0, 500.0),
    inter_node_bandwidth_gib_s=st.floats(5.0, 100.0),
)
llms = st.builds(LLMModel, params_b=st.floats(1.0, 200.0))
tokens = st.integers(1, 4_000_000)


@given(trainers, hardware, llms, tokens, st.floats(0.0, 20.0))
def test_one_gpu_is_todays_single_gpu_time(
    tr: TrainerModel, hw: HardwareModel, llm: LLMModel, k: int, swap: float
) -> None:
    """w = 1: no pipeline, no data-parallel copy, no expert peer: overhead + c K + swap."""
    bound = tr.bind(hw, llm)
    assert bound.step_time_s(1, k, swap) == tr.step_overhead_s + tr.gpu_s_per_token * k + swap


@given(st.floats(1e-5, 1e-2), st.floats(0.0, 30.0), st.integers(1, 512), tokens)
def test_default_trainer_is_the_linear_model(c: float, o: float, w: int, k: int) -> None:
    """Unbound, with the defaults (one GPU per copy, no pipeline, dense): the old formula."""
    tr = TrainerModel(gpu_s_per_token=c, step_overhead_s=o)
    assert tr.step_s(k, w, 3.0) == o + c * k / w + 3.0


@given(trainers, hardware, llms, tokens, st.integers(1, 256))
def test_monotone_in_tokens_and_the_bound_stays_below(
    tr: TrainerModel, hw: HardwareModel, llm: LLMModel, k: int, w: int
) -> None:
    bound = tr.bind(hw, llm)
    assert bound.step_time_s(w, k + 1000) >= bound.step_time_s(w, k)
    fixed, per_token = bound.linear_lower(w)
    assert fixed + per_token * k <= bound.step_time_s(w, k) * (1 + 1e-12)
    fixed, per_token = bound.linear_lower(w, k // 2)  # valid for every K >= k // 2
    assert fixed + per_token * k <= bound.step_time_s(w, k) * (1 + 1e-12)
    assert fixed + per_token * (k // 2) == pytest.approx(bound.step_time_s(w, k // 2), rel=1e-9)


@given(trainers, tokens, st.integers(1, 255))
def test_work_terms_shrink_with_more_gpus(tr: TrainerModel, k: int, w: int) -> None:
    """Compute plus pipeline bubble never grows when GPUs are added (no communication)."""
    assert tr.compute_s(w + 1, k) + tr.bubble_s(w + 1, k) <= (
        tr.compute_s(w, k) + tr.bubble_s(w, k)
    ) * (1 + 1e-12)


@given(trainers, hardware, st.floats(1.0, 100.0), st.floats(1.01, 4.0), st.integers(2, 64))
def test_all_reduce_grows_with_params_and_shrinks_with_bandwidth(
    tr: TrainerModel, hw: HardwareModel, params_b: float, factor: float, d: int
) -> None:
    w = tr.model_parallel_gpus * d
    small = tr.bind(hw, LLMModel(params_b=params_b)).all_reduce_s(w)
    big = tr.bind(hw, LLMModel(params_b=params_b * factor)).all_reduce_s(w)
    assert big > small > 0
    faster = attrs.evolve(
        hw,
        intra_node_bandwidth_gib_s=hw.intra_node_bandwidth_gib_s * factor,
        inter_node_bandwidth_gib_s=hw.inter_node_bandwidth_gib_s * factor,
    )
    assert tr.bind(faster, LLMModel(params_b=params_b)).all_reduce_s(w) < small
    # ring all-reduce: 2 (d - 1) / d of each GPU's gradient shard over the slowest link
    shard = params_b * 1e9 * tr.grad_bytes_per_param / tr.model_parallel_gpus
    bw = hw.intra_node_bandwidth_gib_s if w <= hw.gpus_per_node else hw.inter_node_bandwidth_gib_s
    assert small == pytest.approx(2 * (d - 1) / d * shard / (bw * 2**30), rel=1e-12)


def test_all_reduce_is_zero_for_one_copy_and_unbound() -> None:
    tr = TrainerModel(model_parallel_gpus=8).bind(HardwareModel(), LLMModel())
    assert tr.all_reduce_s(8) == 0.0 and tr.all_reduce_s(16) > 0.0
    assert TrainerModel(model_parallel_gpus=8).all_reduce_s(16) == 0.0


def test_the_seed_scenario_binds_its_trainer() -> None:
    """The scenario's trainer reads the scenario's parameters and links, and a changed
    model re-binds it (so the simulator, the bound and the planner use one curve)."""
    sc = load_scenario("seed-qwen35")
    assert sc.trainer.links is not None and sc.trainer.links.params == 35e9
    bigger = sc.with_values(model={"params_b": 70.0})
    assert bigger.trainer.all_reduce_s(16) == pytest.approx(2 * sc.trainer.all_reduce_s(16))
    # 8 -> 16 GPUs: the bubble and the all-reduce do not scale, so less than 2x
    k = 128 * 8000
    assert 1.5 < sc.trainer.step_time_s(8, k) / sc.trainer.step_time_s(16, k) < 2.0


# ------------------------------------------------------------------------ replica physics
def _engine(kv: float = 0.0, prefill: float = 0.0, cap: int = 8) -> EngineModel:
    return EngineModel(
        gpus_per_replica=1,
        decode_base_s=0.01,
        decode_per_seq_s=0.002,
        decode_per_kv_token_s=kv,
        prefill_s_per_token=prefill,
        max_num_seqs=cap,
        kv_tokens_per_seq=64.0,
    )


def _finish_times(engine: EngineModel, jobs: list[tuple[float, int, int, int]]) -> list[float]:
    """Run ``(arrival, prompt, partial, tokens)`` requests on one replica; finish times."""
    out = [0.0] * len(jobs)

    async def main() -> None:
        rep = SimReplica("r", engine, HardwareModel(), LLMModel(params_b=1.0))
        loop = asyncio.get_running_loop()

        async def one(i: int, at: float, prompt: int, partial: int, n: int) -> None:
            await asyncio.sleep(at)
            req = GenerateRequest(
                request_id=f"q{i}",
                prompt_len=prompt,
                max_tokens=n,
                target_len=partial + n,
                partial_len=partial,
            )
            await rep.generate(req)
            out[i] = loop.time()

        await asyncio.gather(*(one(i, *j) for i, j in enumerate(jobs)))

    run_virtual(main())
    return out


def _iterations(engine: EngineModel, jobs: list[tuple[float, int, int, int]]) -> list[float]:
    """Per-iteration reference (no prefill, cap above the jobs): every iteration takes
    ``base + per_seq n + kv L`` and gives each running sequence one token; arrivals join
    at the next iteration."""
    t, done = 0.0, [0.0] * len(jobs)
    ctx = {i: float(p + q) for i, (_, p, q, _) in enumerate(jobs)}
    left = {i: n for i, (*_, n) in enumerate(jobs)}
    while left:
        run = [i for i in left if jobs[i][0] <= t]
        if not run:
            t = min(jobs[i][0] for i in left)
            continue
        t += (
            engine.decode_base_s
            + engine.decode_per_seq_s * len(run)
            + engine.decode_per_kv_token_s * sum(ctx[i] for i in run)
        )
        for i in run:
            ctx[i] += 1
            left[i] -= 1
            if not left[i]:
                del left[i]
                done[i] = t
    return done


job = st.tuples(
    st.sampled_from([0.0, 0.5, 3.0]),
    st.integers(0, 3000),
    st.integers(0, 2000),
    st.integers(20, 400),
)


@given(st.lists(job, min_size=1, max_size=6), st.sampled_from([2e-6, 2e-5]))
@example([(0.0, 0, 0, 400), (3.0, 0, 0, 100)], 2e-5)
@example([(0.0, 2000, 0, 400), (0.5, 0, 0, 300), (3.0, 100, 0, 100)], 2e-5)
def test_context_dependent_decode_matches_iterations(
    jobs: list[tuple[float, int, int, int]], kv: float
) -> None:
    """The closed-form advance of the service clock with a per-context-token cost matches
    an engine that runs iteration by iteration, within a few iterations."""
    engine = _engine(kv=kv)
    fluid, ref = _finish_times(engine, jobs), _iterations(engine, jobs)
    worst_iter = engine.decode_base_s + engine.decode_per_seq_s * 6 + kv * 6 * 6000
    for a, b in zip(fluid, ref, strict=True):
        assert a == pytest.approx(b, abs=3 * worst_iter, rel=0.01)


def test_longer_context_decodes_slower_and_zero_cost_is_unchanged() -> None:
    jobs = [(0.0, 100, 0, 300), (0.0, 5000, 0, 300)]
    flat = _finish_times(_engine(), jobs)
    assert flat[0] == flat[1]  # no context cost: same length, same finish
    slow = _finish_times(_engine(kv=2e-5), jobs)
    assert slow[0] > flat[0] and slow[1] == slow[0]  # one batch: all decode at one rate
    alone = _finish_times(_engine(kv=2e-5), jobs[:1])
    assert alone[0] < slow[0]  # the long-context neighbour slows it down


def test_re_prefill_costs_the_replica_its_prefill_time() -> None:
    """A request resumed with 20,000 generated tokens stalls the running sequences for its
    re-prefill (prompt + partial output) x prefill_s_per_token."""
    prefill = 1e-4
    running = (0.0, 0, 0, 200)
    base = _finish_times(_engine(prefill=prefill), [running])[0]
    resumed = (0.5, 100, 20_000, 10)
    both = _finish_times(_engine(prefill=prefill), [running, resumed])
    assert both[0] - base >= 20_100 * prefill - 1e-9
    # without the re-prefill (a fresh request of the same prompt) the stall is short
    fresh = _finish_times(_engine(prefill=prefill), [running, (0.5, 100, 0, 10)])
    assert both[0] - fresh[0] == pytest.approx(20_000 * prefill, rel=1e-6)


def test_prefill_stall_counts_as_rollout_time() -> None:
    acct_modes: list[str] = []

    async def main() -> None:
        acct = GroupAccountant(clock=asyncio.get_running_loop().time)
        acct.add_group("r", 1, "standalone")
        rep = SimReplica(
            "r", _engine(prefill=1e-3), HardwareModel(), LLMModel(params_b=1.0), accountant=acct
        )
        task = asyncio.ensure_future(
            rep.generate(GenerateRequest(request_id="a", prompt_len=1000, max_tokens=5))
        )
        await asyncio.sleep(0.5)  # inside the 1 s prefill
        acct_modes.append(acct.mode_of("r"))
        await task

    run_virtual(main())
    assert acct_modes == ["rollout"]


# ------------------------------------------------------------------ honest sleep states
SLEEP_S = 7.0
WAKE_S = 11.0


class SwitchMachine(RuleBasedStateMachine):
    """Sleeps and wake-ups started at arbitrary moments on one hybrid replica: it reads
    ``asleep`` only between a finished sleep and the next wake-up, never serves while not
    awake, and its switching time on the ground-truth ledger is exactly the switches it
    made."""

    @initialize()
    def start(self) -> None:
        self.loop = VirtualTimeEventLoop()
        self.acct = GroupAccountant(clock=self.loop.time)
        self.acct.add_group("h", 1, "trainer")
        engine = attrs.evolve(_engine(), sleep_overhead_s=SLEEP_S, wake_overhead_s=WAKE_S)
        self.rep = SimReplica(
            "h",
            engine,
            HardwareModel(h2d_bandwidth_gib_s=1e9),
            LLMModel(params_b=1.0),
            role="hybrid",
            accountant=self.acct,
        )
        self.tasks: list[asyncio.Future[None]] = []

    def _spawn(self, coro: object) -> None:
        self.tasks.append(asyncio.ensure_future(coro, loop=self.loop))  # type: ignore[arg-type]

    @rule()
    def sleep(self) -> None:
        self._spawn(self.rep.sleep())

    @rule()
    def wake(self) -> None:
        self._spawn(self.rep.wake_up())

    @rule()
    def resume(self) -> None:
        async def go() -> None:
            try:
                await self.rep.resume()
            except ReplicaNotServingError:
                assert self.rep.state in ("asleep", "falling_asleep", "waking")

        self._spawn(go())

    @rule(dt=st.sampled_from([0.0, 1.0, 6.9, 7.0, 11.0, 30.0]))
    def advance(self, dt: float) -> None:
        self.loop.run_until_complete(asyncio.sleep(dt))

    @precondition(lambda self: self.rep.state in ("asleep", "falling_asleep", "waking"))
    @rule()
    def generate_refused(self) -> None:
        req = GenerateRequest(request_id="g", prompt_len=1, max_tokens=1)
        with pytest.raises(ReplicaNotServingError):
            self.loop.run_until_complete(self.rep.generate(req))

    @invariant()
    def state_matches_the_switch(self) -> None:
        if not hasattr(self, "rep"):
            return
        s = self.rep.state
        switching = self.acct.mode_of("h") == "switching"
        assert switching == (s in ("falling_asleep", "waking")), (s, switching)

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            # every request finishes (queued sleeps and wake-ups take turns; a deadlock
            # would raise SimulationDeadlockError on the virtual loop)
            tasks = self.tasks

            async def finish_all() -> None:
                await asyncio.gather(*tasks)

            self.loop.run_until_complete(finish_all())
            s = self.rep.state
            assert s in ("asleep", "paused", "serving")
            seconds = self.acct.usage()[0].seconds["switching"]
            n = round(seconds)
            # every second of switching is a whole sleep or a whole wake-up
            assert any(
                math.isclose(seconds, a * SLEEP_S + b * WAKE_S, abs_tol=1e-6)
                for a in range(0, n // 7 + 2)
                for b in range(0, n // 11 + 2)
            )
            self.loop.close()


TestSwitchMachine = SwitchMachine.TestCase


# ------------------------------------------------------------------ best static split
def test_static_splits_are_all_splits_of_the_same_gpus() -> None:
    from dynsched_sim import ScenarioError
    from dynsched_sim._scenario import static_splits

    sc = load_scenario("seed-qwen35")
    splits = static_splits(sc)
    assert [(c.trainer_gpus, c.rollout_gpus) for c in splits] == [(24, 8), (16, 16), (8, 24)]
    assert sc.configuration("static-8-24") in splits  # the scenario's own, by name
    assert not any(c.hybrid for c in splits)
    assert len(static_splits(sc, 64)) == 7
    with pytest.raises(ScenarioError, match="no static split"):
        static_splits(sc, 8)  # one replica and no GPU left for the trainer


# ------------------------------------------------------------------ spread over refits
def test_spread_of_refits_separates_seed_and_refit_spread() -> None:
    from dynsched_sim.calibrate import CalibrationReport, spread_of_refits

    def report(dyn_h: float, sd_h: float, decode: float, trainer: float) -> CalibrationReport:
        walls = {"static-16-16": 6.5 * 3600, "dynamic-16-16": dyn_h * 3600}
        return CalibrationReport(
            decode, 7e-5, trainer, (), (0, 1), walls,
            {"static-16-16": 0.0, "dynamic-16-16": sd_h * 3600},
            "dynamic-16-16", dyn_h / 5.4 - 1, {"static-16-16": 6.5 / dyn_h}, 10,
        )  # fmt: skip

    spread = spread_of_refits([report(5.0, 0.05, 0.010, 0.001), report(5.2, 0.03, 0.011, 0.001)])
    assert spread["means_h"] == [5.0, 5.2]
    assert spread["refit_range_h"] == pytest.approx(0.2)
    assert spread["refit_std_h"] == pytest.approx(0.2 / math.sqrt(2))
    assert spread["largest_seed_std_h"] == pytest.approx(0.05)
    assert spread["fitted_rate_rel_range"]["decode_base_s"] == pytest.approx(0.001 / 0.0105)
    assert spread["fitted_rate_rel_range"]["gpu_s_per_token"] == 0.0
    with pytest.raises(ValueError, match="no calibration reports"):
        spread_of_refits([])
