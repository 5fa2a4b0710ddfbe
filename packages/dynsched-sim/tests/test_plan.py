"""`dynsched plan`: feasibility of every planned candidate, exactness on a small candidate
set, the command's bad-input lines and its outputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from dynsched_sim import (
    PlanError,
    load_scenario,
    plan,
    predicted_staleness_for,
    random_scenario,
    run_configuration,
)
from dynsched_sim._plan import (
    DEFAULT_PLAN_POLICIES,
    SCENARIO_STALENESS,
    _assess,
    _candidates,
    _simulated,
    format_plan,
    memory_problem,
    own_candidate,
)
from dynsched_sim.calibrate import scenario_to_dict
from dynsched_sim.cli import main_plan
from hypothesis import given, settings
from hypothesis import strategies as st

GIB = 2.0**30
POLICIES = ("static_fully_async", "default")


def _fits(sc, c) -> bool:  # type: ignore[no-untyped-def]
    """Memory, computed here from the scenario's numbers (not through the planner)."""
    gpu = sc.hardware.gpu_memory_gib * GIB
    llm, eng = sc.model, sc.engine
    trainer = llm.params_b * 1e9 * (llm.bytes_per_param + llm.trainer_state_bytes_per_param)
    if trainer / c.trainer_gpus > gpu:
        return False
    fractions = [eng.standalone_memory_fraction] if c.rollout_gpus else []
    fractions += [eng.hybrid_memory_fraction] if c.hybrid else []
    if any(eng.gpus_per_replica * gpu * f <= llm.weight_bytes for f in fractions):
        return False
    resident = c.hybrid and not sc.trainer.offload_state
    return not resident or eng.hybrid_memory_fraction * gpu + trainer / c.trainer_gpus <= gpu


@settings(max_examples=10)
@given(
    seed=st.integers(0, 10_000),
    bound=st.sampled_from([0.0, 0.1, 0.3, 1.0]),
    extra=st.integers(0, 2),
)
def test_plan_never_violates_memory_or_the_staleness_bound(
    seed: int, bound: float, extra: int
) -> None:
    sc = random_scenario(seed, max_steps=4)
    g = sc.engine.gpus_per_replica
    gpus = max(c.total_gpus for c in sc.configurations) + extra * g
    try:
        p = plan(sc, gpus=gpus, staleness_bound=bound, seeds=1, shortlist=2, policies=POLICIES)
    except PlanError as e:
        assert "no feasible candidate" in str(e)
        for cand, _ in _candidates(sc, gpus, list(POLICIES)):  # truly none
            assert not _fits(sc, cand) or _assess(sc, cand, (), seed, bound).problem
        return
    for r in p.ranked:
        c = r.candidate
        assert c.trainer_gpus + c.rollout_gpus == gpus
        assert c.rollout_gpus % g == 0 and (not c.hybrid or c.trainer_gpus % g == 0)
        assert _fits(sc, c), c.name
        stale = predicted_staleness_for(c.scenario_for(sc), c.configuration(), c.policy, seed=seed)
        assert stale <= bound + 1e-9, (c.name, stale)
        assert r.predicted_staleness == pytest.approx(stale)


def test_memory_rule_refuses_a_trainer_that_does_not_fit() -> None:
    sc = load_scenario("seed-qwen35")  # 35 B x 18 bytes: 73 GiB per GPU on 8 GPUs
    p = plan(sc.with_steps(4), gpus=32, seeds=1, shortlist=8, policies=POLICIES)
    assert p.splits and all(s.problem == "" for s in p.splits)
    small = sc.with_values(hardware={"gpu_memory_gib": 40.0})  # 8 trainer GPUs: 73 GiB
    p = plan(small.with_steps(4), gpus=32, seeds=1, shortlist=8, policies=POLICIES)
    eight = [s for s in p.splits if s.trainer_gpus == 8]
    assert eight and all(s.problem.startswith("memory: trainer state") for s in eight)
    assert all(r.candidate.trainer_gpus >= 16 for r in p.ranked)


def _exhaustive(sc, gpus: int, seeds: tuple[int, ...], bound: float):  # type: ignore[no-untyped-def]
    runs = []
    for cand, pols in _candidates(sc, gpus, list(POLICIES)):
        a = _assess(sc, cand, pols, seeds[0], bound)
        runs += [_simulated(sc, a, pol, seeds) for pol in (pols if not a.problem else ())]
    return min(runs, key=lambda d: d.time_s.mean)


