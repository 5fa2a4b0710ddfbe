"""`VLLMOptions`: the vLLM replica's settings as one validated frozen record (no vLLM needed)."""

from __future__ import annotations

import attrs
import pytest
from dynsched_core import ConfigError
from dynsched_ray.engines.vllm import VLLMOptions, VLLMReplica
from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [
        ("sleep_level", 3, "VLLMOptions.sleep_level must be one of [1, 2], got 3"),
        ("device", "tpu", "VLLMOptions.device must be one of ['cpu', 'cuda'], got 'tpu'"),
        ("start_timeout_s", 0, "VLLMOptions.start_timeout_s must be a finite number > 0"),
        ("max_num_seqs", 0, "VLLMOptions.max_num_seqs"),
        ("weights_version", -1, "VLLMOptions.weights_version"),
        ("sampling", {"temprature": 0.0}, "sampling keys ['temprature'] unknown"),
        ("dtype", " ", "VLLMOptions.dtype must be a non-empty string"),
    ],
)
def test_a_bad_option_names_the_field(field: str, value: object, needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        VLLMOptions(**{field: value})
    assert needle in str(exc.value) and exc.value.key == field
    with pytest.raises(ValueError, match=field if field != "sampling" else "sampling keys"):
        VLLMReplica("r", model="/nowhere", **{field: value})


@given(st.floats(allow_nan=True, allow_infinity=True))
def test_gpu_memory_utilization_is_a_share(share: float) -> None:
    if 0.0 < share <= 1.0:
        assert VLLMOptions(gpu_memory_utilization=share).gpu_memory_utilization == share
    else:
        with pytest.raises(ConfigError, match="gpu_memory_utilization must be a number in"):
            VLLMOptions(gpu_memory_utilization=share)


def test_replica_keywords_replace_the_options_fields() -> None:
    base = VLLMOptions(seed=5, max_num_seqs=4, sampling={"temperature": 0.5})
    replica = VLLMReplica("r", model="/nowhere", role="hybrid", options=base, seed=7)
    assert replica.options == attrs.evolve(base, seed=7)
    assert (replica.is_asleep, replica.sleep_level, replica.start_timeout_s) == (True, 1, 600.0)
    assert VLLMReplica("s", model="/nowhere").options == VLLMOptions()
    with pytest.raises(TypeError, match=r"unknown VLLMReplica option\(s\) \['sed'\]; allowed:"):
        VLLMReplica("r", model="/nowhere", sed=1)


def test_options_are_frozen_and_copy_their_mappings() -> None:
    sampling = {"temperature": 0.0}
    opts = VLLMOptions(sampling=sampling)
    sampling["top_p"] = 0.5
    assert opts.sampling == {"temperature": 0.0}
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        opts.seed = 1  # type: ignore[misc]
