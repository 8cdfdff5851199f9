"""Experiment trackers: every eval row of a run to Weights & Biases, MLflow and/or TensorBoard
(`tracking.backends`), as teams already follow their runs.

One tracker run per isoflop run, keyed by the content-hashed run id, so a resumed or retried run
continues the same tracker run: wandb's run id is the run id (`resume="allow"`); MLflow's run is
found by its `isoflop.run_id` tag; TensorBoard's log dir is named by it. Runs are grouped by sweep
name (wandb group, MLflow tag `isoflop.sweep`, TensorBoard's parent dir), with the run's resolved
config as the tracker's config. Offline by default: wandb in offline mode (`wandb sync` uploads
later), MLflow in a local file store, TensorBoard event files, all under `tracking.dir`.

Tracking never blocks or fails a run: a tracker that raises is a warning in the run's log and is
left out for the rest of the run.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

BACKENDS = ("wandb", "mlflow", "tensorboard")
PACKAGES = {
    "wandb": "wandb",
    "mlflow": "mlflow-skinny",
    "tensorboard": "tensorboard",
}  # pip names, for the config error


def tracker_root(tracking, run_dir: Path) -> Path:
    """Where offline tracker files go: `tracking.dir`, else the sweep dir's `tracking/` (a single
    `isoflop run` outside a sweep: its own dir's)."""
    return sweep_tracker_root(tracking, run_dir.parent.parent if run_dir.parent.name == "runs" else run_dir)


def sweep_tracker_root(tracking, sweep_dir: Path) -> Path:
    return Path(tracking.dir) if tracking.dir else sweep_dir / "tracking"


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"algo": {"name": "grpo"}} -> {"algo.name": "grpo"}; lists and None as their text."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return out


class Tracking:
    """The trackers of one run. `log` takes a metrics row (its numbers go in at the row's step)."""

    def __init__(self, tracking, run_id: str, group: str, config: dict[str, Any], root: Path):
        self.trackers: list = []
        for name in tracking.backends:
            try:
                self.trackers.append(OPEN[name](tracking, run_id, group, config, root))
            except Exception as e:
                _warn(name, "open", e)

    def log(self, row: dict[str, Any]) -> None:
        metrics = {
            k: float(v)
            for k, v in row.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        }
        self._each("log", metrics, int(row["step"]))

    def attach(self, files: list[Path]) -> None:
        self._each("attach", files)

    def close(self, failed: bool = False) -> None:
        self._each("close", failed)
        self.trackers = []

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.trackers):
            try:
                getattr(tracker, method)(*args)
            except Exception as e:
                _warn(tracker.name, method, e)
                self.trackers.remove(tracker)


def _warn(name: str, what: str, error: BaseException) -> None:
    print(
        f"warning: tracking.backends {name}: {what} failed "
        f"({type(error).__name__}: {error}); the run goes on without it",
        flush=True,
    )


class Wandb:
    name = "wandb"
    keeps_files = staticmethod(lambda tracking: True)  # its run dir, online too

    def __init__(self, tracking, run_id: str, group: str, config: dict[str, Any], root: Path):
        import wandb

        root.mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(console="off", x_disable_stats=True, silent=True)  # the run's log is its own
        self.run = wandb.init(
            project=tracking.project,
            id=run_id,
            name=run_id,
            group=group,
            config=config,
            dir=str(root),
            mode=tracking.wandb_mode,
            resume="allow",
            settings=settings,
        )

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def attach(self, files: list[Path]) -> None:
        """PNGs as images, every file into the run's files."""
        import wandb

        self.run.log({p.stem: wandb.Image(str(p)) for p in files if p.suffix == ".png"}, step=0)
        for p in files:  # the run's files dir is what `wandb sync` uploads (wandb.save would symlink, and say so)
            shutil.copy(p, Path(self.run.dir) / p.name)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


class Mlflow:
    """Through `MlflowClient` (no global active run), so several trackers can live in one process."""

    name = "mlflow"
    keeps_files = staticmethod(
        lambda tracking: not tracking.mlflow_uri
    )  # a local file store, unless a server takes the runs

    def __init__(self, tracking, run_id: str, group: str, config: dict[str, Any], root: Path):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        uri = tracking.mlflow_uri
        if not uri:
            root.mkdir(parents=True, exist_ok=True)
            uri = (root / "mlruns").absolute().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps the file store behind an opt-in
        self.client = MlflowClient(tracking_uri=uri)
        experiment_id = self._experiment(tracking.project)
        found = self.client.search_runs(
            [experiment_id], filter_string=f"tags.`isoflop.run_id` = '{run_id}'", max_results=1
        )
        if found:
            self.run_id = found[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {"isoflop.run_id": run_id, "isoflop.sweep": group}
            self.run_id = self.client.create_run(experiment_id, run_name=run_id, tags=tags).info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in config.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a batch
                self.client.log_batch(self.run_id, params=params[i : i + 100])

    def _experiment(self, name: str) -> str:
        """The experiment's id, created if need be; runs starting together race to create it, and
        the ones that lose find it."""
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(name)
        if experiment:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:
            return self.client.get_experiment_by_name(name).experiment_id

    def log(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(mlflow_name(k), v, now, step) for k, v in metrics.items()])

    def attach(self, files: list[Path]) -> None:
        for p in files:
            self.client.log_artifact(self.run_id, str(p))

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def mlflow_name(name: str) -> str:
    """A metric name as MLflow takes it: '@' -> '_at_' (val_avg@k -> val_avg_at_k), any other
    character it refuses -> '_'."""
    return re.sub(r"[^A-Za-z0-9_\-. :/]", "_", name.replace("@", "_at_"))


class Tensorboard:
    name = "tensorboard"
    keeps_files = staticmethod(lambda tracking: True)

    def __init__(self, tracking, run_id: str, group: str, config: dict[str, Any], root: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(root / "tensorboard" / group / run_id))
        self.writer.add_text("config", "\n".join(f"    {k}: {v}" for k, v in config.items()), 0)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def attach(self, files: list[Path]) -> None:
        """PNGs as images, markdown as text (TensorBoard shows no other files)."""
        from matplotlib.image import imread

        for p in files:
            if p.suffix == ".png":
                self.writer.add_image(p.stem, imread(p)[..., :3], 0, dataformats="HWC")
            elif p.suffix == ".md":
                self.writer.add_text(p.stem, p.read_text(), 0)
        self.writer.flush()

    def close(self, failed: bool = False) -> None:
        self.writer.close()


OPEN = {"wandb": Wandb, "mlflow": Mlflow, "tensorboard": Tensorboard}


def writes_dir(tracking) -> bool:
    """Whether a tracker of `tracking.backends` writes files under the trackers' directory."""
    return any(OPEN[name].keeps_files(tracking) for name in tracking.backends)


def log_fit(tracking, sweep: str, summary: dict[str, Any], files: list[Path], root: Path) -> None:
    """A fit of a sweep to one sweep-level tracker run per backend (id `<sweep>-fit`, in the sweep's
    group): its numbers (fit.json, flattened) as one row at step 0, its PNG plots as images and its
    files (fit.json, frontier.csv, report.md, plots) as the run's files or artifacts. Like a run's
    tracking, a failure is a warning."""
    numbers = {
        k: v
        for k, v in flat(summary).items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }
    tracking_runs = Tracking(tracking, f"{sweep}-fit", sweep, {"fit.files": ", ".join(p.name for p in files)}, root)
    tracking_runs.log({**numbers, "step": 0})
    tracking_runs.attach(files)
    tracking_runs.close()
