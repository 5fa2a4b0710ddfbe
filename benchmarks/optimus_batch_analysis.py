"""Why batch-size adaptation (goodput) pays under one completion rule and not the other.

Pollux picks each job's batch size with GPUs by *goodput*: throughput times the
statistical efficiency predicted from the gradient noise scale.  That is exact when a job
is done after a fixed amount of *progress* (the Pollux artifact's rule: all epochs, an
epoch being a fixed number of initial-batch-equivalent steps).  Under the ``target``
rule (the job is done at the first epoch whose validation metric reaches the target)
a larger batch can need more epochs than the efficiency model predicts: goodput then
mispredicts the time to completion.

For every model profile under ``shared/data/pollux/traces`` and ``w`` GPUs on the
fewest 4-GPU servers, this script computes from the profiles themselves (no scheduler,
no simulation of other jobs) the time to completion at each profiled global batch size:

    T(w, b) = sum over the epochs the job needs of
              (progress of the epoch) * iter_time(w, b) / efficiency_gain(b_eff, epoch)

(the simulator's own arithmetic, ``GpuJob._train``), for both rules, and reports

* ``best / init``: the time at the best batch relative to the initial (smallest) batch:
  what an oracle batch choice can gain;
* ``goodput pick``: the time at the batch that maximises goodput in the first epoch
  (what Pollux' model would pick, assuming the number of epochs does not change with
  the batch), relative to the initial batch;
* ``adaptive``: the batch re-picked by goodput at every epoch (Pollux re-evaluates as the
  gradient noise grows), relative to the initial batch.

Run: ``hatch run test:python benchmarks/optimus_batch_analysis.py [--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from dynsched_optimus.cluster import load_profiles

GPUS_PER_NODE = 4  # the Pollux testbed's servers (ClusterSpec.pollux)
WIDTHS = (1, 2, 4, 8, 16)


def _shape(w: int) -> tuple[int, ...]:
    full, rem = divmod(w, GPUS_PER_NODE)
    return tuple([GPUS_PER_NODE] * full + ([rem] if rem else []))


def time_to_complete(profile, w: int, b: int, rule: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds to completion on ``w`` GPUs at global batch ``b`` (simulator arithmetic)."""
    shape = _shape(w)
    eff_b = profile.step_config(w, b)[2]
    it = profile.iter_time(shape, b)
    n_ep = profile.completion_epochs(b, rule)
    total, prev = 0.0, 0.0
    for e in range(n_ep):
        end = float(profile.epoch_progress[e])
        total += (end - prev) * it / profile.efficiency_gain(eff_b, e)
        prev = end
    return total


def adaptive_time(profile, w: int, batches: list[int], rule: str) -> float:  # type: ignore[no-untyped-def]
    """Seconds to completion when the batch is re-picked by goodput at every epoch.

    Pollux' rule: each epoch trains at the batch with the largest goodput for that
    epoch's gradient statistics.  The job is done, as in the simulator, once its epochs
    reach ``completion_epochs`` of the batch it trains with.
    """
    shape = _shape(w)
    total, prev, e = 0.0, 0.0, 0
    while e < profile.max_epochs:
        b = max(
            batches,
            key=lambda x: (
                profile.efficiency_gain(profile.step_config(w, x)[2], e)
                / profile.iter_time(shape, x)
            ),
        )
        end = float(profile.epoch_progress[e])
        eff_b = profile.step_config(w, b)[2]
        total += (end - prev) * profile.iter_time(shape, b) / profile.efficiency_gain(eff_b, e)
        prev = end
        e += 1
        if e >= profile.completion_epochs(b, rule):
            break
    return total


def goodput_pick(profile, w: int, batches: list[int]) -> int:  # type: ignore[no-untyped-def]
    """Batch with the largest goodput (efficiency / iteration time) in the first epoch."""
    shape = _shape(w)
    return max(
        batches,
        key=lambda b: (
            profile.efficiency_gain(profile.step_config(w, b)[2], 0) / profile.iter_time(shape, b)
        ),
    )


def analyse() -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for name, prof in sorted(load_profiles().items()):
        for w in WIDTHS:
            batches = [
                int(b)
                for b in prof.batch_sizes
                if (1 if name == "ncf" else prof.max_replicas(int(b))) >= w
            ]
            if not batches:
                continue
            b0 = batches[0]
            pick = goodput_pick(prof, w, batches)
            row: dict[str, object] = {
                "model": name,
                "gpus": w,
                "init_batch": b0,
                "goodput_batch": pick,
            }
            for rule in ("epochs", "target"):
                times = {b: time_to_complete(prof, w, b, rule) for b in batches}
                best = min(times, key=lambda b: times[b])
                row[f"{rule}_epochs_at_init"] = prof.completion_epochs(b0, rule)
                row[f"{rule}_epochs_at_pick"] = prof.completion_epochs(pick, rule)
                row[f"{rule}_best_batch"] = best
                row[f"{rule}_best_over_init"] = times[best] / times[b0]
                row[f"{rule}_pick_over_init"] = times[pick] / times[b0]
                row[f"{rule}_adaptive_over_init"] = (
                    adaptive_time(prof, w, batches, rule) / times[b0]
                )
            rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default=None, help="write the rows as JSON")
    args = p.parse_args()
    rows = analyse()
    print(
        "| model | GPUs | init batch | goodput pick | epochs rule: best, pick, adaptive / init | "
        "target rule: best, pick, adaptive / init | epochs to target at init / at pick |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['model']} | {r['gpus']} | {r['init_batch']} | {r['goodput_batch']} | "
            f"{r['epochs_best_over_init']:.2f}, {r['epochs_pick_over_init']:.2f}, "
            f"{r['epochs_adaptive_over_init']:.2f} | "
            f"{r['target_best_over_init']:.2f}, {r['target_pick_over_init']:.2f}, "
            f"{r['target_adaptive_over_init']:.2f} | "
            f"{r['target_epochs_at_init']} / {r['target_epochs_at_pick']} |"
        )
    for rule in ("epochs", "target"):
        g = [float(r[f"{rule}_pick_over_init"]) for r in rows]  # type: ignore[arg-type]
        o = [float(r[f"{rule}_best_over_init"]) for r in rows]  # type: ignore[arg-type]
        gm = math.exp(sum(map(math.log, g)) / len(g))
        om = math.exp(sum(map(math.log, o)) / len(o))
        a = [float(r[f"{rule}_adaptive_over_init"]) for r in rows]  # type: ignore[arg-type]
        am = math.exp(sum(map(math.log, a)) / len(a))
        worse = sum(x > 1.0 + 1e-9 for x in g)
        worse_a = sum(x > 1.0 + 1e-9 for x in a)
        print(
            f"{rule} rule, time / time at the initial batch (geometric mean over "
            f"{len(g)} model x GPU rows): goodput pick {gm:.3f} ({worse} rows slower), "
            f"re-picked every epoch {am:.3f} ({worse_a} rows slower), best fixed batch {om:.3f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
