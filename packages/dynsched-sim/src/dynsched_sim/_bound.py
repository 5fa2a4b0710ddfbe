"""A lower bound on the wall-clock of a configuration that any policy must respect.

The bound relaxes a run to what no schedule can avoid and keeps the structure that makes
fully-async training slow: a serial trainer, in-order staleness admission, replicas whose
throughput saturates at their concurrency cap, hybrid replicas that cannot generate while
their trainer trains, blocking weight syncs and stragglers. Notation for one configuration:

* ``S`` micro-steps of ``q = required_samples`` samples; ``T`` micro-steps per weight sync;
  step ``k`` (1-based) lies in staleness window ``v(k) = (k - 1) // T``;
* admission is in prompt order and, by the staleness rule, the prompts admitted up to the
  end of window ``v`` are the first ``A(v)``: ``A(v) = T q v + M`` under verl's rule
  (``in flight + queued <= M = max_required_samples``), ``(v + 1) M`` under the in-flight
  rule; so the samples trained by step ``k`` are ``k q`` distinct prompts among the first
  ``A(v(k))``, and prompt ``i`` cannot start before window ``w(i)`` (the first ``w`` with
  ``i < A(w)``) opens;
* prompt group ``i``: ``R_i`` response tokens, ``L_i`` its longest response, ``K_i``
  training tokens, ``P_i`` prompt tokens;
* replicas: the throughput of a replica running ``x`` sequences is ``f(x) = x r(x)``
  (`EngineModel`), increasing and concave; at most ``C`` samples (below) and so ``n C``
  sequences are ever in flight and a replica runs at most ``max_running`` of them, so the
  standalone pool produces at most ``P_s = max sum f(x_j)`` tokens/s (water-filling over its
  replicas) and the hybrid replicas add at most ``P_h`` (the same over all replicas, minus
  ``P_s``, or over the hybrid replicas alone, whichever is larger: a sync pauses only the
  standalone ones); ``r_1 = r(1)`` is the fastest a single sequence ever decodes;
* trainer: a step over samples with ``K`` tokens takes ``f(K) = TrainerModel.step_time_s(g_T,
  K)`` (plus the state swap when the trainer offloads): the fixed overhead, the gradient
  all-reduce, the compute and expert traffic per token and the pipeline bubble, which grows
  with ``K`` up to a cap, so ``f`` is concave; a step trains ``q`` samples, so ``K_min <= K
  <= K_max(v)`` (``K_min``: ``q`` times the fewest tokens of a prompt group; ``K_max(v)``:
  the ``q`` largest ``K`` among the first ``A(v)`` prompts); every ``T``-th step ends
  with a blocking broadcast of ``y`` seconds during which standalone replicas do not
  decode; hybrid replicas decode only while their trainer is not training (memory is
  conserved) and only after a first wake-up and weight sync of ``h`` seconds.

Writing ``SK(v, x)`` / ``SR(v, x)`` for the sum of the ``x`` smallest ``K`` / ``R`` among the
first ``A(v)`` prompts, and ``train(j..k)`` for the least training time of steps ``j..k``
(the least of ``sum f(K_i)`` over ``m = k - j + 1`` steps with ``K_min <= K_i <=
K_max(v(k))`` and ``sum K_i = K``, ``K`` the larger of ``SK(v(k), m q)`` and ``SK(v(k), k
q)`` minus the ``(j - 1) q`` largest ``K`` of the first ``A(v(j - 1))``: steps ``1..k``
train ``k q`` of those prompts, steps ``< j`` at most the largest; a concave sum is least at
a vertex of that set, where every step but one has ``K_min`` or ``K_max`` tokens and the
total says how many have ``K_max``), a lower bound ``t_k`` on the start of step ``k``'s
training is the largest of

1. *serial trainer*: ``t_j + train(j..k-1) + y * (syncs in steps j..k-1)`` for every
   ``j < k``;
2. *tokens*: the ``k q`` samples need ``SR(v(k), k q)`` tokens, and by time ``t`` the
   replicas produced at most ``P_s (t - y (k-1)//T) + P_h (t - h - train(1..k-1))``; the
   same holds from the opening ``O_w`` of every window ``w <= v(k)`` for the samples that
   must come from prompts admitted at or after it (at least ``k q - A(w - 1)`` of them);
2b. *decode*: a sample is done only once its longest response ``L_i`` has decoded, one token
   per iteration of the replica running it; a replica running ``x`` sequences, ``c <= x``
   of them some in-flight sample's longest response, makes ``x`` tokens and ``c`` such
   *chain steps* per iteration of at least ``b + a x`` seconds, with at most ``C``
   samples and ``n C`` sequences in flight in all. So for every weight ``0 <= lam <= 1``
   (`DECODE_WEIGHTS`) the replicas make at most ``D(lam)`` of ``lam * chain steps + (1 -
   lam) * tokens`` per second (`decode_rates`: the Lagrangian dual of that maximum, an
   upper bound by weak duality), ``D_s`` standalone and ``D_h`` hybrid as for the tokens,
   and the ``k q`` samples need ``lam SL + (1 - lam) SR`` of it (``SL``: the sum of the
   ``k q`` smallest ``L``); the same timing as 2, from the start and every ``O_w``. Counting
   tokens alone, or each sample's chain at the fastest rate alone (3), misses that a
   replica cannot both run many sequences and advance many samples' longest responses
   fast: on a rollout-bound split this binds;
2c. *replica time*: an iteration of ``x`` sequences holding ``X`` tokens of context takes
   ``b + a x + k X`` seconds (``k``: ``decode_per_kv_token_s``) and a replica does not
   decode during a weight update, so per second of decoding outside its KV reads a replica
   makes at most ``r_cap = max x / (b + a x)`` tokens (at ``x = max_running``). A response
   of ``R`` tokens to a prompt of ``P`` spends ``k (P R + R^2 / 2)`` seconds reading context
   in all (its context grows by one token per token decoded; an abort and resume does not
   change the sum), so prompt group ``i`` needs at least ``W_i = R_i / r_cap + k sum over
   its responses of (P_i R + R^2 / 2)`` seconds of one replica's decoding, and by time
   ``t`` the replicas decoded at most ``N_s (t - y (k-1)//T) + N_h (t - h -
   train(1..k-1))`` replica-seconds (``N_s``, ``N_h``: the replicas of each pool); the
   same timing as 2, with ``W`` for ``R`` and replica counts for rates. Where context
   reads are a large share of an iteration, this binds. (Prefill is left out: it may
   run during a weight update, which these pools already do not count.);
3. *sample slots*: at most ``C = min(replicas * concurrent_samples_per_replica, M)`` samples
   are in flight at any time (all replicas, hybrid ones included: the cap drops at a
   deactivation while the samples admitted under the larger one finish), and sample ``i``
   holds its slot at least ``s_i = c_p P_i + L_i / r_1``, so ``C t_k`` is at least the sum of
   the ``k q`` smallest ``s_i`` (again also from every ``O_w``);
4. *stragglers*: prompt ``i`` is admitted no earlier than ``O_{w(i)}`` and, for ``i >=
   C``, no earlier than the completion of ``i - C + 1`` of the prompts before it (at most
   ``C`` samples are in flight and admission is in prompt order, so at most ``C - 1`` of
   them are still running); each of those completes no earlier than its own ``e_j``, so the
   ``(i - C + 1)``-th of their completions is no earlier than the ``(i - C + 1)``-th
   smallest ``e_j``, ``j < i``. So sample ``i`` is complete no earlier than ``e_i = max(O_{w(i)},
   that order statistic) + s_i``, and ``t_k`` is at least the ``k q``-th smallest ``e_i``
   of the first ``A(v(k))`` prompts;

with ``O_0 = 0`` and ``O_w >= t_{Tw} + train(Tw..Tw) + y``. The run ends no earlier than
``max_j t_j + train(j..S) + y * (syncs in steps j..S)``. On a fully serial run (one sample
per version) every step is bound exactly and so is the run. Every term drops work or
waiting that a real schedule has (switching costs after the first wake-up, prefill,
imbalance, the pipeline start), so
``efficiency = bound / achieved <= 1`` for every policy; `tests/test_bound.py` and
``benchmarks/sim_bound_validity.py`` check it on every built-in scenario and hundreds of
random ones.

*Re-planned runs.* With the role planner (`dynsched_sim._planner`) the split changes
while the run goes on, so ``conf``'s own bound is no bound: a run that moves to a better
split can finish before it. Given every split ``sigma`` the run can be in
(`reachable_configurations`: the same GPUs, the trainer at each size the planner's
minimums allow), the bound relaxes each rate on its own, since at any instant the run is
in one split, each training step runs on one split's trainer (moves happen at sync
boundaries, with the trainer idle) and moves only add time:

* tokens (and each weight of the decode constraint, ``D`` in place of ``P``, and the
  replica time, replica counts in place of ``P``): ``P_s = max P_s(sigma)`` and ``P_h =
  max P_h(sigma)`` (so the rate of every pool combination the single-split argument uses
  is at most its relaxed value), and besides,
  from the start and from every ``O_w``, no split produces faster than ``P_all = max
  (P_s + P_h)(sigma)`` (the whole cluster of one split), so ``t_k >= need / P_all``;
* slots: ``C = max C(sigma)`` (the samples in flight never exceed the largest cap held);
* syncs: ``y = min y(sigma)`` (0 when a split has no standalone replica);
* trainer: a step of ``K`` tokens takes at least ``f(K) = min_sigma f_sigma(K)`` (each
  split's step time with its swap); a least of concave functions is concave, so
  ``train(j..k)`` is the same vertex least with this ``f``;
* time-sharing (the rates above are each at their best at once; this couples them): say
  the run spends ``x_sigma`` seconds in split ``sigma``, its trainer busy ``a_sigma <=
  x_sigma`` of them on the steps ``I_sigma`` (``a_sigma >= sum (o_sigma + c_sigma K_i)``
  over them), producing at most ``P_s(sigma) a_sigma + P_all(sigma) (x_sigma -
  a_sigma)`` tokens (hybrid replicas decode only while the trainer does not train). For
  ``0 <= gamma <= 1 / max P_all``, ``B = min_sigma c_sigma (1 - gamma P_s(sigma))`` and
  ``A = min_sigma (1 - gamma P_s(sigma)) (o_sigma + c_sigma K_min)`` (``A >= B K_min``),
  every step of ``K_i >= K_min`` tokens in ``sigma`` has ``(A - B K_min) + B K_i <= (1 -
  gamma P_s(sigma)) (o_sigma + c_sigma K_i)``, so ``x_sigma >= (A - B K_min) |I_sigma| + B
  sum K_i + gamma (tokens made in sigma)``; summed over the splits, the run takes at least
  ``S (A - B K_min) + B K + gamma R`` with ``K = SK(v(S), S q)`` and ``R = SR(v(S), S
  q)`` (weak duality of the linear program over the time spent in each split, which this
  solves exactly: the value is concave and piecewise linear in ``gamma``, largest where
  two splits' lines cross or at an end); the same holds with every weight of the decode
  constraint, ``D`` and ``lam SL + (1 - lam) SR`` in place of ``P`` and ``R``, and with the
  replica counts and ``SW`` (the sum of the ``S q`` smallest ``W``). The run ends no
  earlier than its largest value.

The minimum over splits of the single-split bounds would not do: a run can train on a large
trainer and generate on a large pool at different times, beating every single split. With
one split (no planner) every relaxed value is the split's own and the bound is unchanged.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Sequence

import attrs
import numpy as np
from dynsched_core import DynamicScheduleConfig

from dynsched_sim._models import EngineModel
from dynsched_sim._scenario import Configuration, Scenario
from dynsched_sim._workload import Workload

__all__ = [
    "DECODE_WEIGHTS",
    "LowerBound",
    "admissible_prompts",
    "decode_rates",
    "lower_bound",
    "pool_throughput",
]


@attrs.frozen
class LowerBound:
    """The bound and what set it.

    Attributes:
        seconds: The lower bound on the run's wall-clock.
        binding: Which constraint set the start of the step the final bound chains from:
            ``"tokens"``, ``"decode"``, ``"work"``, ``"slots"``, ``"stragglers"`` or
            ``"trainer"`` (serial training from step 1); ``"fluid"`` when the time-sharing
            bound of a re-planned run is the larger.
        standalone_tokens_per_s: ``P_s``.
        hybrid_tokens_per_s: ``P_h``.
        step_starts_s: Lower bounds on the start of each step's training.
        trainer_gpus: Trainer sizes of the splits the bound relaxes over (one for a run
            whose split never changes).
    """

    seconds: float
    binding: str
    standalone_tokens_per_s: float
    hybrid_tokens_per_s: float
    step_starts_s: tuple[float, ...] = attrs.field(repr=False, eq=False)
    trainer_gpus: tuple[int, ...] = ()


def _admitted(v: int, rule: str, t: int, q: int, m: int) -> int:
    """``A(v)``: prompts admissible up to the end of staleness window ``v``."""
    if rule == "in_flight":
        return (v + 1) * m
    return t * q * v + m


def admissible_prompts(
    scenario: Scenario, conf: Configuration, config: DynamicScheduleConfig | None = None
) -> int:
    """Prompts the rollouter can ever admit in ``scenario.steps`` micro-steps (including the
    window the last weight sync opens).

    ``config``: the run's schedule config, when already built (default: built here).
    """
    cfg = config if config is not None else scenario.schedule_config(conf)
    versions = math.ceil(scenario.steps / cfg.trigger_parameter_sync_step)
    return _admitted(
        versions,
        cfg.staleness_rule,
        cfg.trigger_parameter_sync_step,
        cfg.required_samples,
        cfg.max_required_samples,
    )


def pool_throughput(engine: EngineModel, caps: Sequence[int], sequences: int) -> float:
    """``max sum_j f(x_j)`` over integers ``0 <= x_j <= caps[j]``, ``sum x_j <= sequences``
    (tokens/s).

    ``f(x) = x / (base + per_seq x)`` is concave and the same for every replica, so the
    optimum keeps the running counts as equal as the caps allow: replicas whose cap is below
    the common level run full, the others run ``floor`` or ``floor + 1`` sequences.
    """

    def f(x: int) -> float:
        return x * engine.per_seq_rate(x) if x > 0 else 0.0

    left, total = max(0, int(sequences)), 0.0
    ordered = sorted(int(c) for c in caps if c > 0)
    for i, cap in enumerate(ordered):
        k = len(ordered) - i
        level = left // k
        if cap <= level:
            total += f(cap)
            left -= cap
            continue
        extra = left - level * k  # these replicas take one more (their caps allow it)
        return total + extra * f(level + 1) + (k - extra) * f(level)
    return total


#: The weights ``lam`` of the decode constraint (module docstring, 2b): ``lam`` weighs a
#: sample's longest response against all its tokens (0: the tokens alone, constraint 2).
#: Every weight gives a valid bound and the largest counts, so a finer grid only tightens
#: it: 32 steps of 1/32 (the 8 steps of 1/8 before left up to 3.7 % of a decode-bound
#: static run's bound unused, 16 steps still 2.5 % of heavy-tailed's; 64 or 128 steps add
#: at most 0.1 % more on the built-ins, each weight costing one more dual search)
DECODE_WEIGHTS = tuple(float(x) for x in np.linspace(1.0 / 32.0, 1.0, 32))
#: The search of `decode_rates`: a grid of ``_GRID`` x ``_GRID`` prices, zoomed in
#: ``_ZOOMS`` times around its least (any point of the dual is a valid bound; a finer
#: search only tightens it)
_GRID = 33
_ZOOMS = 7


def _most_per_price(b: float, a: float, cap: int, price: np.ndarray) -> np.ndarray:
    """``max over 0 <= x <= cap`` (real ``x``) of ``x / (b + a x) - price x``, per price:
    the most one replica running ``x`` sequences decodes (``b + a x`` seconds an
    iteration), less ``price`` per sequence."""
    if a > 0:
        with np.errstate(divide="ignore", over="ignore"):
            x = (np.sqrt(b / np.maximum(price, 1e-300)) - b) / a
        x = np.clip(np.where(price > 0, x, float(cap)), 0.0, float(cap))
    else:
        x = np.where(price < 1.0 / b, float(cap), 0.0)
    out: np.ndarray = x / (b + a * x) - price * x
    return out


def decode_rates(
    engine: EngineModel,
    pools: Sequence[tuple[int, int]],
    samples: int,
    n: int,
    weights: Sequence[float] = DECODE_WEIGHTS,
) -> np.ndarray:
    """Per weight ``lam``, an upper bound on ``lam * chains + (1 - lam) * tokens`` per
    second of the replicas ``pools`` (``(count, max_running)`` per kind of replica):
    *tokens* counts every decoded token, *chains* the decode iterations of each sample's
    longest response (module docstring, 2b), with at most ``samples`` samples and ``n *
    samples`` sequences in flight.

    A replica running ``x`` sequences, ``c <= x`` of them some in-flight sample's longest
    response, makes ``x`` tokens and ``c`` chain steps per iteration of ``b + a x``
    seconds (``b``, ``a``: ``decode_base_s``, ``decode_per_seq_s``; context and prefill only
    slow it). The value is the Lagrangian dual of that maximum over the replicas (``mu``
    prices a sample, ``nu`` a sequence): ``min over mu, nu >= 0`` of ``mu samples + nu n
    samples + sum over replicas of max(phi(mu + nu), (1 - lam) phi(nu / (1 - lam)))``
    with ``phi(p) = max over 0 <= x <= cap of x / (b + a x) - p x``; any ``mu, nu`` bound
    it from above (weak duality), and a grid search zoomed in around its least finds the
    least (the dual is convex).
    """
    live = tuple((int(cnt), int(cap)) for cnt, cap in pools if cnt > 0 and cap > 0)
    key = (engine.decode_base_s, engine.decode_per_seq_s, live, int(samples), int(n))
    return _decode_rates(*key, tuple(float(x) for x in weights)).copy()


@functools.lru_cache(maxsize=4096)
def _decode_rates(
    b: float,
    a: float,
    live: tuple[tuple[int, int], ...],
    samples: int,
    n: int,
    weights: tuple[float, ...],
) -> np.ndarray:
    """`decode_rates` of the replicas ``live`` (cached: a plan asks for the same pools
    over and over)."""
    lam = np.asarray(weights, dtype=np.float64)
    if not live or samples <= 0:
        return np.zeros(len(lam))
    tok = 1.0 - lam
    safe_tok = np.where(tok > 0, tok, 1.0)

    def dual(mu: np.ndarray, nu: np.ndarray) -> np.ndarray:
        """The dual at ``mu``, ``nu`` (weights along the first axis)."""
        shape = (-1,) + (1,) * (mu.ndim - 1)
        t, st = tok.reshape(shape), safe_tok.reshape(shape)
        total = mu * samples + nu * n * samples
        for cnt, cap in live:
            chain = _most_per_price(b, a, cap, mu + nu)
            alone = np.where(t > 0, t * _most_per_price(b, a, cap, nu / st), 0.0)
            total = total + cnt * np.maximum(chain, alone)
        out: np.ndarray = total
        return out

    # zoom in on the least of a grid of (mu, nu) per weight; a convex function's least
    # lies next to its grid least, and every point evaluated bounds from above anyway
    k = len(lam)
    grid = np.linspace(0.0, 1.0, _GRID)
    lo_mu, lo_nu = np.zeros(k), np.zeros(k)
    width = np.full(k, 1.0 / b)  # phi(p) = 0 for every p >= 1 / b: nothing lies beyond
    width_nu = width.copy()
    best = dual(np.zeros(k), np.zeros(k))
    rows = np.arange(k)
    for _ in range(_ZOOMS):
        mu = lo_mu[:, None] + width[:, None] * grid[None, :]
        nu = lo_nu[:, None] + width_nu[:, None] * grid[None, :]
        vals = dual(mu[:, :, None], nu[:, None, :]).reshape(k, -1)
        at = np.argmin(vals, axis=1)
        best = np.minimum(best, vals[rows, at])
        i, j = np.divmod(at, _GRID)
        step_mu, step_nu = width / (_GRID - 1), width_nu / (_GRID - 1)
        lo_mu = np.maximum(mu[rows, i] - step_mu, 0.0)
        lo_nu = np.maximum(nu[rows, j] - step_nu, 0.0)
        width, width_nu = 2.0 * step_mu, 2.0 * step_nu
    out: np.ndarray = best
    return out


def _earliest_rows(
    need: np.ndarray, first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
) -> np.ndarray:
    """Elementwise, the smallest ``t`` with ``r_a max(0, t - s_a) + r_b max(0, t - s_b) >=
    need`` (0 where ``need <= 0``, inf where no rate is positive) for the two terms
    ``first = (r_a, s_a)`` and ``second = (r_b, s_b)``: arrays of rates and start times
    that broadcast against ``need``."""
    (ra, sa), (rb, sb) = first, second
    swap = sa > sb
    r1, s1 = np.where(swap, rb, ra), np.where(swap, sb, sa)
    r2, s2 = np.where(swap, ra, rb), np.where(swap, sa, sb)
    with np.errstate(divide="ignore", invalid="ignore"):
        alone = np.where(r1 > 0, s1 + need / np.where(r1 > 0, r1, 1.0), math.inf)
        both = r1 + r2
        after = np.where(
            both > 0, s2 + (need - r1 * (s2 - s1)) / np.where(both > 0, both, 1.0), math.inf
        )
    out = np.where(alone <= s2, alone, after)
    return np.where(need <= 0, 0.0, out)


class _KthSmallest:
    """The ``r``-th smallest of the values added so far, for ``r`` that never decreases from
    one call to the next (two heaps: the ``r`` smallest, and the rest)."""

    def __init__(self) -> None:
        self._low: list[float] = []  # the smallest values, negated (a max-heap)
        self._high: list[float] = []  # the rest (a min-heap)

    def add(self, x: float) -> None:
        """Add ``x``."""
        if self._low and x < -self._low[0]:
            heapq.heappush(self._high, -heapq.heappushpop(self._low, -x))
        else:
            heapq.heappush(self._high, x)

    def kth(self, r: int) -> float:
        """The ``r``-th smallest value added (``r >= 1``, at least the last call's, at most
        the count added)."""
        while len(self._low) < r:
            heapq.heappush(self._low, -heapq.heappop(self._high))
        return -self._low[0]


class _Sorted:
    """Prefix sums of the sorted values of ``x`` over index ranges ``[lo, hi)`` (cached)."""

    def __init__(self, x: np.ndarray) -> None:
        self._x = x
        self._cache: dict[tuple[int, int], np.ndarray] = {}

    def largest(self, lo: int, hi: int, count: int) -> float:
        """Sum of the ``count`` largest values in ``x[lo:hi]``."""
        count = min(count, hi - lo)
        return self.smallest(lo, hi, hi - lo) - self.smallest(lo, hi, hi - lo - count)

    def smallest(self, lo: int, hi: int, count: int) -> float:
        """Sum of the ``count`` smallest values in ``x[lo:hi]`` (inf if too few)."""
        if count <= 0:
            return 0.0
        if hi - lo < count:
            return math.inf
        key = (lo, hi)
        prefix = self._cache.get(key)
        if prefix is None:
            prefix = np.concatenate(([0.0], np.cumsum(np.sort(self._x[lo:hi]))))
            self._cache[key] = prefix
        return float(prefix[count])


class _Relaxation:
    """The relaxed run of one configuration on one workload (module docstring notation).

    Built from the scenario, the run's schedule config and the workload; `step_start`
    bounds the steps in order (each reads the earlier ones' bounds and the windows they
    open), then `run_end` bounds the run.
    """

    def __init__(
        self,
        scenario: Scenario,
        splits: Sequence[Configuration],
        workload: Workload,
        cfg: DynamicScheduleConfig,
    ) -> None:
        self.steps, self.q = scenario.steps, cfg.required_samples
        self.t_sync = cfg.trigger_parameter_sync_step
        # every step trains q samples, each of at least the workload's fewest tokens
        self.k_min = self.q * float(workload.group_tokens().min())
        self._rates(scenario, splits[0], cfg)
        self.trainers: list[tuple[float, float]] = []  # (per step, per token) of each split
        self.pools: list[tuple[float, float]] = []  # (P_s, P_s + P_h) of each split
        self.p_all: float | None = None  # the best pool of one split (several splits only)
        self.n_all: float | None = None  # the most replicas of one split (several only)
        self.n_pools: list[tuple[float, float]] = []  # (N_s, N_s + N_h) of each split
        self.d_pools: list[tuple[np.ndarray, np.ndarray]] = []  # decode rates of each split
        self.d_p_all: np.ndarray | None = None
        if len(splits) > 1:
            self._relax(scenario, splits, cfg)
        # each split's trainer: (GPUs, state swap per step), for `step_time`
        self.tr = scenario.trainer
        self.train_splits = [
            (
                c.trainer_gpus,
                self.tr.state_swap_s(scenario.hardware, scenario.model, c.trainer_gpus),
            )
            for c in splits
        ]
        self._k_max: dict[int, float] = {}  # the q largest K among the first A(v), per v
        self._f_ends: dict[float, float] = {}  # f at the ends of the token box (K_min, K_max)
        self._prompts(workload, cfg, scenario.engine)
        self._columns()
        self.starts: list[float] = []  # t_k
        self.why: list[str] = []  # what set t_k
        self.opens = [0.0]  # O_w

    def _rates(self, scenario: Scenario, conf: Configuration, cfg: DynamicScheduleConfig) -> None:
        """Pool throughputs ``P_s``, ``P_h``, sync ``y``, first wake-up ``h``, ``r_1`` and the
        sample slots ``C``."""
        eng, hw, llm = scenario.engine, scenario.hardware, scenario.model
        g = eng.gpus_per_replica
        n_s = conf.rollout_gpus // g
        n_h = conf.trainer_gpus // g if conf.hybrid else 0
        # samples in flight: at most `slots` at any time (the cap never drops in a static
        # split; with hybrid replicas it drops at each deactivation while the samples
        # admitted under the larger cap finish, so only the largest cap is safe)
        self.slots = min((n_s + n_h) * cfg.concurrent_samples_per_replica, cfg.max_required_samples)
        n = scenario.workload.n
        seqs = n * self.slots  # a sample in flight runs at most n sequences
        cap_s, cap_h = eng.max_running("standalone", hw, llm), eng.max_running("hybrid", hw, llm)
        caps_s, caps_h = [cap_s] * n_s, [cap_h] * n_h
        self.p_s = pool_throughput(eng, caps_s, seqs)
        # the hybrid replicas' share: what all add to the standalone pool, or what they
        # make alone (while a sync pauses the standalone ones), whichever is larger
        self.p_h = max(
            pool_throughput(eng, caps_s + caps_h, seqs) - self.p_s,
            pool_throughput(eng, caps_h, seqs),
        )
        pools_s, pools_h = [(n_s, cap_s)], [(n_h, cap_h)]
        self.d_s = decode_rates(eng, pools_s, self.slots, n)
        d_all = decode_rates(eng, pools_s + pools_h, self.slots, n)
        self.d_h = np.maximum(d_all - self.d_s, decode_rates(eng, pools_h, self.slots, n))
        self.d_all = d_all
        self.n_s, self.n_h = float(n_s), float(n_h)
        self.r_cap = max(eng.peak_throughput(role, hw, llm) for role in ("standalone", "hybrid"))
        self.y = eng.broadcast_sync_s(hw, llm) if n_s else 0.0
        self.wake = eng.wake_s(hw, llm) + eng.local_sync_s(hw, llm)
        self.r1 = eng.per_seq_rate(1)

    def _relax(
        self, scenario: Scenario, splits: Sequence[Configuration], cfg: DynamicScheduleConfig
    ) -> None:
        """Several splits (a re-planned run): every rate at its best over the splits, each
        on its own (module docstring, *Re-planned runs*)."""
        tr = scenario.trainer
        p_s, p_h, p_all, y, slots = [], [], [], [], []
        n_s, n_h, n_all, r_cap = [], [], [], []
        d_s, d_h, d_all = [], [], []
        for conf in splits:
            self._rates(scenario, conf, cfg)
            p_s.append(self.p_s)
            p_h.append(self.p_h)
            p_all.append(self.p_s + self.p_h)
            y.append(self.y)
            n_s.append(self.n_s)
            n_h.append(self.n_h)
            n_all.append(self.n_s + self.n_h)
            r_cap.append(self.r_cap)
            slots.append(self.slots)
            d_s.append(self.d_s)
            d_h.append(self.d_h)
            d_all.append(np.maximum(self.d_all, self.d_h))
            # the split's trainer as a line never above its step time (time-sharing only)
            fixed, per_token = tr.linear_lower(conf.trainer_gpus, self.k_min)
            swap = tr.state_swap_s(scenario.hardware, scenario.model, conf.trainer_gpus)
            self.trainers.append((fixed + swap, per_token))
            self.pools.append((self.p_s, self.p_s + self.p_h))
            self.n_pools.append((self.n_s, self.n_s + self.n_h))
            self.d_pools.append((self.d_s, d_all[-1]))
        self.p_s, self.p_h, self.p_all = max(p_s), max(p_h), max(p_all)
        self.n_s, self.n_h, self.n_all = max(n_s), max(n_h), max(n_all)
        self.r_cap = max(r_cap)
        self.d_s, self.d_h = np.max(d_s, axis=0), np.max(d_h, axis=0)
        self.d_p_all = np.max(d_all, axis=0)
        self.y, self.slots = min(y), max(slots)

    def _prompts(self, workload: Workload, cfg: DynamicScheduleConfig, eng: EngineModel) -> None:
        """``A(v)`` per window and the per-prompt ``R``, ``K``, ``L``, ``W`` and ``s`` sums over
        the first ``A(v)`` prompts."""
        last_v = (self.steps - 1) // self.t_sync
        rule, m_req = cfg.staleness_rule, cfg.max_required_samples
        a = [
            min(_admitted(v, rule, self.t_sync, self.q, m_req), len(workload))
            for v in range(last_v + 1)
        ]
        if self.steps * self.q > a[last_v]:
            raise ValueError(
                f"workload has {a[last_v]} admissible prompts, fewer than the "
                f"{self.steps * self.q} consumed"
            )
        self.a, top = a, a[last_v]
        resp = workload.response_lens[:top].astype(np.float64)
        l_max = resp.max(axis=1)
        k_tok = workload.group_tokens()[:top].astype(np.float64)
        p_len = workload.prompt_lens[:top].astype(np.float64)
        # straggler time after admission
        self.solo = p_len * eng.prefill_s_per_token + l_max / self.r1
        # replica-seconds of each prompt group (2c): its tokens at the best per-replica rate
        # and the KV reads of its responses
        kv = eng.decode_per_kv_token_s * (p_len[:, None] * resp + 0.5 * resp * resp).sum(axis=1)
        self.sw = _Sorted(resp.sum(axis=1) / self.r_cap + kv)
        self.sr, self.sk = _Sorted(resp.sum(axis=1)), _Sorted(k_tok)
        self.sl = _Sorted(l_max)
        self.lam = np.asarray(DECODE_WEIGHTS)
        self.ss = _Sorted(self.solo)
        self.done_e = np.full(top, math.inf)  # e_i, known once prompt i's window opened
        self._done_order = _KthSmallest()  # the e_i set so far (constraint 4's release)
        self._release(0, a[0], 0.0)

    def _release(self, lo: int, hi: int, o_w: float) -> None:
        """Constraint 4's ``e_i`` for the prompts ``lo..hi-1`` of the window opening at
        ``o_w``: prompt ``i`` is admitted no earlier than ``o_w`` nor, for ``i >= C``, than
        the ``(i - C + 1)``-th smallest ``e_j`` of the prompts before it."""
        order, solo = self._done_order, self.solo
        if self.slots <= 0:  # no replica: no prompt is ever admitted (`step_start` says so)
            return
        for i in range(lo, hi):
            start = o_w if i < self.slots else max(o_w, order.kth(i - self.slots + 1))
            self.done_e[i] = start + float(solo[i])
            order.add(float(self.done_e[i]))

    def train_lb(self, j: int, k: int) -> float:
        """Training time of steps ``j..k`` (inclusive): they train ``(k - j + 1) q``
        distinct samples of the first ``A(v(k))``, and all of steps ``1..k`` train ``k q``
        of them while steps ``1..j-1`` train at most the ``(j - 1) q`` largest of the first
        ``A(v(j - 1))``; each step trains ``q`` of the first ``A(v(k))``, so at most
        their ``q`` largest (`_train_vertex`)."""
        if k < j:
            return 0.0
        q, a = self.q, self.a
        vk = (k - 1) // self.t_sync
        tokens = self.sk.smallest(0, a[vk], (k - j + 1) * q)
        if j > 1:
            rest = self.sk.largest(0, a[(j - 2) // self.t_sync], (j - 1) * q)
            tokens = max(tokens, self.sk.smallest(0, a[vk], k * q) - rest)
        k_max = self._k_max.get(vk)
        if k_max is None:
            k_max = self._k_max[vk] = self.sk.largest(0, a[vk], q)
        return self._train_vertex(k - j + 1, tokens, k_max)

    def step_time(self, tokens: float) -> float:
        """``f(K)``: the least time of one step over ``K`` tokens on any of the splits'
        trainers (`TrainerModel.step_time_s` plus the state swap; concave in ``K``)."""
        return min(self.tr.step_time_s(g, tokens, swap) for g, swap in self.train_splits)

    def _train_vertex(self, m: int, tokens: float, k_max: float) -> float:
        """Least training time of ``m`` steps over ``tokens`` tokens in all, each step over
        ``K_min <= K_i <= k_max`` tokens: ``f`` (`step_time`) is concave, so the sum of
        ``f(K_i)`` at a fixed total is least at a vertex of that box cut by the total, where
        every step but one has ``K_min`` or ``k_max`` tokens; the total fixes how many have
        ``k_max``."""
        k0 = self.k_min
        if not math.isfinite(tokens):
            return math.inf  # too few prompts for the steps (the caller's check)
        if k_max <= k0:
            return m * self._f_end(k0)
        tokens = max(tokens, m * k0)
        top = min(m - 1, int((tokens - m * k0) // (k_max - k0)))
        rest = tokens - top * k_max - (m - 1 - top) * k0
        return (m - 1 - top) * self._f_end(k0) + top * self._f_end(k_max) + self.step_time(rest)

    def _f_end(self, tokens: float) -> float:
        """`step_time` at an end of the token box (``K_min`` or a ``K_max(v)``: a few values,
        read on every `train_lb` call, so kept)."""
        f = self._f_ends.get(tokens)
        if f is None:
            f = self._f_ends[tokens] = self.step_time(tokens)
        return f

    def syncs(self, j: int, k: int) -> int:
        """Sync steps among ``j..k`` (inclusive)."""
        return 0 if k < j else k // self.t_sync - (j - 1) // self.t_sync

    def _open_windows(self, v: int) -> None:
        """Open windows up to ``v``: window ``w`` opens after step ``T w`` trains and syncs."""
        t = self.t_sync
        while len(self.opens) <= v:
            w = len(self.opens)
            o_w = self.starts[t * w - 1] + self.train_lb(t * w, t * w) + self.y
            self.opens.append(o_w)
            self._release(self.a[w - 1], self.a[w], o_w)

    def _trainer_start(self, k: int) -> float:
        """Constraint 1: serial training from every earlier step."""
        best = 0.0
        for j in range(1, k):
            chained = self.starts[j - 1] + self.train_lb(j, k - 1) + self.y * self.syncs(j, k - 1)
            best = max(best, chained)
        return best

    def _columns(self) -> None:
        """The rates of constraints 2, 2c and 2b side by side, one column each: the tokens
        (``P``), the replica-seconds (replica counts) and each weight of the decode
        constraint (``D``); per pool: standalone, hybrid and, for a re-planned run, the
        best whole cluster of one split."""
        self.col_s = np.concatenate([[self.p_s, self.n_s], self.d_s])
        self.col_h = np.concatenate([[self.p_h, self.n_h], self.d_h])
        self.col_all: np.ndarray | None = None
        if self.p_all is not None and self.n_all is not None and self.d_p_all is not None:
            self.col_all = np.concatenate([[self.p_all, self.n_all], self.d_p_all])

    def _needs(self, lo: int, hi: int, count: int) -> np.ndarray:
        """Per column (`_columns`), a lower bound on what any ``count`` of the prompts
        ``lo..hi-1`` need: their tokens ``R``, their replica-seconds, and per weight
        ``lam`` of the decode constraint ``lam * L + (1 - lam) * R`` (the sum of the
        ``count`` smallest of each, weighed: neither is more than over any one set of
        ``count`` prompts)."""
        sl, sr = self.sl.smallest(lo, hi, count), self.sr.smallest(lo, hi, count)
        weighted = self.lam * sl + (1.0 - self.lam) * sr
        return np.concatenate([[sr, self.sw.smallest(lo, hi, count)], weighted])

    def _pools_start(self, k: int, v: int) -> np.ndarray:
        """Constraints 2, 2c and 2b: per column (`_columns`), when the pools can have made
        what the ``k q`` samples need, from the start and from every window opening (the
        latest over them): the standalone pool from the start but for the syncs, the
        hybrid one after its first wake-up and while the trainer does not train."""
        a, q, y, t_sync = self.a, self.q, self.y, self.t_sync
        needs = [self._needs(0, a[v], k * q)]
        s_from = [y * ((k - 1) // t_sync)]
        h_from = [self.wake + self.train_lb(1, k - 1)]
        opens = [0.0]
        for w in range(1, v + 1):  # samples that must come from windows >= w
            late = k * q - a[w - 1]
            if late <= 0:
                continue
            o_w = self.opens[w]
            needs.append(self._needs(a[w - 1], a[v], late))
            s_from.append(o_w + y * (v - w))
            h_from.append(o_w + self.train_lb(t_sync * w + 1, k - 1))  # trained in [O_w, t_k)
            opens.append(o_w)
        need = np.vstack(needs)
        t = _earliest_rows(
            need,
            (self.col_s[None, :], np.asarray(s_from)[:, None]),
            (self.col_h[None, :], np.asarray(h_from)[:, None]),
        )
        if self.col_all is not None:  # re-planned: no split makes more than one split's all
            with np.errstate(divide="ignore", invalid="ignore"):
                fluid = np.asarray(opens)[:, None] + need / self.col_all[None, :]
            t = np.maximum(t, np.where(need > 0, fluid, 0.0))
        out: np.ndarray = np.max(t, axis=0)
        return out

    def _slots_start(self, k: int, v: int) -> float:
        """Constraint 3: the sample slots, from the start and from every window opening."""
        a, q = self.a, self.q
        if self.slots <= 0:
            return math.inf  # no replica: no sample is ever in flight
        t_slot = self.ss.smallest(0, a[v], k * q) / self.slots
        for w in range(1, v + 1):
            late = k * q - a[w - 1]
            if late > 0:
                t_slot = max(
                    t_slot, self.opens[w] + self.ss.smallest(a[w - 1], a[v], late) / self.slots
                )
        return t_slot

    def step_start(self, k: int) -> None:
        """Bound the start of step ``k``'s training (steps ``1..k-1`` already bounded)."""
        v = (k - 1) // self.t_sync
        self._open_windows(v)
        kq = k * self.q
        pools = self._pools_start(k, v)
        cands = {
            "trainer": self._trainer_start(k),
            "tokens": float(pools[0]),
            "decode": float(np.max(pools[2:])),
            "work": float(pools[1]),
            "slots": self._slots_start(k, v),
            # constraint 4: the k q-th earliest completion among the admissible prompts
            "stragglers": float(np.partition(self.done_e[: self.a[v]], kq - 1)[kq - 1]),
        }
        best = max(cands, key=lambda x: cands[x])
        if not math.isfinite(cands[best]):
            raise ValueError(f"step {k} can never start: no replica can produce its samples")
        self.starts.append(cands[best])
        self.why.append(best)

    def run_end(self) -> tuple[float, str]:
        """The bound on the run's end and the constraint of the step it chains from
        (``"fluid"``: the time-sharing bound of a re-planned run, `fluid_end`)."""
        end, binding = 0.0, "trainer"
        steps = self.steps
        for j in range(1, steps + 1):
            t = self.starts[j - 1] + self.train_lb(j, steps) + self.y * self.syncs(j, steps)
            if t > end:
                end, binding = t, self.why[j - 1] if self.starts[j - 1] > 0 else "trainer"
        if self.trainers:
            fluid = self.fluid_end()
            if fluid > end:
                end, binding = fluid, "fluid"
        return end, binding

    def fluid_end(self) -> float:
        """The time-sharing bound of a re-planned run (module docstring, *Re-planned
        runs*), for the tokens, the replica-seconds and every weight of the decode
        constraint: the largest of `_fluid` over them."""
        q, top = self.q, self.a[-1]
        count = self.steps * q
        need_k = self.sk.smallest(0, top, count)
        needs = self._needs(0, top, count)
        if not (math.isfinite(need_k) and math.isfinite(float(needs[0]))):
            return 0.0
        best = self._fluid(self.pools, need_k, float(needs[0]))
        best = max(best, self._fluid(self.n_pools, need_k, float(needs[1])))
        for i, need_w in enumerate(needs[2:].tolist()):
            pools = [(float(d_s[i]), float(d_all[i])) for d_s, d_all in self.d_pools]
            best = max(best, self._fluid(pools, need_k, need_w))
        return best

    def _fluid(self, pools: Sequence[tuple[float, float]], need_k: float, need_r: float) -> float:
        """``max over gamma of S (A - B K_min) + B K + gamma R`` with ``A(gamma) = min (1
        - gamma P_s)(o + c K_min)`` and ``B(gamma) = min c (1 - gamma P_s)`` over the
        splits, ``0 <= gamma <= 1 / max P_all`` (``pools``: ``(P_s, P_all)`` of each
        split; ``need_r``: the work ``R`` they make at those rates); concave and piecewise
        linear in ``gamma``, so its largest value is at an end or where two splits' lines
        cross."""
        p_max = max(p_all for _, p_all in pools)
        if p_max <= 0:
            return 0.0
        k0 = self.k_min
        # lines (intercept, slope in gamma) of A's and B's pieces, one per split
        lines_a = [
            ((o + c * k0), -(o + c * k0) * p_s)
            for (o, c), (p_s, _) in zip(self.trainers, pools, strict=True)
        ]
        lines_b = [(c, -c * p_s) for (_, c), (p_s, _) in zip(self.trainers, pools, strict=True)]
        g_max = 1.0 / p_max
        gammas = {0.0, g_max}
        for lines in (lines_a, lines_b):
            for (u0, u1), (w0, w1) in itertools.combinations(lines, 2):
                if u1 != w1:
                    g = (w0 - u0) / (u1 - w1)
                    if 0.0 < g < g_max:
                        gammas.add(g)

        def value(g: float) -> float:
            a = min(u0 + u1 * g for u0, u1 in lines_a)
            b = min(u0 + u1 * g for u0, u1 in lines_b)
            return self.steps * max(0.0, a - b * k0) + b * need_k + g * need_r

        return max(value(g) for g in gammas)


