"""Loading the vendored Pollux workloads and profiles."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from dynsched_optimus.cluster import (
    POLLUX_ENV_VAR,
    ModelProfile,
    PolluxDataError,
    find_pollux_data,
    load_profiles,
    load_workload,
)


def test_all_workloads_load(pollux_root: Path) -> None:
    for load in ("1.0", "0.5", "1.5", "2.0"):
        for i in range(1, 9):
            jobs = load_workload(f"workload-{i}", load=load, root=pollux_root)
            assert jobs and all(j.batch_size >= 1 and j.num_replicas >= 1 for j in jobs)
            assert [j.submit_time for j in jobs] == sorted(j.submit_time for j in jobs)
    assert len(load_workload("3", root=pollux_root)) == 160


def test_profiles_load_and_are_sane(profiles: dict[str, ModelProfile]) -> None:
    assert sorted(profiles) == ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
    for p in profiles.values():
        assert p.max_epochs >= 2
        for b in p.batch_sizes:
            n = p.completion_epochs(int(b))
            assert 1 <= n <= p.max_epochs
            assert p.completion_epochs(int(b), "epochs") == p.max_epochs
        # measured placement: exact value from placements.csv
        st, sy = p.throughput((1,), float(p.min_local_bsz))
        assert st > 0 and 0 <= sy <= st
        # more GPUs on one node: faster per iteration for a fixed global batch
        b = int(p.batch_sizes[-1])
        assert p.iter_time((4,), b) < p.iter_time((1,), b)
        # rotation-normalised placements are equal
        assert p.throughput((1, 3), 8.0) == p.throughput((3, 1), 8.0)
        # efficiency gain between 1 and the batch scale
        g = p.efficiency_gain(float(b), 0)
        assert 1.0 - 1e-9 <= g <= b / p.init_batch_size + 1e-9
    cifar = profiles["cifar10"]
    assert cifar.higher_is_better and not profiles["deepspeech2"].higher_is_better


def test_unmeasured_placement_is_interpolated(profiles: dict[str, ModelProfile]) -> None:
    p = profiles["imagenet"]
    st, sy = p.throughput((4, 4, 4, 4, 4, 4, 4, 4, 4), 50.0)  # 9 nodes: not measured
    assert st > 0 and sy >= 0


def _copy_tree(src: Path, dst: Path) -> Path:
    shutil.copytree(src / "traces", dst / "traces")
    shutil.copytree(src / "workloads", dst / "workloads")
    return dst


def test_missing_file_clear_error(pollux_root: Path, tmp_path: Path) -> None:
    root = _copy_tree(pollux_root, tmp_path / "d")
    (root / "traces" / "ncf" / "placements.csv").chmod(0o644)
    (root / "traces" / "ncf" / "placements.csv").unlink()
    with pytest.raises(PolluxDataError, match=r"missing file: .*ncf.*placements\.csv"):
        ModelProfile(root / "traces" / "ncf")
    with pytest.raises(PolluxDataError, match="workload-9"):
        load_workload("workload-9", root=root)


def test_malformed_files_clear_error(pollux_root: Path, tmp_path: Path) -> None:
    root = _copy_tree(pollux_root, tmp_path / "d")
    bad = root / "workloads" / "workload-1.csv"
    bad.chmod(0o644)
    bad.write_text("name,time,application,num_replicas,batch_size\nx,abc,ncf,1,32\n")
    with pytest.raises(PolluxDataError, match=r"workload-1\.csv: row 2, column 'time'"):
        load_workload("workload-1", root=root)
    bad.write_text("name,time,application\nx,1,ncf\n")
    with pytest.raises(PolluxDataError, match="missing column"):
        load_workload("workload-1", root=root)
    bad.write_text("name,time,application,num_replicas,batch_size\nx,1,gpt9,1,32\n")
    with pytest.raises(PolluxDataError, match="unknown application 'gpt9'"):
        load_workload("workload-1", root=root)
    val = root / "traces" / "cifar10" / "validation-128.csv"
    val.chmod(0o644)
    val.write_text("progress,iteration,metric\n1,2,3\n")
    with pytest.raises(PolluxDataError, match="validation-128.csv: missing column"):
        ModelProfile(root / "traces" / "cifar10")
    with pytest.raises(PolluxDataError, match="load="):
        load_workload("workload-1", load="3.0", root=root)


def test_find_data_env_and_errors(
    pollux_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(POLLUX_ENV_VAR, str(pollux_root))
    assert find_pollux_data() == pollux_root
    monkeypatch.setenv(POLLUX_ENV_VAR, str(tmp_path / "nope"))
    with pytest.raises(PolluxDataError, match=POLLUX_ENV_VAR):
        find_pollux_data()
    monkeypatch.delenv(POLLUX_ENV_VAR)
    # the search walks up from the start folder: it fails only where no ancestor of the
    # temporary folder has a shared/data/pollux (a machine may hold one, e.g. in /tmp)
    above = [a / "shared" / "data" / "pollux" for a in tmp_path.parents]
    found = next((a for a in above if a.is_dir()), None)
    if found is None:
        with pytest.raises(PolluxDataError, match="not found"):
            find_pollux_data(tmp_path)
    else:
        assert find_pollux_data(tmp_path) == found
    (tmp_path / "shared" / "data" / "pollux").mkdir(parents=True)
    assert find_pollux_data(tmp_path / "x" / "y") == tmp_path / "shared" / "data" / "pollux"
    assert load_profiles(pollux_root)["ncf"].name == "ncf"
