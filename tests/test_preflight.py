"""The preflight's verdicts on node types as a probe reports them (made-up nodes: every problem it
names, and none for a node that has everything), and the probe for real on a local Ray head."""

import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_isoflop

from isoflop_cli.preflight import Node, Spec, problems, unplaceable

SPEC = Spec(
    version="0.1.0",
    python="3.11",
    sweep_dir="/shared/sweeps/default",
    nonce="abc",
    paths={"model.path": "/models/qwen"},
    vllm=True,
    interpreter="/opt/venv/bin/python",
    trackers=["wandb"],
    writes={"ISOFLOP_CACHE": "", "tracking.dir": "/shared/tracking"},
)


def node(tmp_path: Path, **changes) -> Node:
    (tmp_path / "abc.gpu-1").write_text("abc")
    good = dict(
        host="gpu-1",
        cpus=16,
        gpus=8,
        count=2,
        version="0.1.0",
        python="3.11",
        reads_cli_file=True,
        wrote="abc.gpu-1",
        unreadable={},
        unwritable={},
        vllm=True,
        trackers_missing=[],
    )
    return Node(**{**good, **changes})


def test_a_node_with_everything_has_no_problem(tmp_path):
    assert problems(SPEC, [node(tmp_path)], shared=tmp_path) == []
    # vLLM's pinned version (a build's local tag aside), or one an older isoflop's probe did not read
    for version in ("0.32.0", "0.32.0+cu129", None):
        assert problems(SPEC, [node(tmp_path, vllm_version=version)], shared=tmp_path) == []


def test_the_probe_reads_the_vllm_version_of_the_runs_python(tmp_path):
    """FACTS as cluster.python runs it: a Python whose vLLM is a stand-in package of version 0.31.1."""
    from isoflop_cli.preflight import _check_node

    site = tmp_path / "site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("")
    (site / "vllm-0.31.1.dist-info").mkdir()
    (site / "vllm-0.31.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.31.1\n")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    spec = Spec(
        **{
            **SPEC.__dict__,
            "sweep_dir": str(tmp_path),
            "paths": {},
            "interpreter": str(python),
            "trackers": [],
            "writes": {},
        }
    )
    seen = _check_node(spec, 2.0, 0.0, 1)
    assert seen.vllm and seen.vllm_version == "0.31.1"
    assert "but node" in problems(spec, [seen], shared=tmp_path)[-1]


@pytest.mark.parametrize(
    "changes, needle",
    [
        ({"version": "0.0.9"}, "has isoflop 0.0.9 on Python 3.11, the CLI 0.1.0 on 3.11"),
        ({"python": "3.10"}, "on Python 3.10"),
        ({"reads_cli_file": False}, "does not share the sweep dir /shared/sweeps/default"),
        ({"wrote": "abc.elsewhere"}, "does not share the sweep dir"),  # it wrote, but not where the CLI looks
        (
            {"unreadable": {"model.path": "missing"}},
            "model.path (/models/qwen) is missing on node gpu-1 (16 CPU, 8 GPU, x2)",
        ),
        ({"vllm": False}, "sampler=vllm but vLLM does not import on node gpu-1"),
        (
            {"vllm_version": "0.31.1"},
            "sampler=vllm needs vLLM 0.32.0, the version it is written against, but node gpu-1",
        ),
        ({"trackers_missing": ["wandb"]}, "tracking.backends wandb does not import on node gpu-1"),
        ({"version": "not installed"}, "has isoflop not installed on Python 3.11"),
        (
            {
                "unwritable": {
                    "ISOFLOP_CACHE": "(/home/u/.cache/isoflop) cannot be made: /home/u is not a writable directory"
                }
            },
            "ISOFLOP_CACHE (/home/u/.cache/isoflop) cannot be made: /home/u is not a writable directory on node gpu-1",
        ),
    ],
)
def test_each_problem_is_one_line_naming_the_node_and_the_fix(tmp_path, changes, needle):
    found = problems(SPEC, [node(tmp_path, **changes)], shared=tmp_path)
    assert len(found) == 1 and needle in found[0], found


