"""The launcher registry: each entry builds a class that does what dispatch and the preflight ask of
a launcher, and each answers for itself what they used to decide by comparing names (capacity,
who places the probe, what a job needs before the sweep writes anything)."""

import inspect

import pytest

from isoflop_cli import config, launchers
from isoflop_cli.errors import ConfigError


def cluster(**values):
    c = config.load().cluster
    for key, value in values.items():
        if key.startswith("slurm_"):
            c.slurm[key[len("slurm_") :]] = value
        else:
            c[key] = value
    return c


@pytest.mark.parametrize("name", sorted(launchers.LAUNCHERS))
def test_each_entry_is_a_launcher(name):
    built = launchers.of(cluster(launcher=name))
    for method in ("check", "capacity", "open", "keeps_logs", "jobs", "batch", "placement"):
        want = inspect.signature(getattr(launchers.Launcher, method)).parameters
        got = inspect.signature(getattr(built, method)).parameters
        assert list(got) == [p for p in want if p != "self"], (name, method)
    assert isinstance(built.places_probe, bool)


def test_capacity_is_what_the_launcher_can_run_at_once(monkeypatch):
    """A local head or submitit's local executor runs what its CPUs hold; a Ray cluster or SLURM
    queues every job; cluster.max_concurrent overrides both (the dispatcher's)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert launchers.of(cluster(local_cpus=6, cpus_per_run=2)).capacity(10) == 3
    assert launchers.of(cluster(local_cpus=1, cpus_per_run=2)).capacity(10) == 1
    assert launchers.of(cluster(address="http://127.0.0.1:1")).capacity(10) == 10
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:1")
    assert launchers.of(cluster(local_cpus=6, cpus_per_run=2)).capacity(10) == 10
    assert launchers.of(cluster(launcher="slurm", slurm_executor="slurm")).capacity(7) == 7
    assert (
        launchers.of(cluster(launcher="slurm", slurm_executor="local", local_cpus=4, cpus_per_run=1)).capacity(7) == 4
    )


def test_the_runs_run_here_on_a_local_head_and_on_submitit_s_local_executor(monkeypatch):
    """What config checks and planning ask before a launcher is built (no Ray, no submitit)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert launchers.runs_here(cluster()) and not launchers.runs_here(cluster(address="http://127.0.0.1:1"))
    assert launchers.runs_here(cluster(launcher="slurm", slurm_executor="local"))
    assert not launchers.runs_here(cluster(launcher="slurm", slurm_executor="slurm"))
    monkeypatch.setenv("RAY_ADDRESS", "http://127.0.0.1:1")
    assert not launchers.runs_here(cluster())


def test_only_slurm_places_the_probe():
    assert not launchers.of(cluster(launcher="ray")).places_probe
    assert launchers.of(cluster(launcher="slurm")).places_probe


def test_checks_before_anything_is_written(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ConfigError, match=r"cluster\.gpus_per_run > 0 needs a Ray cluster"):
        launchers.of(cluster(gpus_per_run=1)).check()
    with pytest.raises(ConfigError, match=r"cluster.cpus_per_run=4.0 is more than the local head's 2 CPUs"):
        launchers.of(cluster(cpus_per_run=4, local_cpus=2)).check()
    launchers.of(cluster(cpus_per_run=2, local_cpus=2)).check()
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(ConfigError, match="needs SLURM's sbatch on PATH"):
        launchers.of(cluster(launcher="slurm")).check()
    launchers.of(cluster(launcher="slurm", slurm_executor="local")).check()


def test_ray_placement_reads_the_probe_s_nodes():
    from isoflop_cli.preflight import Node

    node = Node(
        host="a",
        cpus=4,
        gpus=0,
        count=1,
        version="0",
        python="3.11",
        reads_cli_file=True,
        wrote=None,
        unreadable={},
        unwritable={},
        vllm=False,
        trackers_missing=[],
    )
    ray = launchers.of(cluster())
    assert ray.placement(None, [node], 4, 0) == []
    assert ray.placement(None, [node], 1, 1)[0].startswith("no node has the 1 CPUs and 1 GPUs a run asks for")


def test_a_finished_sweep_whose_head_is_gone_reruns_without_starting_one(tmp_path, monkeypatch):
    """A run that finished after its local head died has a log no head can give any more: a rerun
    of the finished sweep starts no head for it (it once started one on every rerun). While the
    head that ran it lives, the rerun attaches to it to copy the log."""
    from isoflop_cli import head, sweep
    from isoflop_cli.store import CellState, Manifest, SweepDir

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    sweep_dir = SweepDir(tmp_path)
    sweep_dir.write_manifest(
        Manifest(cells={"a": CellState(state="finished", submission_id="isoflop-a-1-abcdef", M=1)})
    )
    sweep_dir.run("a").dir.mkdir(parents=True)
    sweep_dir.run("a").finish([{"step": 0, "rollouts": 0}], step=1, M=1)  # no job.log: it was never copied
    cfg = config.load()
    started = []
    monkeypatch.setattr(
        head, "ray_cluster", lambda *a: started.append(a) or (_ for _ in ()).throw(AssertionError("a head started"))
    )
    assert sweep.drive(sweep_dir, cfg, sweep.View()) == {"a": "finished"}
    assert not started
    (tmp_path / head.HEAD_FILE).write_text(
        '{"pid": 1, "address": "http://127.0.0.1:1"}'
    )  # a pid that is not this dir's head
    assert not launchers.of(cfg.cluster).keeps_logs(tmp_path)
    assert launchers.of(cluster(address="http://127.0.0.1:1")).keeps_logs(tmp_path)