def test_exact_plan_is_the_exhaustive_best_of_its_candidate_set() -> None:
    sc = load_scenario("seed-qwen35").with_steps(4)
    exact = plan(sc, gpus=16, seeds=2, shortlist=None, policies=POLICIES)
    best = _exhaustive(sc, 16, exact.seeds, exact.staleness_bound)
    assert exact.best.candidate == best.candidate
    assert exact.best.time_s.mean == best.time_s.mean
    # the default shortlist simulates fewer candidates and ranks them
    quick = plan(sc, gpus=16, seeds=2, shortlist=2, policies=POLICIES)
    times = [r.time_s.mean for r in quick.ranked]
    assert times == sorted(times) and quick.best.time_s.mean >= best.time_s.mean
    assert quick.ranked[0].why_next_lost.startswith("slower by")
    assert quick.ranked[-1].why_next_lost == ""
    assert quick.pruned.get("not shortlisted (fluid estimate)", 0) > 0


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["no-such-scenario"], "unknown scenario"),
        (["seed-qwen35", "--gpus", "0"], "--gpus"),
        (["seed-qwen35", "--gpus", "4"], "--gpus"),
        (["seed-qwen35", "--gpus", "1000000"], "--gpus"),
        (["seed-qwen35", "--staleness-bound", "-1"], "--staleness-bound"),
        (["seed-qwen35", "--staleness-bound", "nan"], "--staleness-bound"),
        (["seed-qwen35", "--seeds", "0"], "--seeds"),
        (["seed-qwen35", "--seeds", "101"], "--seeds"),
        (["seed-qwen35", "--shortlist", "0"], "--shortlist"),
        (["seed-qwen35", "--seeds", "two"], "--seeds"),
        (["seed-qwen35", "--simulated-staleness-bound", "-0.1"], "--simulated-staleness-bound"),
        (["seed-qwen35", "--simulated-staleness-bound", "inf"], "--simulated-staleness-bound"),
        (["seed-qwen35", "--simulated-staleness-bound", "own"], "--simulated-staleness-bound"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv: list[str], names: str, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    try:
        rc = main_plan([*argv, "--out", str(tmp_path / "o")])
    except SystemExit as e:  # argparse: a value of the wrong type
        rc = e.code
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and names in err, err
    if argv[-1] != "two" and names.startswith("--"):
        assert "must be" in err  # the allowed values


def test_dispatcher_registers_plan(capsys) -> None:  # type: ignore[no-untyped-def]
    from dynsched_core.cli import main

    assert main(["plan", "seed-qwen35", "--seeds", "0"]) == 2
    assert "--seeds must be an integer >= 1" in capsys.readouterr().err


def _small_file(tmp_path: Path) -> Path:
    data = scenario_to_dict(load_scenario("seed-qwen35").with_steps(4))
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_plan_writes_json_and_plot(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    argv = [str(_small_file(tmp_path)), "--gpus", "16", "--seeds", "1", "--shortlist", "1"]
    assert main_plan([*argv, "--out", str(out), "--json", "--quiet"]) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((out / "plan.json").read_text())
    assert printed["best"] == written["best"] and written["gpus"] == 16
    assert written["ranked"][0]["time_s"]["mean"] > 0 and written["pruning_rule"]
    assert any(r.startswith("fitted: engine.decode_base_s") for r in written["rests_on"])
    assert (out / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert main_plan([*argv, "--out", str(out), "--no-plot"]) == 0
    captured = capsys.readouterr()
    assert "why the next one lost" in captured.out and "wrote" in captured.out
    assert "simulating" in captured.err  # progress lines on stderr


def test_ctrl_c_exits_130(monkeypatch, capsys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import dynsched_sim._plan as plan_module

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_module, "plan", interrupted)
    assert main_plan(["seed-qwen35", "--out", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip() == "dynsched plan: interrupted"


def test_plan_time_is_finite_and_best_is_feasible() -> None:
    p = plan(load_scenario("seed-qwen35").with_steps(8), seeds=1, shortlist=2)
    assert math.isfinite(p.best.time_s.mean) and 0 < p.best.efficiency.mean <= 1
    assert p.best.predicted_staleness <= p.staleness_bound == 0.5


def test_simulated_staleness_bound_changes_the_pick_to_one_within_it() -> None:
    """On 12 steps the fastest candidate within the closed-form bound 0.5 (predicted 0.43)
    measures 0.57 in the simulator; a simulated bound of 0.5 makes the plan pick a
    candidate whose measured mean staleness is within it."""
    sc = load_scenario("seed-qwen35").with_steps(12)
    kw = {"gpus": 16, "seeds": 1, "shortlist": 2, "policies": POLICIES}
    free = plan(sc, **kw)  # type: ignore[arg-type]
    assert free.simulated_staleness_bound is None
    assert free.best.simulated_staleness > 0.5 >= free.best.predicted_staleness
    bounded = plan(sc, **kw, simulated_staleness_bound=0.5)  # type: ignore[arg-type]
    assert bounded.simulated_staleness_bound == 0.5
    assert bounded.to_json()["simulated_staleness_bound"] == 0.5
    assert bounded.best.simulated_staleness <= 0.5
    assert bounded.best.candidate != free.best.candidate
    # within the bound first (fastest first), then the rest, each saying why
    within = [r.simulated_staleness <= 0.5 for r in bounded.ranked]
    assert within == sorted(within, reverse=True) and not all(within)
    times = [r.time_s.mean for r in bounded.ranked if r.simulated_staleness <= 0.5]
    assert times == sorted(times) and bounded.best.time_s.mean == min(times)
    assert "over the simulated bound" in bounded.ranked[sum(within) - 1].why_next_lost
    assert any("simulated staleness bound 0.5" in r for r in bounded.rests_on)
    # a bound no simulated candidate meets: one clear error naming the field
    with pytest.raises(PlanError, match="simulated_staleness_bound"):
        plan(sc, **kw, staleness_bound=0.5, simulated_staleness_bound=0.01)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-0.5, math.nan, math.inf, "0.3", True])
def test_simulated_staleness_bound_is_validated(bad: object) -> None:
    sc = load_scenario("seed-qwen35").with_steps(4)
    with pytest.raises(PlanError, match=r"^simulated_staleness_bound must be a finite number"):
        plan(sc, gpus=16, seeds=1, shortlist=1, simulated_staleness_bound=bad)  # type: ignore[arg-type]


def test_the_shortlist_takes_the_widest_window_among_estimates_it_cannot_tell_apart() -> None:
    """Per split, of the candidates estimated within `WINDOW_TOLERANCE` of the split's
    best, the shortlist simulates the largest staleness threshold (the fluid estimate does
    not see a small window's stalls); a candidate estimated further off is not taken, and
    the splits are still the ``k`` with the best estimates."""
    from dynsched_sim._plan import WINDOW_TOLERANCE, Candidate, _Assessment, _shortlisted

    def a(split: tuple[int, int], conc: int, thr: float, est: float) -> _Assessment:
        c = Candidate(
            trainer_gpus=split[0],
            rollout_gpus=split[1],
            hybrid=False,
            policy="static_fully_async",
            concurrency=conc,
            staleness_threshold=thr,
        )
        return _Assessment(c, ("static_fully_async",), "", est)

    tol = WINDOW_TOLERANCE
    feasible = sorted(
        [
            a((16, 16), 16, 0.25, 1000.0),
            a((16, 16), 32, 0.5, 1000.0 * (1 + tol / 2)),  # inside the tolerance: taken
            a((16, 16), 16, 1.0, 1000.0 * (1 + 2 * tol)),  # outside it: never taken
            a((24, 8), 32, 0.0, 1001.0),
            a((24, 8), 16, 0.25, 1001.0 * (1 + tol)),  # at the edge: taken
            a((8, 24), 16, 0.5, 1500.0),  # the third split: left out with k = 2
        ],
        key=lambda x: x.estimate_s,
    )
    got = {x.candidate.split: x.candidate for x in _shortlisted(feasible, 2)}
    assert set(got) == {"static-16-16", "static-24-8"}
    assert (got["static-16-16"].concurrency, got["static-16-16"].staleness_threshold) == (32, 0.5)
    assert got["static-24-8"].staleness_threshold == 0.25
    # one candidate per split, and with nothing within the tolerance the best estimate
    alone = [a((16, 16), 16, 0.25, 1000.0), a((16, 16), 16, 0.5, 1000.0 * (1 + 2 * tol))]
    assert [x.candidate.staleness_threshold for x in _shortlisted(alone, 4)] == [0.25]


def test_the_scenario_bound_is_its_own_configuration_and_the_pick_is_never_slower() -> None:
    """``simulated_staleness_bound="scenario"``: the bound is the measured mean staleness
    of the scenario's own configuration (its dynamic split, policy, concurrency and
    threshold) on the plan's seeds, the same runs as `run_configuration` makes, and that
    configuration is ranked with the simulated candidates."""
    sc = load_scenario("balanced").with_steps(8)
    p = plan(sc, seeds=2, shortlist=2, simulated_staleness_bound=SCENARIO_STALENESS)
    own = own_candidate(sc)
    assert (own.split, own.policy, own.concurrency, own.staleness_threshold) == (
        "hybrid-16-16",
        "default",
        16,
        0.5,
    )
    dyn = next(c for c in sc.configurations if c.hybrid)
    runs = [run_configuration(sc, dyn, "default", seed=s) for s in (sc.seed, sc.seed + 1)]
    assert p.reference is not None and p.reference.candidate == own
    assert p.simulated_staleness_bound == sum(r.staleness["mean"] for r in runs) / 2
    assert p.reference.time_s.mean == sum(r.wall_clock_s for r in runs) / 2
    assert own in [r.candidate for r in p.ranked]
    assert p.best.time_s.mean <= p.reference.time_s.mean
    assert p.best.simulated_staleness <= p.simulated_staleness_bound + 1e-9
    assert p.to_json()["reference"]["candidate"]["name"] == own.name
    assert any("own configuration" in r for r in p.rests_on)
    assert f"the scenario's own configuration {own.name}" in format_plan(p)


def test_the_scenario_bound_keeps_the_own_configuration_where_no_candidate_is_as_fresh() -> None:
    """On 8 steps of ``rollout-bound`` no shortlisted candidate measures as little staleness
    as the scenario's own configuration: the ``"scenario"`` bound picks the own
    configuration, and so does the same bound given as a number (the own configuration is
    ranked in every plan); a number below its staleness is an error naming the least."""
    sc = load_scenario("rollout-bound").with_steps(8)
    p = plan(sc, seeds=2, shortlist=2, simulated_staleness_bound=SCENARIO_STALENESS)
    assert p.best.candidate == own_candidate(sc)
    assert p.simulated_staleness_bound is not None
    same = plan(sc, seeds=2, shortlist=2, simulated_staleness_bound=p.simulated_staleness_bound)
    assert same.best.candidate == own_candidate(sc)
    assert same.best.time_s == p.best.time_s
    with pytest.raises(PlanError, match="no simulated candidate is within it"):
        plan(sc, seeds=2, shortlist=2, simulated_staleness_bound=p.simulated_staleness_bound * 0.5)


def test_every_plan_simulates_and_ranks_the_scenarios_own_configuration() -> None:
    """Without a simulated bound the own configuration is simulated on the plan's seeds
    (the same runs as `run_configuration`), reported as the reference (not as a bound) and
    ranked: the pick is never slower than it."""
    sc = load_scenario("rollout-bound").with_steps(8)
    own = own_candidate(sc)
    p = plan(sc, seeds=2, shortlist=1)
    assert p.simulated_staleness_bound is None
    assert p.reference is not None and p.reference.candidate == own
    dyn = next(c for c in sc.configurations if c.hybrid)
    runs = [run_configuration(sc, dyn, own.policy, seed=s) for s in (sc.seed, sc.seed + 1)]
    assert p.reference.time_s.mean == sum(r.wall_clock_s for r in runs) / 2
    assert own in [r.candidate for r in p.ranked]
    assert p.best.time_s.mean <= p.reference.time_s.mean
    line = next(r for r in p.rests_on if "own configuration" in r)
    assert line.startswith("the scenario's own configuration")
    text = format_plan(p)
    assert f"the scenario's own configuration {own.name}" in text
    assert "(the simulated bound)" not in text


def test_a_plan_keeps_the_own_configuration_where_the_search_finds_nothing_faster() -> None:
    """Random scenario 29 (4 steps), one seed, a shortlist of one split: every searched
    candidate simulates slower than the scenario's own configuration, and the plan picks
    the own configuration (before it was ranked, the plan picked a slower one)."""
    sc = random_scenario(29, max_steps=4)
    own = own_candidate(sc)
    p = plan(sc, gpus=own.total_gpus, seeds=1, shortlist=1)
    searched = [r for r in p.ranked if r.candidate != own]
    assert searched and min(r.time_s.mean for r in searched) > p.reference.time_s.mean  # type: ignore[union-attr]
    assert p.best.candidate == own


@pytest.mark.parametrize(
    "kw", [{"gpus": 48, "shortlist": 2}, {"shortlist": 2, "policies": ("fixed_ratio",)}]
)
def test_the_scenario_bound_ranks_the_own_configuration_only_where_the_plan_could_pick_it(
    kw: dict[str, object],
) -> None:
    """Another GPU budget, or a policy set without the scenario's policy: the bound still
    comes from the own configuration, which is not ranked."""
    sc = load_scenario("balanced").with_steps(8)
    p = plan(sc, seeds=1, simulated_staleness_bound=SCENARIO_STALENESS, **kw)  # type: ignore[arg-type]
    assert p.reference is not None and p.reference.candidate == own_candidate(sc)
    assert p.simulated_staleness_bound == p.reference.simulated_staleness
    assert own_candidate(sc) not in [r.candidate for r in p.ranked]


def test_the_plan_command_takes_the_scenario_bound(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "out"
    argv = [str(_small_file(tmp_path)), "--seeds", "1", "--shortlist", "1", "--no-plot"]
    assert main_plan([*argv, "--simulated-staleness-bound", "scenario", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    written = json.loads((out / "plan.json").read_text())
    assert written["reference"]["candidate"]["name"] == "hybrid-16-16/default/c16/s0.5"
    assert written["simulated_staleness_bound"] == written["reference"]["simulated_staleness"]
    assert "the scenario's own configuration hybrid-16-16/default/c16/s0.5" in printed


@settings(max_examples=4)
@given(seed=st.integers(0, 10_000))
def test_with_the_scenario_bound_the_pick_is_never_slower_nor_staler_than_its_own(
    seed: int,
) -> None:
    """Any scenario: the pick is within the own configuration's simulated staleness and,
    where that configuration is ranked (always here: the plan's budget is its GPUs), no
    slower than it on the plan's seeds."""
    sc = random_scenario(seed, max_steps=4)
    own = own_candidate(sc)
    try:
        p = plan(
            sc, gpus=own.total_gpus, seeds=1, shortlist=2, simulated_staleness_bound="scenario"
        )
    except PlanError as e:  # every candidate's closed form over the threshold
        assert "no feasible candidate" in str(e)
        return
    assert p.reference is not None and p.reference.candidate == own
    assert p.best.simulated_staleness <= p.reference.simulated_staleness + 1e-9
    if own in [r.candidate for r in p.ranked]:
        assert p.best.time_s.mean <= p.reference.time_s.mean
    else:  # not ranked only where the plan could not pick it
        assert (
            memory_problem(sc, own.trainer_gpus, own.rollout_gpus, own.hybrid)
            or p.reference.predicted_staleness > p.staleness_bound
            or own.policy not in DEFAULT_PLAN_POLICIES
        )
    json.dumps(p.to_json(), allow_nan=False)  # plain JSON (a reference the plan could
    # not pick has no fluid estimate)


@settings(max_examples=4)
@given(seed=st.integers(0, 10_000))
def test_without_a_simulated_bound_the_pick_is_never_slower_than_its_own(seed: int) -> None:
    """Any scenario, no simulated bound: the own configuration is the reference and, where
    the plan could pick it (its budget, policy, memory rule and closed-form bound), the
    pick is no slower than it on the plan's seeds."""
    sc = random_scenario(seed, max_steps=4)
    own = own_candidate(sc)
    try:
        p = plan(sc, gpus=own.total_gpus, seeds=1, shortlist=2)
    except PlanError as e:  # every candidate's closed form over the threshold
        assert "no feasible candidate" in str(e)
        return
    assert p.reference is not None and p.reference.candidate == own
    if own in [r.candidate for r in p.ranked]:
        assert p.best.time_s.mean <= p.reference.time_s.mean
    else:
        assert (
            memory_problem(sc, own.trainer_gpus, own.rollout_gpus, own.hybrid)
            or p.reference.predicted_staleness > p.staleness_bound
            or own.policy not in DEFAULT_PLAN_POLICIES
        )


@pytest.mark.parametrize("seed", [3, 5])
def test_a_candidate_the_plan_reaches_twice_is_simulated_once(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random scenarios 3 and 5 (4 steps): the search shortlists the scenario's own
    configuration, which every plan simulates first; its runs are reused, so the plan
    makes one run per seed of each distinct candidate it reports."""
    import dynsched_sim._plan as plan_module

    calls: list[str] = []
    real = plan_module.run_configuration

    def counting(*a: object, **kw: object) -> object:
        calls.append(str(a[1]))
        return real(*a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(plan_module, "run_configuration", counting)
    sc = random_scenario(seed, max_steps=4)
    own = own_candidate(sc)
    p = plan(sc, gpus=own.total_gpus, seeds=2, shortlist=2)
    distinct = {(r.candidate.split, r.candidate.policy, r.candidate.concurrency,
                 r.candidate.staleness_threshold) for r in p.ranked}  # fmt: skip
    assert own in [r.candidate for r in p.ranked]
    assert len(calls) == 2 * len(distinct) == 2 * len(p.ranked)