def test_the_node_check_names_a_directory_the_runs_could_not_write(tmp_path, monkeypatch):
    """The check as it runs on a node, here: ISOFLOP_CACHE as the node's environment names it, and
    tracking.dir, each a directory that is there or can be made."""
    from isoflop_cli.preflight import _check_node

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "file" / "cache"))
    spec = Spec(
        **{
            **SPEC.__dict__,
            "sweep_dir": str(tmp_path),
            "paths": {},
            "interpreter": sys.executable,
            "trackers": [],
            "writes": {"ISOFLOP_CACHE": "", "tracking.dir": str(tmp_path / "file")},
        }
    )
    seen = _check_node(spec, 2.0, 0.0, 1)
    assert seen.unwritable == {
        "ISOFLOP_CACHE": (
            f"({tmp_path / 'file' / 'cache'}) cannot be made: {tmp_path / 'file'} is not a writable directory"
        ),
        "tracking.dir": f"({tmp_path / 'file'}) is not a directory",
    }
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "cache"))
    assert (
        _check_node(
            Spec(**{**spec.__dict__, "writes": {"ISOFLOP_CACHE": "", "tracking.dir": str(tmp_path / "t")}}), 2.0, 0.0, 1
        ).unwritable
        == {}
    )


def test_a_request_no_node_can_satisfy_is_refused(tmp_path):
    nodes = [node(tmp_path), node(tmp_path, host="cpu-1", cpus=64, gpus=0, count=4)]
    assert unplaceable(nodes, cpus=16, gpus=8) == []  # the GPU nodes fit
    (found,) = unplaceable(nodes, cpus=32, gpus=8)
    assert (
        "no node has the 32 CPUs and 8 GPUs a run asks for" in found
        and "2 x (16 CPU, 8 GPU); 4 x (64 CPU, 0 GPU)" in found
    )


class ScriptedJobs:
    """A jobs client (launchers.Jobs) whose probe jobs end as scripted, one (exit code, log) per
    submission, in order; an exit code of None is a job Ray ended itself (its supervisor died)."""

    def __init__(self, *ends):
        self.ends, self.submitted = list(ends), []

    def submit_job(self, *, submission_id, **_):
        self.submitted.append(submission_id)
        return submission_id

    def get_job_status(self, sid):
        return SimpleNamespace(value="SUCCEEDED" if self._end(sid)[0] == 0 else "FAILED")

    def get_job_info(self, sid):
        code, _ = self._end(sid)
        message = (
            "Job supervisor actor died: the actor died unexpectedly"
            if code is None
            else (
                f"Job entrypoint command failed with exit code {code}, last "
                f"available logs (truncated to 20,000 chars):\n{self._end(sid)[1]}"
            )
        )
        return SimpleNamespace(driver_exit_code=code, message=message)

    def get_job_logs(self, sid):
        return f"Running entrypoint for job {sid}: exec python -m isoflop_cli preflight-probe\n" + self._end(sid)[1]

    def _end(self, sid):
        return self.ends[self.submitted.index(sid)]


def probe_with(jobs: ScriptedJobs, tmp_path: Path):
    from isoflop_cli import preflight

    launcher = SimpleNamespace(places_probe=False, placement=lambda *_: [])
    cluster = SimpleNamespace(cpus_per_run=1, gpus_per_run=0)
    return preflight._probe_job(launcher, jobs, SimpleNamespace(cluster=cluster), SPEC, tmp_path, env={}, wait_s=5)