def lower_bound(
    scenario: Scenario,
    conf: Configuration,
    workload: Workload,
    config: DynamicScheduleConfig | None = None,
    *,
    splits: Sequence[Configuration] = (),
) -> LowerBound:
    """The lower bound of the module docstring for ``conf`` on ``workload``.

    ``splits``: for a run whose split changes while it goes on (the role planner,
    `dynsched_sim._planner.reachable_configurations`), every split it can be in; the
    bound then relaxes over all of them and ``conf`` (module docstring, *Re-planned
    runs*). Empty (default): ``conf``'s bound alone.

    Raises:
        ValueError: the workload has fewer admissible prompts than the run consumes, or
            no replica of the split (or splits) can produce a sample.
    """
    cfg = config if config is not None else scenario.schedule_config(conf)
    every = [conf]
    seen = {(conf.trainer_gpus, conf.rollout_gpus, conf.hybrid)}
    for c in splits:
        if (c.trainer_gpus, c.rollout_gpus, c.hybrid) not in seen:
            seen.add((c.trainer_gpus, c.rollout_gpus, c.hybrid))
            every.append(c)
    run = _Relaxation(scenario, every, workload, cfg)
    for k in range(1, scenario.steps + 1):
        run.step_start(k)
    end, binding = run.run_end()
    return LowerBound(
        end,
        binding,
        run.p_s,
        run.p_h,
        tuple(run.starts),
        tuple(sorted({c.trainer_gpus for c in every})),
    )
