"""Trackers in their offline modes, read back: one tracker run per isoflop run, continued (not
restarted) when the run resumes, every eval row in it; and a tracker that fails never fails a run."""

import json
import math
import struct

import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.tracking import flat, mlflow_name

pytest.importorskip("wandb")
pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")

ARGS = [
    "n=4",
    "B_p=2",
    "grid.budgets=[32]",
    "grid.eval_points=2",
    "eval.problems=8",
    "eval.samples=4",
    "checkpoint.every=0",
]


def wandb_records(path):
    """The records of a .wandb file (wandb's LevelDB-style log: 32 KiB blocks, 7-byte record headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, records, partial = path.read_bytes(), 7, [], b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        partial = chunk if kind in (1, 2) else partial + chunk  # full, first | middle, last
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(partial)
            records.append(record)
    return records


@pytest.mark.slow
def test_every_eval_row_reaches_each_tracker_once_and_a_resumed_run_continues_its_tracker_run(tmp_path):
    run_dir = tmp_path / "n4_bp2_s0_feedbeef"
    args = ["run", *ARGS, "tracking.backends=[wandb,mlflow,tensorboard]", "--run-dir", str(run_dir)]
    paused = CliRunner().invoke(app, [*args, "--pause-at", "16"])  # stops at step 2 with a checkpoint
    assert paused.exit_code == 0, paused.output
    finished = CliRunner().invoke(app, args)  # a new process would do the same: resumes from the checkpoint
    assert finished.exit_code == 0, finished.output
    assert "resumed from the checkpoint at step 2" in finished.output and "warning" not in finished.output
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    expected = {r["step"]: r["val_avg@k"] for r in rows}
    assert sorted(expected) == [0, 2, 4]
    root = run_dir / "tracking"  # a run outside a sweep: its own dir

    # wandb, offline: both processes logged to the run id (`wandb sync` joins them), grouped by sweep.
    logged, configs = {}, []
    for path in sorted((root / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                assert (record.run.run_id, record.run.run_group, record.run.project) == (
                    run_dir.name,
                    "default",
                    "isoflop",
                )
                configs.append(
                    {c.key or "/".join(c.nested_key): json.loads(c.value_json) for c in record.run.config.update}
                )
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
                logged[items["_step"]] = items["val_avg@k"]
    assert len(configs) == 2 and configs[0]["n"] == 4 and configs[0]["algo.name"] == "grpo"
    assert logged == expected

    # MLflow, a local file store read back through its client: one run, found again on resume.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("isoflop")
    runs = client.search_runs([experiment.experiment_id])
    assert (
        len(runs) == 1
        and runs[0].data.tags["isoflop.run_id"] == run_dir.name
        and runs[0].data.tags["isoflop.sweep"] == "default"
    )
    assert runs[0].data.params["n"] == "4" and runs[0].info.status == "FINISHED"
    history = client.get_metric_history(runs[0].info.run_id, "val_avg_at_k")
    assert {m.step: m.value for m in history} == pytest.approx(expected) and len(history) == 3

    # TensorBoard event files, read back.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(root / "tensorboard" / "default" / run_dir.name))
    events.Reload()
    assert {e.step: e.value for e in events.Scalars("val_avg@k")} == pytest.approx(expected)


@pytest.mark.slow
def test_a_tracker_that_fails_is_a_warning_and_the_run_finishes(tmp_path):
    """The trackers' directory is there (a tracking.dir that is not is refused before the run), but
    a file stands where each tracker keeps its own: both fail to open, as on a full or foreign disk."""
    root = tmp_path / "tracking"
    root.mkdir()
    for blocked in ("mlruns", "tensorboard"):  # MLflow's file store, TensorBoard's log dirs
        (root / blocked).write_text("a file where the tracker's directory should be")
    result = CliRunner().invoke(
        app,
        [
            "run",
            *ARGS,
            "tracking.backends=[mlflow,tensorboard]",
            f"tracking.dir={root}",
            "--run-dir",
            str(tmp_path / "run"),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "warning: tracking.backends mlflow: open failed" in result.output
    assert "warning: tracking.backends tensorboard: open failed" in result.output
    assert json.loads((tmp_path / "run" / "status.json").read_text())["state"] == "finished"


def test_tracking_config_errors_name_the_key(tmp_path):
    for extra, message in (
        (["tracking.backends=[neptune]"], "tracking.backends 'neptune' is not one of: wandb, mlflow, tensorboard"),
        (["tracking.backends=[wandb]", "tracking.wandb_mode=cloud"], "tracking.wandb_mode 'cloud'"),
        (["tracking.backends=[wandb,wandb]"], "tracking.backends"),
    ):
        result = CliRunner().invoke(app, ["plan", *extra])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


def test_a_sweeps_fit_goes_to_a_sweep_level_tracker_run(tmp_path):
    """`isoflop fit` on a sweep whose sweep.yaml names trackers: the fit's numbers, plots and files
    in one tracker run `<sweep>-fit`, beside the runs'."""
    import numpy as np
    import pandas as pd
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sweep = tmp_path / "mysweep"
    sweep.mkdir()
    (sweep / "sweep.yaml").write_text("name: mysweep\ntracking:\n  backends: [wandb, mlflow, tensorboard]\n")
    log_c = np.linspace(2, 6, 9)
    frames = [
        pd.DataFrame(
            {
                "run_id": f"n{n}",
                "n": n,
                "B_p": 4,
                "seed": 0,
                "step": np.arange(9),
                "rollouts": 10**log_c,
                "val_avg@k": 0.1 + 0.5 / (1 + np.exp(-(log_c - 2 - 0.5 * k))),
            }
        )
        for k, n in enumerate((2, 4, 8))
    ]
    pd.concat(frames).to_parquet(sweep / "results.parquet")
    result = CliRunner().invoke(app, ["fit", str(sweep), "--bootstrap", "4"])
    assert result.exit_code == 0 and "warning: tracking" not in result.output, result.output
    fit = json.loads((sweep / "fit" / "fit.json").read_text())
    root = sweep / "tracking"

    client = MlflowClient(tracking_uri=(root / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("isoflop").experiment_id])
    assert run.data.tags["isoflop.run_id"] == "mysweep-fit" and run.data.tags["isoflop.sweep"] == "mysweep"
    numbers = {
        k: v
        for k, v in flat(fit).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    key, value = next(iter(numbers.items()))  # e.g. a per-n curve's fitted parameter
    assert len(run.data.metrics) == len(numbers) + 1 and run.data.metrics[mlflow_name(key)] == pytest.approx(
        value
    )  # + the row's step
    assert {"fit.json", "frontier.png", "report.md"} <= {a.path for a in client.list_artifacts(run.info.run_id)}

    events = EventAccumulator(str(root / "tensorboard" / "mysweep" / "mysweep-fit"), size_guidance={"images": 0})
    events.Reload()
    assert "frontier" in events.Tags()["images"] and events.Scalars(key)[0].value == pytest.approx(value)

    (offline,) = (root / "wandb").glob("offline-run-*-mysweep-fit")
    assert (offline / "files" / "fit.json").exists() and (offline / "files" / "frontier.png").exists()