def test_a_probe_job_ray_itself_ended_runs_once_more_and_a_probe_that_failed_does_not(tmp_path):
    from isoflop_cli.preflight import MARK

    died = (None, "")
    answered = (0, MARK + json.dumps([asdict(node(tmp_path))]) + "\n")
    jobs = ScriptedJobs(died, answered)
    nodes, _ = probe_with(jobs, tmp_path)
    assert [n.host for n in nodes] == ["gpu-1"] and jobs.submitted == [
        "isoflop-preflight-abc",
        "isoflop-preflight-abc-1",
    ]

    jobs = ScriptedJobs(died, died)  # twice: Ray's own word is the problem
    nodes, (problem,) = probe_with(jobs, tmp_path)
    assert nodes == [] and len(jobs.submitted) == 2
    assert problem.endswith("with /opt/venv/bin/python): Job supervisor actor died: the actor died unexpectedly"), (
        problem
    )

    no_isoflop = (1, "/opt/venv/bin/python: No module named isoflop_cli\n")  # as Python says it: no exception line
    jobs = ScriptedJobs(no_isoflop, answered)  # the probe's own failure: its answer, not another try
    nodes, (problem,) = probe_with(jobs, tmp_path)
    assert nodes == [] and jobs.submitted == ["isoflop-preflight-abc"]
    assert problem.endswith("with /opt/venv/bin/python): /opt/venv/bin/python: No module named isoflop_cli"), problem

    # A node's isoflop of another version: one that reports what this one reads, less a field with
    # a default and plus one it does not know, reads as a node (whose version the CLI names) ...
    other = {k: v for k, v in asdict(node(tmp_path)).items() if k != "unwritable"} | {"from_the_future": 1}
    nodes, _ = probe_with(ScriptedJobs((0, MARK + json.dumps([other]) + "\n")), tmp_path)
    assert [n.host for n in nodes] == ["gpu-1"] and nodes[0].unwritable == {}
    # ... and one that reports less than this one needs is one line.
    older = (0, MARK + json.dumps([{"host": "gpu-1", "cpus": 16}]) + "\n")
    nodes, (problem,) = probe_with(ScriptedJobs(older), tmp_path)
    assert (
        nodes == []
        and "the preflight probe's answer does not read" in problem
        and "install the same isoflop on every node" in problem
    )

    killed = (-9, "")  # no output at all: Ray's word on the exit
    nodes, (problem,) = probe_with(ScriptedJobs(killed), tmp_path)
    assert problem.endswith("): Job entrypoint command failed with exit code -9"), problem


@pytest.mark.e2e
def test_doctor_on_a_busy_cluster_and_a_sweep_whose_nodes_lack_isoflop(tmp_path, ray_address, ray_jobs):
    """`isoflop doctor` probes the node of a running cluster (the suite's shared head) while a job
    holds every CPU there: the probe asks for none, so it does not wait for a free one. A sweep
    whose runs' interpreter has no isoflop (cluster.python: the venv's base Python) stops at the
    preflight, exit 2, before any run."""
    from ray.job_submission import JobStatus

    def isoflop(*args):
        return run_isoflop(*args, f"cluster.address={ray_address}", timeout=300)

    held = ray_jobs.submit_job(
        entrypoint="sleep 900", entrypoint_num_cpus=os.cpu_count()
    )  # the shared head has os.cpu_count() CPUs
    try:
        while ray_jobs.get_job_status(held) == JobStatus.PENDING:
            time.sleep(0.2)
        ok = isoflop("doctor", "--root", str(tmp_path))
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert (
            "sweep dir shared, run files readable" in ok.stdout and "ready: a run asks for 1 CPU and 0 GPU" in ok.stdout
        )
        bare = Path(sys.base_prefix) / "bin" / "python3"
        bad = isoflop(
            "sweep",
            "--root",
            str(tmp_path),
            "grid.n=[2]",
            "grid.B_p=[2]",
            "grid.budgets=[16]",
            f"cluster.python={bare}",
        )
        assert bad.returncode == 2, bad.stdout + bad.stderr
        assert "preflight found 1 problem(s) before any run started" in bad.stderr and "No module named" in bad.stderr
        assert not list((tmp_path / "default" / "runs").glob("*/status.json"))  # no run started
        assert ray_jobs.get_job_status(held) == JobStatus.RUNNING  # it held every CPU throughout
    finally:
        ray_jobs.stop_job(held)
        while not ray_jobs.get_job_status(held).is_terminal():
            time.sleep(0.2)
