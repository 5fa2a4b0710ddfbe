"""A driver restarts from its checkpoint: policy state, version and counters come back;
the named router actor is reused when alive and rebuilt otherwise."""

from __future__ import annotations

import json
from typing import Any

import pytest
import ray
from dynsched_ray import RayRunner, RayRunOptions, load_checkpoint

from ._policies import ScriptedPolicy
from .test_e2e import CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_cluster")]


def _opts(path: str, **kw: Any) -> RayRunOptions:
    base: dict[str, Any] = {
        "name": "restart",
        "num_steps": 4,
        "trainer_workers": 0,
        "trainer_step_time_s": 0.01,
        "checkpoint_path": path,
        "keep_router": True,
        "call_timeout_s": 30.0,
        "wait_timeout_s": 60.0,
    }
    return RayRunOptions(**{**base, **kw})


async def test_driver_restart_restores_state_and_reuses_or_rebuilds_router(tmp_path: Any) -> None:
    ckpt = str(tmp_path / "driver.json")
    first_policy = ScriptedPolicy()
    first = await RayRunner(CONFIG, _opts(ckpt), policy=first_policy).run()
    assert first.final_version == 2 and not first.resumed and not first.router_reused
    saved = load_checkpoint(ckpt)
    assert saved["param_version"] == 2 and saved["steps_done"] == 4
    assert saved["driver"]["policy"] == {"updates": first_policy.updates} == {"updates": 2}
    assert saved["driver"]["activations"] == first.loop.activations

    # "restart": a new driver object, a fresh policy; the router actor is still alive
    policy = ScriptedPolicy()
    second = await RayRunner(CONFIG, _opts(ckpt, resume=True), policy=policy).run()
    assert second.resumed and second.router_reused
    assert second.first_step == 5
    assert second.final_version == 4  # continued from version 2, not from 0
    assert policy.updates == 4  # restored 2, then two more cycles
    state = load_checkpoint(ckpt)
    assert state["steps_done"] == 8
    # counters continue from the restored ones
    assert second.loop.activations == first.loop.activations + second.switches.count("activate")
    assert state["driver"]["activations"] == second.loop.activations
    ids = state["consumed_sample_ids"]
    assert len(ids) == len(set(ids)) == 8 * CONFIG.required_samples  # nothing trained twice
    assert not set(first.consumed_sample_ids) & set(ids[len(first.consumed_sample_ids) :])

    # the router died with the old driver: it is rebuilt under the same name
    ray.kill(ray.get_actor("restart-router", namespace="dynsched-tests"), no_restart=True)
    third = await RayRunner(
        CONFIG, _opts(ckpt, resume=True, keep_router=False), policy=ScriptedPolicy()
    ).run()
    assert third.resumed and not third.router_reused
    assert third.final_version == 6
    json.loads((tmp_path / "driver.json").read_text())
