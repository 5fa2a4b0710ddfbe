"""``predictive``: lend hybrid replicas when, and as much as, a small fitted model says it pays."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
from dynsched_core import DynamicScheduleContext, DynamicSchedulePolicyBase
from dynsched_core import validators as v
from dynsched_core.derived import ratio_samples
from dynsched_core.events import (
    MembershipEvent,
    RolloutEvent,
    SwitchEvent,
    TrainStepEvent,
    TransitionEvent,
)

from dynsched_policies._common import check_bool, check_number, check_state_keys, clamp_ratio
from dynsched_policies._estimators import (
    Estimate,
    LatencyFit,
    LinearTrend,
    LoadRateModel,
    MeanEstimate,
    RateModel,
)

__all__ = ["PredictiveDynamicSchedulePolicy", "PredictiveOptions"]

logger = logging.getLogger(__name__)

#: Timing keys the loop adds to the trainer's own phases (not training time).
_NOT_TRAINING = frozenset({"wait_for_enough_samples", "gen", "param_sync", "step"})
#: Steps of the cycle the fluid model looks at, at most (bounds the cost of a decision).
_MAX_HORIZON = 64
#: Wait targets tried per decision, at most.
_MAX_TARGETS = 16
#: Integration steps of a pool whose concurrency drains below its cap.
_DRAIN_STEPS = 8
#: Rate models (``rate_model``).
_RATE_MODELS = ("saturated", "little")


@attrs.frozen(kw_only=True)
class PredictiveOptions:
    """Tuning knobs of `PredictiveDynamicSchedulePolicy` (validated; errors name the field).

    Attributes:
        z: Width of the prediction intervals, in standard deviations, in ``[0, 10]``.
        hybrid_rate_prior: Rate of one hybrid replica relative to one standalone
            replica before it was measured, in ``[0, 10]`` (judgement: 1.0, the same
            engine on the same GPU type; the smaller memory fraction of a hybrid only
            binds when its KV cache does).
        rate_window: Cycles of rate observations kept, in ``[1, 1000]``.
        step_window: Training steps in the step-time trend, in ``[2, 1000]``.
        cost_window: Switches in the cost estimates, in ``[1, 1000]``.
        mid_cycle: Also lend at step boundaries inside a cycle when it pays.
        mid_cycle_margin: Switches a mid-cycle lend must win back (model error margin),
            in ``[0, 100]``.
        fit_hybrid_rate: Fit the hybrid rate ``b`` freely (two-parameter least squares
            with the prior as one pseudo-cycle) instead of at the prior's share of the
            fitted per-replica rate (``rate_model="saturated"`` only).
        rate_model: ``"saturated"`` (rates at the concurrency cap) or ``"little"``
            (rates as a function of the samples running, Little's law).

    Raises:
        dynsched_core.errors.ConfigTypeError: a value has the wrong type (a `TypeError`).
        dynsched_core.ConfigError: a value is out of range.
    """

    z: float = attrs.field(default=1.0, validator=v.float_in(0.0, 10.0))
    hybrid_rate_prior: float = attrs.field(default=1.0, validator=v.float_in(0.0, 10.0))
    rate_window: int = attrs.field(default=3, validator=v.int_ge(1, maximum=1000))
    step_window: int = attrs.field(default=16, validator=v.int_ge(2, maximum=1000))
    cost_window: int = attrs.field(default=4, validator=v.int_ge(1, maximum=1000))
    mid_cycle: bool = attrs.field(default=False, validator=v.bool_())
    mid_cycle_margin: float = attrs.field(default=1.0, validator=v.float_in(0.0, 100.0))
    fit_hybrid_rate: bool = attrs.field(default=False, validator=v.bool_())
    rate_model: str = attrs.field(
        default="saturated",
        validator=[v.non_empty_str(f"one of {list(_RATE_MODELS)}"), v.one_of(_RATE_MODELS)],
    )

    @classmethod
    def with_knobs(
        cls, owner: str, options: PredictiveOptions | None, knobs: Mapping[str, Any]
    ) -> PredictiveOptions:
        """``options`` (default: every knob at its default) with ``knobs`` replacing fields.

        Raises:
            TypeError: ``options`` is not a `PredictiveOptions`, or a knob is not one of
                its fields (the message lists them).
        """
        base = v.options_or_default(options, cls)
        names = [f.name for f in attrs.fields(cls)]
        unknown = sorted(set(knobs) - set(names))
        if unknown:
            raise TypeError(f"{owner}: unknown argument(s) {unknown}; the tuning knobs are {names}")
        return attrs.evolve(base, **knobs) if knobs else base


class _Pool:
    """Samples/s of the rollout pool as a function of the supply left in the window.

    ``rate(N)`` is the completion rate with ``N`` samples in flight; the pool runs
    ``min(cap, supply)`` of them (the rollouter admits up to its cap while the staleness
    window lets it; once the window is spent the in-flight ones drain). A constant rate
    (``cap = inf`` and ``rate`` constant, the saturated model) makes `produce` and
    `time_for` the plain fluid ``min(rate * t, supply)`` and ``need / rate``.
    """

    __slots__ = ("_cap_rate", "cap", "const", "rate")

    def __init__(self, rate: Any, cap: float = math.inf, const: float | None = None) -> None:
        self.rate = rate
        self.cap = cap
        self.const = const
        self._cap_rate = const if const is not None else (rate(cap) if cap < math.inf else None)

    def produce(self, supply: float, seconds: float) -> float:
        """Samples completed in ``seconds`` from ``supply`` (at most ``supply``)."""
        if supply <= 0 or seconds <= 0:
            return 0.0
        if self.const is not None:
            return min(self.const * seconds, supply)
        s, t = supply, seconds
        if self._cap_rate is not None and s > self.cap:  # saturated until s falls to cap
            x = self._cap_rate
            if x <= 0:
                return 0.0
            if (s - self.cap) >= x * t:
                return x * t
            t -= (s - self.cap) / x
            s = self.cap
        dt = t / _DRAIN_STEPS
        for _ in range(_DRAIN_STEPS):  # midpoint steps of dN/dt = -rate(N)
            half = max(0.0, s - 0.5 * dt * self.rate(s))
            s = max(0.0, s - dt * self.rate(half))
            if s <= 0:
                break
        return supply - s

    def wait_for(self, need: float, supply: float) -> float:
        """Seconds until ``need`` more samples complete; beyond ``supply`` at the cap's rate.

        (What the window cannot deliver comes after the next sync, with the pool full.)
        """
        if self.const is not None:
            return need / self.const if self.const > 0 else math.inf
        got = min(max(need, 0.0), max(supply, 0.0))
        t = self.time_for(got, supply)
        if need > got:
            x = self._cap_rate if self._cap_rate is not None else self.rate(need)
            t += (need - got) / x if x > 0 else math.inf
        return t

    def time_for(self, need: float, supply: float) -> float:
        """Seconds to complete ``need`` of ``supply`` samples (inf when it cannot)."""
        if need <= 0:
            return 0.0
        if self.const is not None:
            return need / self.const if self.const > 0 else math.inf
        if need > supply:
            return math.inf
        t, s, left = 0.0, supply, need
        if self._cap_rate is not None and s > self.cap:
            x = self._cap_rate
            part = min(left, s - self.cap)
            if x <= 0:
                return math.inf
            t += part / x
            s -= part
            left -= part
        if left > 0:
            chunk = left / _DRAIN_STEPS
            for _ in range(_DRAIN_STEPS):
                x = self.rate(s - 0.5 * chunk)
                if x <= 0:
                    return math.inf
                t += chunk / x
                s -= chunk
        return t


def _expected_shortfall(gap: float, var: float) -> float:
    """``E[(gap + X)^+]`` for ``X ~ N(0, var)``: samples waited for, on average."""
    if var <= 0:
        return max(0.0, gap)
    sd = math.sqrt(var)
    d = gap / sd
    cdf = 0.5 * math.erfc(-d / math.sqrt(2.0))
    pdf = math.exp(-0.5 * d * d) / math.sqrt(2.0 * math.pi)
    return max(0.0, gap * cdf + sd * pdf)


def _waits(gap: float, var: float) -> float:
    """Probability that the trainer waits, ``P(gap + X > 0)``, ``X ~ N(0, var)``."""
    if var <= 0:
        return 1.0 if gap > 0 else 0.0
    return 0.5 * math.erfc(-gap / math.sqrt(2.0 * var))


class PredictiveDynamicSchedulePolicy(DynamicSchedulePolicyBase):
    """Lend the number of hybrid replicas, for the time, that minimises the predicted cycle.

    Online estimates, from the events the core already emits (`observe`), each a small
    model refitted as data arrive, with a prediction interval:

    - the rollout pool's sample throughput, refitted per cycle over the last
      ``rate_window`` cycles (response lengths drift). ``rate_model="saturated"``:
      ``X(h) = a + b * h`` with ``h`` hybrid replicas lent, from completions while the
      rollouter was saturated (every replica at its concurrency cap); by default one
      rate per replica with ``b / a = hybrid_rate_prior / standalone replicas`` (a lent
      pool is rarely saturated: the staleness window binds first, and what it is
      saturated for is confounded by ramp-up and migrations, so a free ``b`` is not
      identified and its fit collapsed towards 0 on rollout-bound deployments, skipping
      lends that pay). ``rate_model="little"``: a function of the samples running,
      ``X(N, R) = N / W(N / R)`` for ``N`` in flight on ``R`` routable replicas, the
      mean latency ``W(n) = alpha + beta * n`` of a replica running ``n`` (a decode
      iteration's time grows linearly with the batch) fitted on every interval between
      events, saturated or not (`LoadRateModel`; routable replicas from the membership
      events, hybrids at ``hybrid_rate_prior`` of a standalone one); the fluid model
      then runs the pool at the concurrency it will actually have, ``min(cap, what
      the staleness window still admits)``, so it drains as the window is spent and a
      lend only helps as much as its extra concurrency and lighter per-replica load do;
    - the trainer's micro-step time as a linear trend over the last ``step_window``
      steps (responses grow: steps get slower);
    - the activation and deactivation costs (mean and spread of the last
      ``cost_window`` switches).

    At every decision point (after a weight sync, and at every step boundary while no
    hybrid replica is lent) a fluid model of the rest of the cycle predicts the time to
    the cycle's last training step: the trainer waits whenever fewer than
    ``required_samples`` are buffered (the expected shortfall, completions counted as
    Poisson) while the pool produces at ``X``, up to the staleness ceiling. Lending ``k`` replicas until ``W`` samples are buffered costs an
    activation plus a deactivation; the policy lends (``k``, ``W``) only when the
    pessimistic prediction (switch costs at their upper, hybrid rate at its lower
    ``z``-sigma bound) beats not lending. So it never lends when the trainer is the
    bottleneck (nothing would be waited for: it behaves as the static split) and lends
    everything, until the cycle's demand is buffered, when rollout is.

    Before the first estimates it lends everything after the initial weight sync (the
    trainer has nothing to train on yet) and waits for ``deactivate_ratio`` of a cycle,
    as ``default`` does.

    Args:
        deactivate_ratio: Wait target (fraction of a cycle) before any estimate exists.
        only_hybrid: What verl passes; the driver applies the colocated schedule.
        options: The tuning knobs (`PredictiveOptions`; default: every knob at its
            default).
        **knobs: `PredictiveOptions` fields by keyword (``z=2.0``,
            ``rate_model="little"``, ...; what ``build_policy("predictive", ...)`` and
            verl's config pass), replacing those of ``options``.

    Raises:
        TypeError: an argument has the wrong type, or a knob is unknown.
        dynsched_core.ConfigError: an argument is out of range.
    """

    #: Ratio steps of the wait feedback (as ``default``): up by the waited share of a
    #: cycle clipped to [MIN_INCREASE, MAX_INCREASE], down by DECREASE otherwise.
    MIN_INCREASE: ClassVar[float] = 0.02
    MAX_INCREASE: ClassVar[float] = 0.1
    DECREASE: ClassVar[float] = 0.02

    _STATE_KEYS: ClassVar[frozenset[str]] = frozenset(
        {
            "rates",
            "load_rates",
            "membership",
            "steps",
            "activate_s",
            "deactivate_s",
            "tracker",
            "steps_seen",
            "lend_k",
            "lent_after_sync",
            "cycle_lent",
            "deactivate_ratio",
            "window",
        }
    )

    def __init__(
        self,
        deactivate_ratio: float = 0.3,
        only_hybrid: bool = False,
        *,
        options: PredictiveOptions | None = None,
        **knobs: Any,
    ) -> None:
        owner = type(self).__name__
        self.only_hybrid = check_bool(owner, "only_hybrid", only_hybrid)
        self.deactivate_ratio = check_number(owner, "deactivate_ratio", deactivate_ratio, 0.0, 1.0)
        self.options = PredictiveOptions.with_knobs(owner, options, knobs)
        opt = self.options
        self.rates = RateModel(opt.rate_window)
        self.load_rates = LoadRateModel(opt.rate_window)
        # membership: routable replica ids (None before any membership event), the
        # hybrid replica ids and standalone replicas (from the contexts), and the
        # concurrency cap per routable replica (largest capacity / routable seen)
        self._routable: tuple[str, ...] | None = None
        self._hybrid_ids: tuple[str, ...] = ()
        self._standalone = 0
        self._cap_per_replica = 0.0
        self.step_time = LinearTrend(opt.step_window)
        self.activate_cost = MeanEstimate(opt.cost_window)
        self.deactivate_cost = MeanEstimate(opt.cost_window)
        # event tracker: [time, active, capacity, lent hybrids] of the last rollout event
        self._tracker: list[float] = [math.nan, 0.0, 0.0, 0.0]
        self._steps_seen = 0
        self._lend_k = 0  # hybrid replicas the last activation decision lends
        self._lent_after_sync = False  # the current lend started after a weight sync
        self._cycle_lent = False  # the cycle now ending started with a lend
        # staleness window: queued at the last sync, in flight at its reset, admitted since
        self._queue_at_sync = 0.0
        self._active_at_reset = 0.0
        self._submits = 0

    # ------------------------------------------------------------------ estimates
    def observe(self, event: Any) -> None:
        """Feed one event of the driver's bus into the estimates."""
        if isinstance(event, RolloutEvent):
            self._advance(
                event.time, completed=event.kind == "complete", done=event.kind == "drain"
            )
            if event.kind == "submit":
                self._submits += 1
            elif event.kind == "reset":
                self._submits = 0
                self._active_at_reset = float(event.active)
            self._tracker[1] = float(event.active)
            self._tracker[2] = float(event.capacity)
            replicas = self._replicas()[0]
            if replicas > 0 and event.capacity > 0:
                self._cap_per_replica = max(self._cap_per_replica, event.capacity / replicas)
        elif isinstance(event, MembershipEvent):
            self._advance(event.time, completed=False)
            routable = tuple(event.routable)
            if routable != self._routable:
                self.load_rates.new_window()
            self._routable = routable
        elif isinstance(event, TransitionEvent):
            self._advance(event.time, completed=False)
            self._tracker[3] = float(self._lend_k if event.target == "HYBRID_ACTIVE" else 0)
        elif isinstance(event, SwitchEvent) and event.ok:
            if event.kind == "activate":
                self.activate_cost.add(event.end - event.start)
            elif event.kind == "deactivate":
                self.deactivate_cost.add(event.end - event.start)
        elif isinstance(event, TrainStepEvent):
            train_s = sum(v for k, v in event.timings.items() if k not in _NOT_TRAINING)
            self._steps_seen += 1
            if train_s > 0:
                self.step_time.add(float(self._steps_seen), float(train_s))

    def _replicas(self) -> tuple[int, int]:
        """``(routable, hybrids among them)`` now (from the membership events if any)."""
        lent = int(self._tracker[3])
        if self._routable is None:  # no membership events: the contexts and transitions
            return (self._standalone + lent if self._standalone else 0), lent
        routable = len(self._routable)
        if self._hybrid_ids:
            hyb = set(self._hybrid_ids)
            return routable, sum(1 for r in self._routable if r in hyb)
        return routable, max(0, routable - self._standalone) if self._standalone else 0

    def _advance(self, now: float, *, completed: bool, done: bool = False) -> None:
        """Close the interval since the last event (``done``: a drained completion)."""
        t, active, capacity, lent = self._tracker
        if not math.isnan(t) and now >= t:
            if capacity > 0 and active >= capacity:
                self.rates.add(int(lent), now - t, 1 if completed else 0)
            replicas, hybrids = self._replicas()
            self.load_rates.add(active, replicas, hybrids, now - t, 1 if completed or done else 0)
        self._tracker[0] = float(now)

    def _learn_context(self, ctx: DynamicScheduleContext) -> None:
        self._standalone = ctx.num_standalone_replicas
        if ctx.hybrid_replica_ids:
            self._hybrid_ids = tuple(ctx.hybrid_replica_ids)

    def _pools(
        self, ctx: DynamicScheduleContext, ks: list[int]
    ) -> tuple[_Pool, dict[int, _Pool]] | None:
        """The pool without lending and with ``k`` lent (at the pessimistic bound), per ``k``."""
        if self.options.rate_model == "saturated":
            rates = self.rates_of(ctx)
            if rates is None:
                return None
            a, hyb = rates
            b_low = hyb.lower(self.options.z)
            return _Pool(None, const=a.value), {
                k: _Pool(None, const=a.value + k * b_low) for k in ks
            }
        fit = self.load_rates.fit(self.options.hybrid_rate_prior)
        s = ctx.num_standalone_replicas
        if fit is None or s + max(ks, default=0) <= 0:
            return None
        per_cap = self._cap_per_replica or math.inf
        prior, z = self.options.hybrid_rate_prior, self.options.z

        def base_rate(n: float, f: LatencyFit = fit) -> float:
            return f.rate(min(n, per_cap * s), s).value if s > 0 else 0.0

        base = _Pool(base_rate, per_cap * s)
        lends = {}
        for k in ks:
            r = s + k
            share = (s + prior * k) / r

            def lend_rate(n: float, r: int = r, share: float = share) -> float:
                est = fit.rate(min(n, per_cap * r), r, share)
                return max(base_rate(n), est.lower(z))

            lends[k] = _Pool(lend_rate, per_cap * r)
        return base, lends

    def rates_of(self, ctx: DynamicScheduleContext) -> tuple[Estimate, Estimate] | None:
        """``(a, b)``: samples/s of the standalone pool and of one lent hybrid replica."""
        return self.rates.fit(
            ctx.num_standalone_replicas,
            self.options.hybrid_rate_prior,
            free=self.options.fit_hybrid_rate,
        )

    def predicted_step_s(self, steps_ahead: int = 1) -> Estimate | None:
        """The trainer's micro-step time ``steps_ahead`` steps from now (None before any)."""
        return self.step_time.predict(float(self._steps_seen + steps_ahead))

    def switch_cost_s(self) -> tuple[float, float] | None:
        """Upper ``z`` bounds of (activation, deactivation) seconds; None before any."""
        act, deact = self.activate_cost.estimate(), self.deactivate_cost.estimate()
        if act is None or deact is None:
            return None
        return act.upper(self.options.z), deact.upper(self.options.z)

    # ------------------------------------------------------------------ the model
    def _fluid(
        self,
        q: float,
        supply: float,
        taus: list[float],
        rate: float | _Pool,
        ctx: DynamicScheduleContext,
    ) -> float:
        """Predicted seconds to train the cycle's remaining steps without lending.

        ``q``: samples buffered; ``supply``: samples the rollouter can still deliver
        before the next weight sync (in flight plus what the staleness window still
        admits); ``taus``: predicted step times of the remaining steps; ``rate``:
        standalone samples/s, or the pool (its rate a function of the supply left).

        Completions are counted as Poisson (variance = mean), so the buffer at each step
        is ``N(q, var)`` and the trainer waits for the *expected* shortfall
        ``E[(b - Q)^+]``: with the mean just covering the demand a deterministic fluid
        predicts no wait, but half the time the step does wait (on ``balanced`` the
        deterministic model skipped every other lend and the cycle after waited).
        """
        pool = rate if isinstance(rate, _Pool) else _Pool(None, const=rate)
        b = ctx.required_samples
        t = 0.0
        var = 0.0  # variance of the buffer: Poisson completions since the decision
        for tau in taus:
            short = _expected_shortfall(b - q, var)
            if short > 0:
                t += pool.wait_for(short, supply)
                supply = max(0.0, supply - short)
                # the buffer is topped up to b whenever it falls short: less spread
                var *= 1.0 - _waits(b - q, var)
                q += short
            q -= b
            t += tau
            made = pool.produce(supply, tau)
            q += made
            var += made
            supply -= made
        return t

    def _supply(self, ctx: DynamicScheduleContext, *, after_sync: bool) -> float:
        """Samples the rollouter can deliver before the next sync beyond the queue.

        verl's staleness rule: a window admits ``step_required_samples + buffer_samples``
        samples, the queued and in-flight ones at the window's start included.
        """
        active = self._tracker[1]
        window = ctx.step_required_samples + ctx.buffer_samples
        if after_sync:  # the window about to open counts what is queued and in flight
            counted = ctx.queue_size + active
        else:
            counted = self._queue_at_sync + self._active_at_reset + self._submits
        return active + max(0.0, window - counted)

    def _plan(
        self, ctx: DynamicScheduleContext, *, active: bool, after_sync: bool = False
    ) -> tuple[int, int, float]:
        """Best ``(k, W, gain_s)``: lend ``k`` replicas until ``W`` samples are buffered.

        ``active``: the replicas are already lent (only the wait is decided; no activation
        cost). ``k = 0`` means do not lend (or deactivate now). A target the staleness
        window cannot deliver before the next sync is never chosen (the wait would only
        end at the driver's timeout).
        """
        self._learn_context(ctx)
        cost = self.switch_cost_s()
        tau0 = self.predicted_step_s(1)
        m = ctx.num_hybrid_replicas
        ks = sorted({1, max(1, m // 2), m})
        if active:
            ks = [max(1, ctx.num_active_hybrid_replicas or m)]
        pools = self._pools(ctx, ks) if m > 0 else None
        if pools is None or cost is None or tau0 is None:
            return -1, -1, 0.0  # no model yet
        base_pool, lend_pools = pools
        t_cycle = ctx.trigger_parameter_sync_step
        # steps of the cycle consumed before the one being decided on (after a weight
        # sync: the next cycle, none)
        pos = 0 if after_sync else min(max(ctx.cycle_step - 1, 0), t_cycle - 1)
        left = min(t_cycle - pos, _MAX_HORIZON)
        taus = []
        for i in range(left):
            est = self.predicted_step_s(i + 1)
            taus.append(max(0.0, est.value if est is not None else tau0.value))
        q = float(ctx.queue_size)
        supply = self._supply(ctx, after_sync=after_sync)
        b = ctx.required_samples
        act_s, deact_s = (0.0, cost[1]) if active else cost
        base = self._fluid(q, supply, taus, base_pool, ctx)
        best = (0, 0, 0.0)
        demand = left * b
        hi = min(demand, ratio_samples(ctx.max_deactivate_ratio, ctx.step_required_samples))
        stride = max(b, math.ceil(hi / _MAX_TARGETS))
        made_act = base_pool.produce(supply, act_s)
        for k in ks:
            lend_pool = lend_pools[k]
            for w in range(b, hi + 1, stride):
                qq, left_supply, t = q + made_act, supply - made_act, act_s
                if qq < w:
                    if w - qq > left_supply:
                        break  # the window cannot deliver w before the sync
                    t += lend_pool.time_for(w - qq, left_supply)
                    left_supply -= w - qq
                    qq = w
                made = base_pool.produce(left_supply, deact_s)
                t += deact_s + self._fluid(qq + made, left_supply - made, taus, base_pool, ctx)
                gain = base - t
                if gain > best[2]:
                    best = (k, w, gain)
        logger.debug(
            "plan active=%s after_sync=%s pos=%d q=%.0f supply=%.0f tau=%.4g "
            "cost=%s base=%.4g -> k=%d W=%d gain=%.4g",
            active,
            after_sync,
            pos,
            q,
            supply,
            tau0.value,
            cost,
            base,
            *best,
        )
        return best

    # ------------------------------------------------------------------ decisions
    def should_deactivate(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Always before training while lent (the trainer needs its GPUs)."""
        return is_hybrid_active

    def deactivate_wait_samples(self, ctx: DynamicScheduleContext) -> int:
        """The wait target minimising the predicted rest of the cycle (0: deactivate now)."""
        hi = ctx.step_required_samples + ctx.buffer_samples
        if self._lent_after_sync:
            return min(hi, ratio_samples(self.deactivate_ratio, ctx.step_required_samples))
        k, w, _ = self._plan(ctx, active=True)
        if k < 0:  # no model yet: as default does
            return min(hi, ratio_samples(self.deactivate_ratio, ctx.step_required_samples))
        return max(0, min(hi, w if k > 0 else 0))

    def should_activate_after_step(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Lend after the weight sync when the model predicts a gain (first cycle: lend)."""
        self._queue_at_sync = float(ctx.queue_size)
        k, _, gain = self._plan(ctx, active=False, after_sync=True)
        if k < 0:
            self._lend_k = ctx.num_hybrid_replicas
            lend = global_steps == 0 or ctx.total_wait_samples > 0
        else:
            self._lend_k = k
            lend = k > 0 and gain > 0
        self._lent_after_sync = lend
        return lend

    def should_activate_mid_cycle(
        self, global_steps: int, is_hybrid_active: bool, ctx: DynamicScheduleContext
    ) -> bool:
        """Lend at a step boundary when the model predicts a gain (never without a model)."""
        if is_hybrid_active or not self.options.mid_cycle:
            return False
        k, _, gain = self._plan(ctx, active=False)
        cost = self.switch_cost_s()
        # a lend inside a cycle must win back more than a whole switch (model error margin)
        if k <= 0 or cost is None or gain <= self.options.mid_cycle_margin * (cost[0] + cost[1]):
            return False
        self._lend_k = k
        self._lent_after_sync = False
        return True

    def hybrid_replicas_to_activate(self, global_steps: int, ctx: DynamicScheduleContext) -> int:
        """The ``k`` of the last lending decision (at least 1)."""
        return max(1, min(self._lend_k or ctx.num_hybrid_replicas, ctx.num_hybrid_replicas))

    def request_rebalance(self, global_steps: int, ctx: DynamicScheduleContext) -> bool | None:
        """Rebalance after an activation (subject to the driver's config), as ``default``."""
        return True

    def update_after_step(self, global_steps: int, ctx: DynamicScheduleContext) -> None:
        """Close the cycle's rate buckets; adapt the wait of after-sync lends to the waits."""
        self.rates.end_cycle()
        self.load_rates.end_cycle()
        if global_steps <= 0 or not self._cycle_lent:
            self._cycle_lent = self._lent_after_sync
            return
        if ctx.total_wait_samples > 0:
            share = ctx.total_wait_samples / ctx.step_required_samples
            ratio = self.deactivate_ratio + min(max(share, self.MIN_INCREASE), self.MAX_INCREASE)
        else:
            ratio = self.deactivate_ratio - self.DECREASE
        ratio = round(ratio, 12)
        self.deactivate_ratio = clamp_ratio(ratio)
        self._cycle_lent = self._lent_after_sync

    # ------------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Every estimate's observations and the event tracker, as plain data."""
        return {
            "rates": self.rates.state(),
            "load_rates": self.load_rates.state(),
            "membership": {
                "routable": None if self._routable is None else list(self._routable),
                "hybrid_ids": list(self._hybrid_ids),
                "standalone": self._standalone,
                "cap_per_replica": self._cap_per_replica,
            },
            "steps": self.step_time.state(),
            "activate_s": self.activate_cost.state(),
            "deactivate_s": self.deactivate_cost.state(),
            "tracker": [None if math.isnan(x) else x for x in self._tracker],
            "steps_seen": self._steps_seen,
            "lend_k": self._lend_k,
            "lent_after_sync": self._lent_after_sync,
            "cycle_lent": self._cycle_lent,
            "deactivate_ratio": self.deactivate_ratio,
            "window": [self._queue_at_sync, self._active_at_reset, self._submits],
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore `state_dict` output.

        Raises:
            TypeError: ``state`` is not a mapping.
            ValueError: keys are missing or unknown, or a value is malformed.
        """
        owner = type(self).__name__
        check_state_keys(owner, state, self._STATE_KEYS)
        try:
            self.rates.load(state["rates"])
            self.load_rates.load(state["load_rates"])
            mem = state["membership"]
            routable = mem["routable"]
            self._routable = None if routable is None else tuple(str(r) for r in routable)
            self._hybrid_ids = tuple(str(r) for r in mem["hybrid_ids"])
            self._standalone = int(mem["standalone"])
            self._cap_per_replica = float(mem["cap_per_replica"])
            self.step_time.load(state["steps"])
            self.activate_cost.load(state["activate_s"])
            self.deactivate_cost.load(state["deactivate_s"])
            tracker = [math.nan if x is None else float(x) for x in state["tracker"]]
            if len(tracker) != 4:
                raise ValueError("tracker must have 4 entries")
            self._tracker = tracker
            self._steps_seen = int(state["steps_seen"])
            self._lend_k = int(state["lend_k"])
            window = [float(x) for x in state["window"]]
            self._queue_at_sync, self._active_at_reset = window[0], window[1]
            self._submits = int(window[2])
            self._lent_after_sync = bool(state["lent_after_sync"])
            self._cycle_lent = bool(state["cycle_lent"])
            self.deactivate_ratio = check_number(
                owner, "state['deactivate_ratio']", state["deactivate_ratio"], 0.0, 1.0
            )
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValueError(f"{owner}.load_state_dict: malformed state: {exc}") from exc

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(z={self.options.z!r}, deactivate_ratio={self.deactivate_ratio!r}, "
            f"rate_model={self.options.rate_model!r})"
        )
