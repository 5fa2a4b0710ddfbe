"""Registry discovery through a real entry point of an installed distribution."""

from __future__ import annotations

import json
import subprocess
import sys

from dynsched_core import DynamicScheduleContext, available_policies, build_policy, get_policy_class


def test_example_distribution_is_found_by_name() -> None:
    assert "example_threshold" in available_policies()
    policy = build_policy("example_threshold", threshold=0.25)
    cls = get_policy_class("example_threshold")
    assert type(policy) is cls
    assert cls.__module__ == "dynsched_example_policy"
    ctx = DynamicScheduleContext(
        required_samples=8, trigger_parameter_sync_step=2, total_generated_samples=3
    )
    assert policy.deactivate_wait_samples(ctx) == 4
    assert policy.should_activate_after_step(1, False, ctx) is True


def test_found_in_a_fresh_interpreter_without_importing_it() -> None:
    probe = (
        "import json, sys\n"
        "from dynsched_core import build_policy\n"
        "assert 'dynsched_example_policy' not in sys.modules\n"
        "p = build_policy('example_threshold')\n"
        "print(json.dumps([type(p).__module__, 'dynsched_example_policy' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["dynsched_example_policy", True]


def test_state_dict_round_trip() -> None:
    a = build_policy("example_threshold")
    ctx = DynamicScheduleContext(required_samples=4)
    a.update_after_step(1, ctx)
    b = build_policy("example_threshold")
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict() == {"activations": 1}
