"""verl's *published* dynamic-scheduling policy source runs unchanged on dynsched.

The policy files of verl 0.9.1 are taken from its wheel on the package index at test time
(never copied into this repository) and executed byte for byte as modules of a synthetic
package ``verl.experimental.fully_async_policy.dynamic_schedule``. Its ``base`` module is a
shim that re-exports dynsched-core's context, base class and registry: "a verl policy ports
by changing imports", with the module system doing the change instead of an edit. The shim
registers verl's policies as ``verl-<name>`` (``verl-default``, ...), since verl's own names
are dynsched's built-in entry points and a second class under the same name is refused.

What is checked:

* verl's three policies pass the conformance kit (`dynsched_core.testing.check_policy`),
  except ``default``'s ``state_dict_round_trip``: verl keeps its learned state in plain
  attributes and no ``state_dict``, so a restored policy forgets it (difference 6 of the
  dynsched-policies README); with a test-side checkpoint adapter it passes everything;
* driven through the same calls in the driver's order, verl's policies and dynsched's
  built-ins decide identically, state for state, except in the documented differences
  of the dynsched-policies README ("Differences from the published implementation"),
  each asserted where it shows: the unbounded ratio (3), the unbounded switch-cost
  history (4, same mean), the per-sample time stored only by the activation gate (5),
  the exact decimal ratio (8), and ``request_rebalance`` returning a decision (2);
* verl's ``default`` runs whole simulated runs through the `ScheduleDriver` with the
  optional hooks' defaults, every sample consumed once, and gives the built-in's run
  exactly, unless difference 8 (the drifted ratio ``0.4999999999999999``) or a guard rail
  makes them part; where they part, the test names the decision and the cause.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import linecache
import math
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dynsched_core
import pytest
from dynsched_core import (
    DynamicResourceController,
    DynamicScheduleContext,
    DynamicSchedulePolicyBase,
    GuardRails,
    build_policy,
    get_policy_class,
)
from dynsched_core._registry import _registry
from dynsched_core.testing import PolicyConformanceError, check_policy
from dynsched_policies import (
    DefaultDynamicSchedulePolicy,
    FixedRatioDynamicSchedulePolicy,
    StaticFullyAsyncPolicy,
)
from dynsched_sim import RunResult, load_scenario, run_configuration
from hypothesis import event, given
from hypothesis import strategies as st

# ----------------------------------------------------------------------------------
# verl's wheel: fetched from the package index, read without extracting
# ----------------------------------------------------------------------------------
VERL_VERSION = "0.9.1"
WHEEL_NAME = f"verl-{VERL_VERSION}-py3-none-any.whl"
#: sha256 of the wheel PyPI publishes (a cached or downloaded file must match it).
WHEEL_SHA256 = "db6e6f2a8d9d5808d9ec32d357a42319fdc6967df688ff9d9810050f49bfdd14"
DOWNLOAD_TIMEOUT_S = 300
PACKAGE = "verl.experimental.fully_async_policy.dynamic_schedule"
PACKAGE_DIR = PACKAGE.replace(".", "/")
POLICY_MODULES = ("default_policy", "fixed_ratio_policy", "static_fully_async_policy")
#: Prefix the shim gives verl's registered names (verl's own names are dynsched's built-ins).
PREFIX = "verl-"


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "dynsched-test" / "verl"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _pip_commands() -> list[list[str]]:
    """pip of this interpreter, else the first pip on PATH (hatch's environments have none)."""
    cmds: list[list[str]] = []
    if importlib.util.find_spec("pip") is not None:
        cmds.append([sys.executable, "-m", "pip"])
    for exe in ("pip3", "pip"):
        found = shutil.which(exe)
        if found:
            cmds.append([found])
    return cmds


def fetch_wheel() -> Path:
    """verl's wheel in the test cache, downloaded with ``pip download`` when missing.

    Fails the test (never skips it) when no pip can fetch it or the file is not the
    published one.
    """
    cache = _cache_dir()
    wheel = cache / WHEEL_NAME
    if wheel.is_file() and _sha256(wheel) == WHEEL_SHA256:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    attempts: list[str] = []
    for pip in _pip_commands():
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            cmd = [
                *pip,
                "download",
                f"verl=={VERL_VERSION}",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-d",
                tmp,
            ]
            try:
                out = subprocess.run(
                    cmd, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False
                )
            except subprocess.TimeoutExpired:
                attempts.append(f"{' '.join(cmd)}: no answer within {DOWNLOAD_TIMEOUT_S} s")
                continue
            got = Path(tmp) / WHEEL_NAME
            if out.returncode != 0 or not got.is_file():
                attempts.append(f"{' '.join(cmd)}: exit {out.returncode}\n{out.stderr[-2000:]}")
                continue
            digest = _sha256(got)
            if digest != WHEEL_SHA256:
                pytest.fail(
                    f"{WHEEL_NAME} from the package index has sha256 {digest}, not the "
                    f"published {WHEEL_SHA256}: refusing to run it"
                )
            os.replace(got, wheel)
            return wheel
    pytest.fail(
        f"could not download verl {VERL_VERSION}'s wheel from the package index (this test "
        "runs verl's published policy source and needs it; the machine must reach PyPI). "
        + ("Attempts:\n" + "\n".join(attempts) if attempts else "No pip found.")
    )


def read_sources(wheel: Path) -> dict[str, bytes]:
    """The policy modules' source, byte for byte as the wheel holds them."""
    with zipfile.ZipFile(wheel) as zf:
        return {m: zf.read(f"{PACKAGE_DIR}/{m}.py") for m in (*POLICY_MODULES, "base")}


# ----------------------------------------------------------------------------------
# Loading verl's modules unchanged under a shim ``base``
# ----------------------------------------------------------------------------------
def _shim_base() -> types.ModuleType:
    """``...dynamic_schedule.base``: dynsched-core's names, registration prefixed."""
    base = types.ModuleType(
        f"{PACKAGE}.base", "dynsched shim of verl's base: dynsched-core's policy API."
    )

    def register_policy(name: str) -> Any:
        return dynsched_core.register_policy(PREFIX + name)

    def build(name: str, **kwargs: Any) -> DynamicSchedulePolicyBase:
        return dynsched_core.build_policy(PREFIX + name, **kwargs)

    base.DynamicScheduleContext = DynamicScheduleContext  # type: ignore[attr-defined]
    base.DynamicSchedulePolicyBase = DynamicSchedulePolicyBase  # type: ignore[attr-defined]
    base.register_policy = register_policy  # type: ignore[attr-defined]
    base.build_policy = build  # type: ignore[attr-defined]
    return base


class VerlPolicies:
    """verl's policy modules, loaded from the wheel, and what they registered."""

    def __init__(self, wheel: Path, sources: dict[str, bytes], modules: dict[str, Any]) -> None:
        self.wheel = wheel
        self.sources = sources
        self.modules = modules
        self.default = modules["default_policy"].DefaultDynamicSchedulePolicy
        self.fixed_ratio = modules["fixed_ratio_policy"].FixedRatioDynamicSchedulePolicy
        self.static = modules["static_fully_async_policy"].StaticFullyAsyncPolicy


@contextlib.contextmanager
def loaded_verl_policies(wheel: Path) -> Iterator[VerlPolicies]:
    """Execute verl's policy files unchanged; undo the modules and registrations after.

    Only verl's package ``__init__.py`` is not run: it imports verl's Ray controller
    (``dynamic_resource_controller``), which is no policy. The real ``ray`` is used when
    importable (verl's default and fixed_ratio import it at the top and call it only
    when a ``_rollouter`` attribute is set, which dynsched never sets).
    """
    sources = read_sources(wheel)
    parents = ["verl", "verl.experimental", "verl.experimental.fully_async_policy", PACKAGE]
    names = [*parents, f"{PACKAGE}.base", *(f"{PACKAGE}.{m}" for m in POLICY_MODULES)]
    stub_ray = importlib.util.find_spec("ray") is None
    saved = {n: sys.modules.get(n) for n in [*names, *(["ray"] if stub_ray else [])]}
    before = set(_registry()._local)
    try:
        for name in parents:
            pkg = types.ModuleType(name)
            pkg.__path__ = []
            sys.modules[name] = pkg
        sys.modules[f"{PACKAGE}.base"] = _shim_base()
        if stub_ray:
            ray = types.ModuleType(
                "ray", "stand-in: verl's policies only call ray.get on a rollouter"
            )

            def get(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("ray is not installed")

            ray.get = get  # type: ignore[attr-defined]
            sys.modules["ray"] = ray
        modules: dict[str, Any] = {}
        for m in POLICY_MODULES:
            full = f"{PACKAGE}.{m}"
            origin = f"{wheel}/{PACKAGE_DIR}/{m}.py"
            mod = types.ModuleType(full)
            mod.__file__ = origin
            mod.__package__ = PACKAGE
            mod.__spec__ = importlib.util.spec_from_loader(full, loader=None, origin=origin)
            sys.modules[full] = mod
            text = sources[m].decode("utf-8")
            linecache.cache[origin] = (len(text), None, text.splitlines(True), origin)
            # dont_inherit: verl's text runs exactly as written (no __future__ of ours)
            exec(compile(sources[m], origin, "exec", dont_inherit=True), mod.__dict__)
            modules[m] = mod
        if stub_ray:
            del sys.modules["ray"]
        yield VerlPolicies(wheel, sources, modules)
    finally:
        registry = _registry()
        with registry._lock:
            for name in set(registry._local) - before:
                del registry._local[name]
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


@pytest.fixture(scope="module")
def verl() -> Iterator[VerlPolicies]:
    """verl's policies, loaded for this module's tests (registrations undone after)."""
    with loaded_verl_policies(fetch_wheel()) as policies:
        yield policies


# ----------------------------------------------------------------------------------
# 0. The source is verl's, and it registered through the shim
# ----------------------------------------------------------------------------------
def test_the_source_is_verls_published_wheel_unchanged(verl: VerlPolicies) -> None:
    assert _sha256(verl.wheel) == WHEEL_SHA256
    with zipfile.ZipFile(verl.wheel) as zf:
        for m in POLICY_MODULES:
            assert verl.sources[m] == zf.read(f"{PACKAGE_DIR}/{m}.py")
            assert verl.modules[m].__file__.endswith(f"{WHEEL_NAME}/{PACKAGE_DIR}/{m}.py")
    # the imports the shim serves, as verl wrote them
    for m in POLICY_MODULES:
        assert (
            b"from .base import DynamicScheduleContext, DynamicSchedulePolicyBase, register_policy"
            in verl.sources[m]
        )
    # verl's own base defines the same names the shim serves (a dataclass context, an ABC)
    for name in (b"class DynamicScheduleContext", b"class DynamicSchedulePolicyBase"):
        assert name in verl.sources["base"]
    for cls in (verl.default, verl.fixed_ratio, verl.static):
        assert issubclass(cls, DynamicSchedulePolicyBase)
        assert cls.__module__.startswith(PACKAGE + ".")


def test_verl_policies_register_beside_the_builtins(verl: VerlPolicies) -> None:
    assert get_policy_class("verl-default") is verl.default
    assert get_policy_class("verl-fixed_ratio") is verl.fixed_ratio
    assert get_policy_class("verl-static_fully_async") is verl.static
    assert get_policy_class("default") is DefaultDynamicSchedulePolicy
    assert get_policy_class("fixed_ratio") is FixedRatioDynamicSchedulePolicy
    assert get_policy_class("static_fully_async") is StaticFullyAsyncPolicy
    p = build_policy("verl-default", deactivate_ratio=0.6)
    assert type(p) is verl.default and p.deactivate_ratio == 0.6
    # verl's build_policy, as its base exports it, goes through the same registry
    base = sys.modules[f"{PACKAGE}.base"]
    assert type(base.build_policy("fixed_ratio", deactivate_ratio=0.4)) is verl.fixed_ratio


def test_verl_policies_leave_the_optional_hooks_at_their_defaults(verl: VerlPolicies) -> None:
    """So the driver runs them exactly as the published framework calls them."""
    for cls in (verl.default, verl.fixed_ratio, verl.static):
        for hook in (
            "should_activate_mid_cycle",
            "hybrid_replicas_to_activate",
            "hybrid_replica_ids_to_activate",
            "observe",
            "state_dict",
            "load_state_dict",
        ):
            assert getattr(cls, hook) is getattr(DynamicSchedulePolicyBase, hook), (cls, hook)


# ----------------------------------------------------------------------------------
# a. The conformance kit
# ----------------------------------------------------------------------------------
def test_verl_fixed_ratio_and_static_pass_check_policy(verl: VerlPolicies) -> None:
    for cls, name in ((verl.fixed_ratio, "verl fixed_ratio"), (verl.static, "verl static")):
        report = check_policy(
            cls, colocated_factory=functools.partial(cls, only_hybrid=True), name=name
        )
        assert set(report.properties) == {
            "construct",
            "no_raise",
            "return_types",
            "wait_threshold_bounds",
            "deterministic",
            "state_dict_round_trip",
            "only_hybrid_no_deadlock",
        }


def test_verl_default_fails_only_the_checkpoint_property(verl: VerlPolicies) -> None:
    """verl keeps ratio, switch overheads and per-sample time in attributes with no
    ``state_dict``: a policy restored from a checkpoint starts over (README difference 6).
    Everything else holds: with a checkpoint adapter (state_dict/load_state_dict over
    verl's attributes, no decision touched) the whole kit passes."""
    with pytest.raises(PolicyConformanceError) as info:
        check_policy(verl.default, name="verl default", shrink=False)
    assert info.value.property_name == "state_dict_round_trip", info.value

    class Checkpointed(verl.default):  # type: ignore[misc, name-defined]
        def state_dict(self) -> dict[str, Any]:
            return {
                "deactivate_ratio": self.deactivate_ratio,
                "recent_switch_overheads": list(self._recent_switch_overheads),
                "last_per_sample_time": self._last_per_sample_time,
            }

        def load_state_dict(self, state: Any) -> None:
            self.deactivate_ratio = state["deactivate_ratio"]
            self._recent_switch_overheads = list(state["recent_switch_overheads"])
            self._last_per_sample_time = state["last_per_sample_time"]

    check_policy(
        Checkpointed,
        colocated_factory=functools.partial(Checkpointed, only_hybrid=True),
        name="verl default + checkpoint adapter",
    )


# ----------------------------------------------------------------------------------
# b. Decision for decision against the built-ins
# ----------------------------------------------------------------------------------
_FLOOR_EPS = 1e-9  # dynsched's tolerance below an integer (README difference 8)


def _assert_same_wait(verl_wait: int, ours: int, ratio: float, s: int) -> None:
    """Equal, or difference 8: ``ratio * S`` lies within 1e-9 below an integer, which
    verl's ``int()`` truncates and dynsched counts as that integer."""
    if verl_wait == ours:
        return
    exact = ratio * s
    assert ours == verl_wait + 1 and 0 < ours - exact <= _FLOOR_EPS, (verl_wait, ours, ratio, s)
    event("difference 8: int(ratio * S) just below an integer")


def _rebalances(answer: bool | None) -> bool:
    """What the driver does with a ``request_rebalance`` answer when rebalance is on."""
    return answer is None or bool(answer)


@st.composite
def _runs(draw: st.DrawFn) -> tuple[float, list[list[DynamicScheduleContext]]]:
    """An initial ratio and cycles of contexts as the driver builds them: ``T`` before a
    training step each, then the one after the weight sync (with the cycle's waits)."""
    r = draw(st.integers(1, 64))
    t = draw(st.integers(1, 4))
    s = r * t
    buffer = draw(st.integers(0, 2 * s))
    ratio = draw(
        st.one_of(st.sampled_from([0.3, 0.6, 0.05, 0.29, 0.5, 0.0, 1.0]), st.floats(0.0, 1.0))
    )
    seconds = st.one_of(st.just(0.0), st.floats(0.0, 1e4))

    def ctx(waits: Sequence[tuple[float, int]] = (), **kw: Any) -> DynamicScheduleContext:
        surplus = draw(st.one_of(st.integers(-2 * s, 3 * s), st.sampled_from([0, s, -s, s // 2])))
        expected = max(0, -surplus) + draw(st.integers(0, 10 * s))
        return DynamicScheduleContext(
            required_samples=r,
            trigger_parameter_sync_step=t,
            total_generated_samples=expected + surplus,
            expected_samples=expected,
            buffer_samples=buffer,
            step_wait_times=[w for w, _ in waits],
            step_wait_samples=[n for _, n in waits],
            num_standalone_replicas=1,
            num_hybrid_replicas=1,
            **kw,
        )

    cycles = [[ctx()]]  # the initial activation (step 0): no waits yet
    for _ in range(draw(st.integers(1, 12))):
        kind = draw(st.sampled_from(["none", "zero", "waits", "time-only"]))
        if kind == "none":
            waits: list[tuple[float, int]] = []
        elif kind == "zero":
            waits = [(0.0, 0)] * t
        elif kind == "time-only":
            waits = [(draw(st.floats(0.0, 1e3)), 0) for _ in range(t)]
        else:
            waits = [(draw(seconds), draw(st.integers(0, 2 * r))) for _ in range(t)]
        before = [ctx() for _ in range(t)]
        after = ctx(
            waits,
            last_activate_duration_s=draw(seconds),
            last_deactivate_duration_s=draw(seconds),
        )
        cycles.append([*before, after])
    return ratio, cycles


def _compare(
    theirs: Any, ours: Any, cycles: list[list[DynamicScheduleContext]], *, learns: bool
) -> None:
    """Drive both in the driver's call order (the hybrid state following the decisions)
    and compare every answer and, for ``default``, the learned state after each cycle.

    Where a documented difference changes the state, it is asserted and ``ours`` is set
    to verl's state (public API) so the comparison goes on from equal states.
    """
    ctx0 = cycles[0][0]
    active = theirs.should_activate_after_step(0, False, ctx0)
    assert ours.should_activate_after_step(0, False, ctx0) == active
    g = 0
    for cycle in cycles[1:]:
        *before, after = cycle
        for ctx in before:
            g += 1
            deactivate = theirs.should_deactivate(g, active, ctx)
            assert ours.should_deactivate(g, active, ctx) == deactivate
            if deactivate:
                _assert_same_wait(
                    theirs.deactivate_wait_samples(ctx),
                    ours.deactivate_wait_samples(ctx),
                    getattr(theirs, "deactivate_ratio", 0.0),
                    ctx.step_required_samples,
                )
                active = False
        pst_before = getattr(theirs, "_last_per_sample_time", None)
        activate = theirs.should_activate_after_step(g, active, after)
        assert ours.should_activate_after_step(g, active, after) == activate, (g, after)
        if activate:
            # difference 2: verl returns None ("follow the config"), dynsched's default
            # True; both rebalance when rebalance is enabled, neither when it is not
            assert _rebalances(theirs.request_rebalance(g, after))
            assert _rebalances(ours.request_rebalance(g, after))
            active = True
        # verl's gap as its activation gate saw it (update_after_step moves the ratio)
        gap_at_gate = theirs._deactivate_gap(after) if learns else 0.0
        theirs.update_after_step(g, after)
        ours.update_after_step(g, after)
        if not learns:
            assert theirs.deactivate_ratio == ours.deactivate_ratio
            continue
        # difference 4: verl's history grows forever, ours keeps the 3 its mean uses
        assert list(ours.switch_overheads_s) == theirs._recent_switch_overheads[-3:]
        assert ours.switch_cost_s == theirs._switch_cost()
        if len(theirs._recent_switch_overheads) > 3:
            event("difference 4: verl's switch-cost history longer than its window")
        # difference 3: verl's ratio has no lower bound; ours stops at the guard rails'
        if theirs.deactivate_ratio < 0:
            assert ours.deactivate_ratio == 0.0
            event("difference 3: verl's ratio below 0")
            return  # from here verl's gap uses a negative ratio: no common state
        # difference 8: ours is rounded to 12 decimals (0.5, not 0.4999999999999999)
        assert ours.deactivate_ratio == round(theirs.deactivate_ratio, 12)
        if ours.deactivate_ratio != theirs.deactivate_ratio:
            event("difference 8: verl's ratio drifted from the decimal value")
        # difference 5: verl stores W/S only inside the activation gate, which does not
        # run when there is no gap; ours stores it after every cycle with waits
        if ours.per_sample_time_s != theirs._last_per_sample_time:
            w, n = after.total_wait_time, after.total_wait_samples
            assert w > 0 and n > 0 and not activate
            assert gap_at_gate <= 0
            assert theirs._last_per_sample_time == pst_before
            assert ours.per_sample_time_s == w / n
            event("difference 5: verl's per-sample time not refreshed (no gap)")
        ours.load_state_dict(
            {
                "deactivate_ratio": theirs.deactivate_ratio,
                "switch_overheads_s": theirs._recent_switch_overheads[-3:],
                "per_sample_time_s": theirs._last_per_sample_time,
            }
        )


@pytest.mark.parametrize(
    ("name", "builtin", "learns"),
    [
        ("default", DefaultDynamicSchedulePolicy, True),
        ("fixed_ratio", FixedRatioDynamicSchedulePolicy, False),
    ],
)
@given(run=_runs())
def test_verl_policy_decides_as_the_builtin(
    verl: VerlPolicies,
    name: str,
    builtin: type,
    learns: bool,
    run: tuple[float, list[list[DynamicScheduleContext]]],
) -> None:
    ratio, cycles = run
    with contextlib.redirect_stdout(io.StringIO()):
        _compare(
            getattr(verl, name)(deactivate_ratio=ratio),
            builtin(deactivate_ratio=ratio),
            cycles,
            learns=learns,
        )


@given(run=_runs())
def test_verl_static_decides_as_the_builtin(
    verl: VerlPolicies, run: tuple[float, list[list[DynamicScheduleContext]]]
) -> None:
    ratio, cycles = run
    theirs = verl.static(deactivate_ratio=ratio)
    ours = StaticFullyAsyncPolicy(deactivate_ratio=ratio)
    for i, cycle in enumerate(cycles):
        for ctx in cycle:
            for active in (False, True):
                assert theirs.should_deactivate(i, active, ctx) == ours.should_deactivate(
                    i, active, ctx
                )
                assert theirs.should_activate_after_step(i, active, ctx) is False
                assert ours.should_activate_after_step(i, active, ctx) is False
            assert theirs.deactivate_wait_samples(ctx) == ours.deactivate_wait_samples(ctx) == 0
            theirs.update_after_step(i, ctx)
            ours.update_after_step(i, ctx)
        # difference 2: asked only after an activation, which only the colocated guard
        # rail forces on this policy: verl's None rebalances (config), ours False does not
        assert theirs.request_rebalance(i, cycle[-1]) is None
        assert ours.request_rebalance(i, cycle[-1]) is False


# Each documented difference, shown on the smallest input that shows it.
def _cycle_ctx(s: int = 64, surplus: int = 0, **kw: Any) -> DynamicScheduleContext:
    return DynamicScheduleContext(
        required_samples=s // 4,
        trigger_parameter_sync_step=4,
        total_generated_samples=1000 + surplus,
        expected_samples=1000,
        buffer_samples=s // 2,
        num_standalone_replicas=1,
        num_hybrid_replicas=1,
        **kw,
    )


def test_difference_8_drifted_ratio_waits_one_sample_less(verl: VerlPolicies) -> None:
    """0.6 - 5 * 0.02 is 0.4999999999999999 in verl's float arithmetic: it waits for
    int(31.99...) = 31 of 64 samples where dynsched's exact 0.5 waits for 32 (the
    seed-qwen35 and balanced runs below part exactly here)."""
    theirs, ours = verl.default(deactivate_ratio=0.6), DefaultDynamicSchedulePolicy(0.6)
    quiet = _cycle_ctx(step_wait_times=[0.0] * 4, step_wait_samples=[0] * 4)
    for g in range(1, 6):
        theirs.update_after_step(g, quiet)
        ours.update_after_step(g, quiet)
    assert theirs.deactivate_ratio == 0.4999999999999999 and ours.deactivate_ratio == 0.5
    assert theirs.deactivate_wait_samples(quiet) == 31
    assert ours.deactivate_wait_samples(quiet) == 32
    # the same ratio value gives the same answer: the difference is the drift alone...
    assert verl.fixed_ratio(deactivate_ratio=0.5).deactivate_wait_samples(quiet) == 32
    # ...and verl's int() on products just below an integer: 0.29 * 100 = 28.999999999999996
    ctx100 = _cycle_ctx(s=100)
    assert verl.fixed_ratio(deactivate_ratio=0.29).deactivate_wait_samples(ctx100) == 28
    assert FixedRatioDynamicSchedulePolicy(0.29).deactivate_wait_samples(ctx100) == 29


def test_difference_3_verl_ratio_has_no_lower_bound(verl: VerlPolicies) -> None:
    """Cycles without waits push verl's ratio below 0 and its wait below 0; the driver's
    ``ratio_range`` guard rail lifts that wait to 0, the wait dynsched's bounded ratio
    proposes itself."""
    theirs, ours = verl.default(deactivate_ratio=0.05), DefaultDynamicSchedulePolicy(0.05)
    quiet = _cycle_ctx(step_wait_times=[0.0] * 4, step_wait_samples=[0] * 4)
    for g in range(1, 5):
        theirs.update_after_step(g, quiet)
        ours.update_after_step(g, quiet)
    assert theirs.deactivate_ratio == pytest.approx(-0.03) and ours.deactivate_ratio == 0.0
    proposed = theirs.deactivate_wait_samples(quiet)
    assert proposed == -1  # int(64 * -0.03)
    target, overrides = GuardRails().wait_target(proposed, quiet, cycle_remaining=64)
    assert target == 0 == ours.deactivate_wait_samples(quiet)
    assert [o.rule for o in overrides] == ["ratio_range"]


def test_difference_5_verl_per_sample_time_goes_stale(verl: VerlPolicies) -> None:
    """A cycle with waits (50 s for 10 samples) but no gap: verl's gate, which alone
    stores W/S, does not run, so verl keeps its 1000 s prior; dynsched stores 5 s. Next
    cycle, without waits and a gap of 1 sample, verl prices the gap at 1000 s > 10 s and
    activates; dynsched prices it at 5 s and does not."""
    theirs, ours = verl.default(deactivate_ratio=0.5), DefaultDynamicSchedulePolicy(0.5)
    busy = _cycle_ctx(
        surplus=64, step_wait_times=[50.0, 0.0, 0.0, 0.0], step_wait_samples=[10, 0, 0, 0]
    )
    assert theirs.should_activate_after_step(1, False, busy) is False
    assert ours.should_activate_after_step(1, False, busy) is False
    theirs.update_after_step(1, busy)
    ours.update_after_step(1, busy)
    assert theirs._last_per_sample_time == 1000.0 and ours.per_sample_time_s == 5.0
    ratio = ours.deactivate_ratio
    assert theirs.deactivate_ratio == ratio
    gap_of_one = _cycle_ctx(surplus=math.floor(ratio * 64) - 1)
    assert theirs.should_activate_after_step(2, False, gap_of_one) is True
    assert ours.should_activate_after_step(2, False, gap_of_one) is False


def test_difference_4_verl_switch_history_grows_with_the_same_mean(verl: VerlPolicies) -> None:
    theirs, ours = verl.default(), DefaultDynamicSchedulePolicy()
    for g, d in enumerate([4.0, 8.0, 6.0, 2.0, 10.0], start=1):
        ctx = _cycle_ctx(last_activate_duration_s=d, last_deactivate_duration_s=1.0)
        theirs.update_after_step(g, ctx)
        ours.update_after_step(g, ctx)
    assert theirs._recent_switch_overheads == [5.0, 9.0, 7.0, 3.0, 11.0]
    assert ours.switch_overheads_s == (7.0, 3.0, 11.0)
    assert theirs._switch_cost() == ours.switch_cost_s == 7.0


# ----------------------------------------------------------------------------------
# c. Whole simulated runs through the ScheduleDriver
# ----------------------------------------------------------------------------------
class _Recorder:
    """The guard rails' corrections and the rebalances of one run."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.overrides: list[tuple[str, str, Any, Any]] = []
        self.rebalances = 0
        wait_target, activation = GuardRails.wait_target, GuardRails.activation
        rebalance = DynamicResourceController.rebalance

        def record(out: Any) -> Any:
            self.overrides.extend((o.decision, o.rule, o.proposed, o.applied) for o in out[1])
            return out

        def wait_target_rec(rails: Any, *args: Any, **kw: Any) -> Any:
            return record(wait_target(rails, *args, **kw))

        def activation_rec(rails: Any, *args: Any, **kw: Any) -> Any:
            return record(activation(rails, *args, **kw))

        async def rebalance_rec(controller: Any) -> Any:
            self.rebalances += 1
            return await rebalance(controller)

        monkeypatch.setattr(GuardRails, "wait_target", wait_target_rec)
        monkeypatch.setattr(GuardRails, "activation", activation_rec)
        monkeypatch.setattr(DynamicResourceController, "rebalance", rebalance_rec)

    def take(self) -> tuple[list[tuple[str, str, Any, Any]], int]:
        out = (self.overrides, self.rebalances)
        self.overrides, self.rebalances = [], 0
        return out


def _run(scenario: Any, conf: str, policy: str, steps: int) -> RunResult:
    with contextlib.redirect_stdout(io.StringIO()):
        r = run_configuration(scenario, conf, policy)
    assert r.policy == policy
    # the run finished, every sample consumed exactly once
    assert all(r.conservation.values()), r.conservation
    assert r.summary["steps"] == steps
    s = r.summary
    assert s["samples_consumed"] == steps * scenario.schedule["ppo_mini_batch_size"]
    assert s["samples_produced"] == s["samples_consumed"] + s["samples_left_in_queue"]
    return r


def _same_run(theirs: RunResult, ours: RunResult) -> tuple[float | None, float | None]:
    """Equal in everything but the policy's name and the final ratio (returned)."""
    a, b = theirs.to_json(), ours.to_json()
    ra, rb = a["summary"].pop("final_deactivate_ratio"), b["summary"].pop("final_deactivate_ratio")
    a.pop("policy"), b.pop("policy")
    assert a == b
    return ra, rb


@pytest.mark.parametrize(
    ("scenario", "steps"), [("rollout-bound", 24), ("heavy-tailed", 24)], ids=lambda x: str(x)
)
def test_verl_policies_run_whole_simulations_as_the_builtins(
    verl: VerlPolicies, monkeypatch: pytest.MonkeyPatch, scenario: str, steps: int
) -> None:
    """Where verl's ratio never lands on a drifted decimal, its runs are the built-ins'
    runs bit for bit (wall clock, switches, every per-step record and metric), and the
    guard rails corrected both alike (only ``end_of_run``: no lend on the last step)."""
    rec = _Recorder(monkeypatch)
    sc = load_scenario(scenario).with_steps(steps)
    for name in ("default", "fixed_ratio", "static_fully_async"):
        theirs = _run(sc, "dynamic-16-16", PREFIX + name, steps)
        their_overrides, their_rebalances = rec.take()
        ours = _run(sc, "dynamic-16-16", name, steps)
        our_overrides, our_rebalances = rec.take()
        their_ratio, our_ratio = _same_run(theirs, ours)
        if name == "static_fully_async":
            assert our_ratio is None  # dynsched's static keeps no ratio
        else:
            assert our_ratio == round(their_ratio, 12)  # difference 8, never decisive here
        assert their_overrides == our_overrides
        assert {r for _, r, _, _ in their_overrides} <= {"end_of_run"}
        assert their_rebalances == our_rebalances
        if name != "static_fully_async":
            assert theirs.summary["activations"] > 1 and their_rebalances > 0


def test_verl_default_parts_from_the_builtin_only_at_the_drifted_ratio(
    verl: VerlPolicies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On seed-qwen35 the two runs part, and only through difference 8: every policy call
    sees the same context and gives the same answer until verl's ratio, 0.6 after five
    cycles without waits, is 0.4999999999999999 and it waits for 31 samples where the
    built-in waits for 32. No guard rail is involved."""
    rec = _Recorder(monkeypatch)
    calls: list[tuple[str, Any, Any, Any, float]] = []

    def traced(cls: type) -> type:
        class Traced(cls):  # type: ignore[misc, valid-type]
            def should_deactivate(self, g: int, active: bool, ctx: Any) -> bool:
                out = super().should_deactivate(g, active, ctx)
                calls.append(("should_deactivate", g, ctx, out, self.deactivate_ratio))
                return out

            def deactivate_wait_samples(self, ctx: Any) -> int:
                out = super().deactivate_wait_samples(ctx)
                calls.append(("deactivate_wait_samples", None, ctx, out, self.deactivate_ratio))
                return out

            def should_activate_after_step(self, g: int, active: bool, ctx: Any) -> bool:
                out = super().should_activate_after_step(g, active, ctx)
                calls.append(("should_activate_after_step", g, ctx, out, self.deactivate_ratio))
                return out

            def update_after_step(self, g: int, ctx: Any) -> None:
                super().update_after_step(g, ctx)
                calls.append(("update_after_step", g, ctx, None, self.deactivate_ratio))

        return Traced

    steps = 24
    sc = load_scenario("seed-qwen35").with_steps(steps)
    conf = "dynamic-16-16"
    theirs = _run(sc, conf, PREFIX + "default", steps)
    their_overrides, _ = rec.take()
    ours = _run(sc, conf, "default", steps)
    our_overrides, _ = rec.take()
    assert theirs.wall_clock_s != ours.wall_clock_s  # they do part...
    assert {r for _, r, _, _ in their_overrides} == {r for _, r, _, _ in our_overrides}
    assert {r for _, r, _, _ in their_overrides} <= {"end_of_run"}  # ...not by a guard rail

    dynsched_core.register_policy("test-traced-verl-default")(traced(verl.default))
    dynsched_core.register_policy("test-traced-default")(traced(DefaultDynamicSchedulePolicy))
    try:
        traced_theirs = _run(sc, conf, "test-traced-verl-default", steps)
        their_calls, calls[:] = list(calls), []
        _run(sc, conf, "test-traced-default", steps)
        our_calls = list(calls)
    finally:
        registry = _registry()
        with registry._lock:
            registry._local.pop("test-traced-verl-default", None)
            registry._local.pop("test-traced-default", None)
    a, b = traced_theirs.to_json(), theirs.to_json()
    a.pop("policy"), b.pop("policy")
    assert a == b  # tracing changed nothing

    # the first call where method, step, context or answer differ
    first = next(
        i for i, (a, b) in enumerate(zip(their_calls, our_calls, strict=False)) if a[:4] != b[:4]
    )
    assert first > 30  # five cycles of identical calls before it
    for a, b in zip(their_calls[:first], our_calls[:first], strict=True):
        assert b[4] == round(a[4], 12)  # the ratios agree to 12 decimals until then
    method, _, ctx, their_wait, their_ratio = their_calls[first]
    _, _, _, our_wait, our_ratio = our_calls[first]
    assert method == "deactivate_wait_samples"
    assert (their_ratio, our_ratio) == (0.4999999999999999, 0.5)
    assert (their_wait, our_wait) == (31, 32) and ctx.step_required_samples == 64


def test_verl_default_ratio_out_of_range_is_bounded_by_the_guard_rails(
    verl: VerlPolicies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Difference 3 in whole runs: verl's ratio leaves the guard rails' range, and so does
    the built-in's (neither clamps with the framework's bounds); the driver's one
    ``ratio_range`` rail bounds both, and the runs are the same.

    * training-bound started at 0.05: no cycle waits, verl's ratio ends below 0 (the
      built-in's at 0); no rail had to act, as verl never lends (so never waits) again;
    * seed-qwen35 with ``dynamic_schedule_min_deactivate_ratio: 0.55``: verl's ratio falls
      to 0.48 and it proposes waits of 34, 33, 31 samples (the built-in 34, 33, 32: the
      drifted 0.4999999999999999 of difference 8); the ``ratio_range`` rail lifts each to
      floor(0.55 * 64) = 35 for both.
    """
    rec = _Recorder(monkeypatch)
    steps = 40
    sc = (
        load_scenario("training-bound")
        .with_steps(steps)
        .with_values(schedule={"dynamic_schedule_deactivate_ratio": 0.05})
    )
    theirs = _run(sc, "dynamic-16-16", PREFIX + "default", steps)
    their_overrides, _ = rec.take()
    ours = _run(sc, "dynamic-16-16", "default", steps)
    our_overrides, _ = rec.take()
    their_ratio, our_ratio = _same_run(theirs, ours)
    assert their_ratio is not None and their_ratio < 0 and our_ratio == 0.0
    assert theirs.summary["activations"] == 1  # the initial lend only
    assert their_overrides == our_overrides
    assert {r for _, r, _, _ in our_overrides} <= {"end_of_run"}

    steps = 24
    sc = (
        load_scenario("seed-qwen35")
        .with_steps(steps)
        .with_values(schedule={"dynamic_schedule_min_deactivate_ratio": 0.55})
    )
    theirs = _run(sc, "dynamic-16-16", PREFIX + "default", steps)
    their_overrides, _ = rec.take()
    ours = _run(sc, "dynamic-16-16", "default", steps)
    our_overrides, _ = rec.take()
    their_ratio, our_ratio = _same_run(theirs, ours)
    # the built-in no longer clamps with the framework's bounds: its ratio drifts like
    # verl's, and the one ``ratio_range`` rail (in the driver) bounds both
    assert their_ratio is not None and their_ratio < 0.55
    assert our_ratio == round(their_ratio, 12) == 0.48
    lifted = [(d, p, a) for d, r, p, a in their_overrides if r == "ratio_range"]
    assert lifted == [("deactivate_wait_samples", p, 35) for p in (34, 33, 31)]
    ours_lifted = [(d, p, a) for d, r, p, a in our_overrides if r == "ratio_range"]
    assert ours_lifted == [("deactivate_wait_samples", p, 35) for p in (34, 33, 32)]  # diff. 8
    rest = [o for o in our_overrides if o[1] != "ratio_range"]
    assert [o for o in their_overrides if o[1] != "ratio_range"] == rest
    assert {r for _, r, _, _ in rest} <= {"end_of_run"}


def test_verl_colocated_branch_matches_the_colocated_guard_rail(
    verl: VerlPolicies, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Colocated (no standalone replica; the config passes ``only_hybrid=True``): verl's
    ``default`` runs its own colocated branch (ratio 1.0, always activate), dynsched's
    built-in leaves it to the ``colocated`` guard rail; the runs are the same. For
    ``static_fully_async`` (difference 2) verl's ``request_rebalance`` None asks the driver
    for the configured rebalance after each forced activation, the built-in's False does
    not: the rebalances differ, the wall clock and every counter do not."""
    rec = _Recorder(monkeypatch)
    steps = 12
    sc = load_scenario("colocated").with_steps(steps)
    theirs = _run(sc, "colocated-32", PREFIX + "default", steps)
    their_overrides, _ = rec.take()
    ours = _run(sc, "colocated-32", "default", steps)
    our_overrides, _ = rec.take()
    assert theirs.summary["final_deactivate_ratio"] == 1.0  # verl's only_hybrid branch
    theirs_json, ours_json = theirs.to_json(), ours.to_json()
    for j in (theirs_json, ours_json):
        j.pop("policy"), j["summary"].pop("final_deactivate_ratio")
    assert theirs_json == ours_json
    assert {r for _, r, _, _ in their_overrides} <= {"end_of_run"}
    assert "colocated" in {r for _, r, _, _ in our_overrides}

    theirs = _run(sc, "colocated-32", PREFIX + "static_fully_async", steps)
    _, their_rebalances = rec.take()
    ours = _run(sc, "colocated-32", "static_fully_async", steps)
    _, our_rebalances = rec.take()
    assert theirs.summary["activations"] == ours.summary["activations"] > 0
    assert their_rebalances == theirs.summary["activations"] - 1  # not the initial one
    assert our_rebalances == 0
    assert theirs.wall_clock_s == ours.wall_clock_s
    a, b = dict(theirs.summary), dict(ours.summary)
    a.pop("final_deactivate_ratio"), b.pop("final_deactivate_ratio")
    assert a == b
