"""Values that pass the schema but are nonsense, and messages that must be one line (issue 29,
"Nothing lost, round 2"): each mechanism tested on the case that failed and one variant. No Ray;
one test trains (marked slow)."""

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.tasks.dataset import read_rows

runner = CliRunner()
DATASET = [
    "plan",
    "task=dataset",
    "task.answer_key=answer",
    "task.max_new_tokens=6",
    "task.max_prompt_tokens=8",
    "task.val_fraction=0.5",
    "eval.problems=1",
]


def one_error(result, needle: str) -> str:
    """The output is one line, `error: ...` holding `needle`, and the exit code is 2."""
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert needle in lines[0], result.output
    return lines[0]


# --- data files: answers by type; NaN, infinity and null refused naming the file and the row ----


def test_answers_are_normalised_by_type_and_nan_infinity_null_refused(tmp_path):
    # A float column of whole numbers (pandas' way to hold ints beside a missing value) gave "12.0".
    pd.DataFrame({"prompt": ["1+2=", "2+2=", "6+6=", "1+1="], "answer": [3.0, 4.0, 12.0, 2.5]}).to_parquet(
        tmp_path / "f.parquet"
    )
    assert [r.answer for r in read_rows(str(tmp_path / "f.parquet"), "task.train", "prompt", "answer")] == [
        "3",
        "4",
        "12",
        "2.5",
    ]
    # The case that failed: NaN in a float column read as the answer "nan" (then "'a' is not a character ...").
    pd.DataFrame({"prompt": ["1+2=", "2+2=", "3+3="], "answer": [3.0, float("nan"), 6.0]}).to_parquet(
        tmp_path / "nan.parquet"
    )
    one_error(
        runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'nan.parquet'}"]), "nan.parquet row 1: 'answer' is nan"
    )
    # Variants: JSON's Infinity and null.
    for name, value, needle in (("inf", "Infinity", "'answer' is inf"), ("null", "null", "'answer' is null")):
        (tmp_path / f"{name}.jsonl").write_text(
            f'{{"prompt": "1+2=", "answer": 3}}\n{{"prompt": "1+3=", "answer": {value}}}\n'
        )
        one_error(
            runner.invoke(app, [*DATASET, f"task.train={tmp_path / name}.jsonl"]), f"{name}.jsonl row 1: {needle}"
        )


def test_a_json_array_file_is_told_to_be_json_lines(tmp_path):
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "2+2=", "answer": "4"}]
    for indent in (None, 1):  # the whole array on one line (read as row 0, a list), and one object per several lines
        (tmp_path / "rows.json").write_text(json.dumps(rows, indent=indent))
        one_error(
            runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'rows.json'}"]),
            "rows.json is a JSON array: give JSON Lines",
        )


def test_held_out_set_errors_name_their_eval_sets_key(tmp_path):
    pd.DataFrame({"prompt": ["1+2=", "2+2="], "answer": ["3", "4"]}).to_parquet(tmp_path / "train.parquet")
    pd.DataFrame({"prompt": ["1+2=", "2+2="], "answer": ["3", None]}).to_parquet(tmp_path / "held.parquet")
    base = [*DATASET, f"task.train={tmp_path / 'train.parquet'}"]
    line = one_error(runner.invoke(app, [*base, f"+eval.sets={{held:{tmp_path / 'held.parquet'}}}"]), "eval.sets.held ")
    assert "task.train" not in line and "held.parquet row 1: 'answer' is " in line
    one_error(runner.invoke(app, [*base, f"+eval.sets={{other:{tmp_path / 'nope.parquet'}}}"]), "eval.sets.other ")


# --- derived values: checked like the config's own before any run --------------------------------

DERIVED = {  # each mechanism's case that failed (passed `plan`, then failed in every run), then a variant
    "seed above the generators' range": (
        ["plan", "grid.seed=[100000000000000000000000]"],
        "grid.seed must be a whole number in [0, 2**32)",
    ),
    "negative seed of one run": (["run", "seed=-1"], "seed must be a whole number in [0, 2**32), got -1"),
    "temperature that overflows the logits": (
        ["plan", "algo.temperature=1e-300"],
        "algo.temperature must be a finite number >= 0.01",
    ),
    "temperature on an axis": (
        ["plan", "+grid.axes={algo.temperature:[0.6,0.001]}"],
        "algo.temperature must be a finite number >= 0.01",
    ),
    "infinite learning rate": (
        ["plan", "grid.n=[64]", "grid.B_p=[4]", "algo.base_lr=1e308", "algo.lr_scaling=linear"],
        "is a learning rate of inf",
    ),
    "infinite learning rate of one run": (
        ["run", "n=64", "B_p=4", "algo.base_lr=1e308", "algo.lr_scaling=linear"],
        "is a learning rate of inf",
    ),
    "model name too long for a directory": (
        ["plan", "model.name=" + "m" * 300],
        "model.name is 300 characters long: at most 100",
    ),
    "sweep name too long for a directory": (["plan", "name=" + "s" * 101], "name is 101 characters long: at most 100"),
    "FLOPs that overflow (plan --json printed Infinity)": (
        ["plan", "--json", "grid.budgets=[1.7e308]"],
        "FLOPs a run: above 1e+30",
    ),
    "FLOPs that overflow at one budget": (["plan", "grid.budgets=[512,1e300]"], "FLOPs a run: above 1e+30"),
}


@pytest.mark.parametrize("name", list(DERIVED))
def test_derived_values_are_checked_before_any_run(name, tmp_path):
    args, needle = DERIVED[name]
    one_error(runner.invoke(app, [*args, *(["--run-dir", str(tmp_path / "r")] if args[0] == "run" else [])]), needle)
    assert not (tmp_path / "r").exists()


# --- results read by fit, replay and race-pilot: columns named, numbers finite ---------------------


def _results(tmp_path, name: str, **columns) -> str:
    path = tmp_path / name
    pd.DataFrame(columns).to_parquet(path) if name.endswith(".parquet") else pd.DataFrame(columns).to_csv(
        path, index=False
    )
    return str(path)


def test_results_columns_are_present_finite_numbers_named_by_column_and_row(tmp_path):
    # The case that failed: replay without its compute column was a KeyError traceback.
    path = _results(tmp_path, "r.csv", run_id=["a", "b"], n=[2, 4], **{"val_avg@k": [0.1, 0.2]})
    one_error(runner.invoke(app, ["replay", path]), "r.csv: no column rollouts (have: run_id, n, val_avg@k)")
    # race-pilot: all-infinite flops_total still named a regime; a non-numeric rho read as "no run reaches the budgets".
    race = {"run_id": ["a", "a"], "reward": ["sparse"] * 2, "val_native": [0.1, 0.2]}
    path = _results(tmp_path, "inf.parquet", **race, rho=[0.2, 0.3], flops_total=[float("inf")] * 2)
    one_error(
        runner.invoke(app, ["race-pilot", "--from-results", path]),
        "inf.parquet: flops_total in row 0 is not finite (inf)",
    )
    path = _results(tmp_path, "rho.parquet", **race, rho=["0.2", "high"], flops_total=[1e9, 2e9])
    one_error(
        runner.invoke(app, ["race-pilot", "--from-results", path]), "rho.parquet: rho in row 1 is not a number ('high')"
    )


def test_a_results_file_that_is_a_directory_is_named(tmp_path):
    (tmp_path / "sweep" / "results.parquet").mkdir(parents=True)
    for command in (
        "fit",
        "replay",
    ):  # a sweep dir whose results.parquet is a directory was an IsADirectoryError traceback
        one_error(
            runner.invoke(app, [command, str(tmp_path / "sweep")]),
            "sweep/results.parquet is a directory, not a results file",
        )


@pytest.mark.parametrize("share", [-3, 1.5])
def test_a_replayed_share_outside_0_1_is_refused(tmp_path, share):
    (tmp_path / "replay.json").write_text(json.dumps({"compute_share": share}))  # -3 was printed as "-300%"
    one_error(
        runner.invoke(app, ["plan", "--replay", str(tmp_path / "replay.json")]),
        f"compute_share must be in (0, 1] (a share of the full grid's compute), got {share}",
    )


def test_replay_warnings_are_lines_of_their_own_not_python_warnings(tmp_path):
    rows = [("a", 2, c, v) for c, v in ((0, 0.1), (2, 0.15), (4, 0.2), (8, 0.3))] + [
        ("b", 4, c, v) for c, v in ((0, 0.1), (2, 0.1), (4, None), (8, 0.4))
    ]
    path = _results(tmp_path, "r.csv", **dict(zip(["run_id", "n", "rollouts", "val_avg@k"], map(list, zip(*rows)))))
    result = runner.invoke(app, ["replay", path, "--budgets", "2,4,8"])
    assert result.exit_code == 0, result.output
    assert (
        "warning: replay: dropped 1 of 8 rows with NaN" in result.output
        and "FitWarning" not in result.output
        and ".py:" not in result.output
    )


# --- a user's reward function: every call checked, one line naming it, a failure for good ----------

USER_REWARDS = """
import math

def nan_for_wrong(problems, completions):
    return [1.0 if c == p.answer else math.nan for p, c in zip(problems, completions)]

def one_short(problems, completions):
    return [0.5] * (len(completions) - 1)

def words(problems, completions):
    return ["good" for _ in completions]

def raises(problems, completions):
    raise ValueError("no such field\\n  while scoring 'answer'")

def good(problems, completions):
    return [c == p.answer for p, c in zip(problems, completions)]
"""


@pytest.fixture
def user_rewards(tmp_path, monkeypatch):
    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))


@pytest.mark.parametrize(
    "fn, needle",
    [
        (
            "nan_for_wrong",
            "returned nan for completion 1: each score must be a finite number",
        ),  # the sampler's "inf/nan" steps later
        ("one_short", "returned 1 scores for 2 completions: it must return one per completion"),
        ("words", "returned 'good' for completion 0"),
        ("raises", "raised ValueError: while scoring 'answer'"),  # the exception's last line, not a traceback
    ],
)
def test_a_user_reward_function_is_checked_on_every_call(user_rewards, fn, needle):
    from omegaconf import OmegaConf

    from isoflop_cli.errors import ConfigError
    from isoflop_cli.recipe.rewards import make_reward
    from isoflop_cli.tasks.arith import ArithTask

    task = ArithTask()
    problem = task.problem([4, 3], ["+"])
    reward = make_reward(OmegaConf.create({"name": "custom", "fn": "user_rewards:good"}), task)
    assert reward([problem] * 2, [problem.answer, "9"])[0] == [1.0, 0.0]  # bools are numbers
    reward = make_reward(OmegaConf.create({"name": "custom", "fn": f"user_rewards:{fn}"}), task)
    with pytest.raises(ConfigError) as e:
        reward([problem] * 2, [problem.answer, "9"])
    assert (
        str(e.value).startswith(f"reward.fn 'user_rewards:{fn}' ")
        and needle in str(e.value)
        and "\n" not in str(e.value)
    )


@pytest.mark.slow  # trains (builds the embedded model on first use)
def test_a_run_whose_reward_returns_nan_fails_for_good_with_its_line(user_rewards, tmp_path):
    from isoflop_cli.store import RunFiles

    result = runner.invoke(
        app,
        [
            "run",
            "--run-dir",
            str(tmp_path / "r"),
            "n=4",
            "B_p=2",
            "grid.budgets=[16]",
            "grid.eval_points=2",
            "eval.problems=4",
            "eval.samples=4",
            "reward=custom",
            "reward.fn=user_rewards:nan_for_wrong",
        ],
    )
    assert result.exit_code == 2, result.output  # the dispatcher's USER_ERROR: not retried
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1
        and "reward.fn 'user_rewards:nan_for_wrong' returned nan" in errors[0]
        and "Traceback" not in result.output
    )
    assert RunFiles(tmp_path / "r").failure_reason() == errors[0].removeprefix("error: ")


@pytest.mark.slow  # loads the embedded model
def test_a_file_whose_every_prompt_is_too_long_for_the_tokenizer_is_a_user_error(tmp_path):
    """Only the run's tokenizer counts a prompt's tokens, so this is found when the run starts; it is
    the input's fault all the same: exit 2, one line (the dispatcher then does not retry it)."""
    pd.DataFrame({"prompt": [f"{i}+{i}+{i}+{i}+{i}+{i}=" for i in range(8)], "answer": ["1"] * 8}).to_parquet(
        tmp_path / "long.parquet"
    )
    args = [
        "run",
        "--run-dir",
        str(tmp_path / "r"),
        *DATASET[1:],
        f"task.train={tmp_path / 'long.parquet'}",
        "n=2",
        "B_p=2",
        "grid.budgets=[16]",
        "eval.samples=4",
        "eval.k=4",
    ]
    assert runner.invoke(app, ["plan", *args[3:]]).exit_code == 0  # plan cannot tell: it reads no tokenizer
    result = runner.invoke(app, args)
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(errors) == 1 and "is longer than task.max_prompt_tokens=8 (the shortest has 12 tokens)" in errors[0], (
        result.output
    )


# --- manifests: what the readers of a cell take for granted is part of its schema -----------------


@pytest.mark.parametrize("command", ["status", "logs"])
def test_a_retrying_cell_without_its_failure_is_a_malformed_manifest(tmp_path, command):
    # `status` read the failure a retrying cell retries after: an IndexError traceback.
    (tmp_path / "manifest.json").write_text(
        '{"version": 1, "cells": {"a": {"M": 4, "state": "retrying", "attempts": 1}}}'
    )
    args = [command, str(tmp_path), *(["a"] if command == "logs" else [])]
    one_error(runner.invoke(app, args), "cell 'a' is malformed (state retrying without the failure it retries after)")


CELL = {
    "M": 4,
    "state": "finished",
    "columns": {"n": 2, "B_p": 2, "model": "tiny-arith"},
    "step_flops": [1.0, 2.0, 0.0],
}


@pytest.mark.parametrize(
    "cells, needle",
    [
        ({"../../etc": CELL}, "cell '../../etc' is not a directory name"),  # `logs` would read outside the sweep
        ({"a": {**CELL, "columns": {"n": "x"}}}, 'columns.n is "x", not a number'),
        ({"a": {**CELL, "step_flops": [0, 0]}}, "step_flops [0.0, 0.0] is not a step's FLOPs"),
        ({"a": {**CELL, "M": -5}}, "M is -5"),
        ("deep", "nested too deep"),
    ],
    ids=["run id a path", "n not a number", "no step FLOPs", "negative M", "nested"],
)
@pytest.mark.parametrize("command", ["status", "plan"])
def test_a_manifest_its_readers_would_crash_on_is_refused_naming_it(tmp_path, cells, needle, command):
    """Found by fuzzing: each was a traceback in `status` or `plan` (a path outside the sweep for `logs`)."""
    sweep = tmp_path / "default"
    sweep.mkdir()
    text = "[" * 100_000 + "]" * 100_000 if cells == "deep" else json.dumps({"version": 1, "cells": cells})
    (sweep / "manifest.json").write_text(text)
    args = ["status", str(sweep)] if command == "status" else ["plan", "--root", str(tmp_path)]
    one_error(runner.invoke(app, args), needle)


def test_a_run_record_its_readers_would_crash_on_is_refused_and_a_stray_line_skipped(tmp_path):
    sweep = tmp_path / "default"
    (sweep / "runs" / "a").mkdir(parents=True)
    (sweep / "manifest.json").write_text(json.dumps({"version": 1, "cells": {"a": CELL}}))
    status = {"version": 1, "state": "finished", "rows": [{"step": 4, "rollouts": 16, "flops_total": 1e9}]}
    (sweep / "runs" / "a" / "metrics.jsonl").write_text(
        '[1, 2]\n"x"\n' + json.dumps(status["rows"][0]) + "\n"
    )  # lines that are not rows
    (sweep / "runs" / "a" / "status.json").write_text(json.dumps(status))
    result = runner.invoke(app, ["status", str(sweep)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    for bad in ("x", -1.0, 1e400):
        (sweep / "runs" / "a" / "status.json").write_text(
            json.dumps({**status, "rows": [{"step": 4, "flops_total": bad}]})
        )
        one_error(runner.invoke(app, ["plan", "--root", str(tmp_path)]), "are not eval points")
    (
        sweep / "runs" / "a" / "metrics.jsonl"
    ).unlink()  # repaired from the sealed copy, which records no FLOPs: plan would scale by 0
    (sweep / "runs" / "a" / "status.json").write_text(json.dumps({**status, "rows": [{"step": 4, "flops_total": 0}]}))
    one_error(runner.invoke(app, ["plan", "--root", str(tmp_path)]), "records no flops_total")


# --- a failed job's reason: one line, whatever Ray appends ---------------------------------------


def test_a_killed_jobs_reason_is_one_line_with_its_exception_and_its_logs_path(tmp_path):
    from isoflop_cli.joblog import job_message

    log = tmp_path / "runs" / "a" / "log.txt"
    # The case that failed: Ray's message carries the log's last 20,000 characters into the reason.
    tail = (
        "step 3\n" * 2500
        + 'Traceback (most recent call last):\n  File "x.py", line 1\nMemoryError: out of memory\nstep 4\n'
    )
    message = (
        f"Job entrypoint command failed with exit code -9, last available logs (truncated to 20,000 chars):\n{tail}"
    )
    assert (
        job_message(message, log)
        == f"Job entrypoint command failed with exit code -9; MemoryError: out of memory (log: {log})"
    )
    # Variants: a tail without an exception line, and Ray's message without a tail (as it is).
    assert (
        job_message(message.replace("MemoryError: out of memory", "bye"), log)
        == f"Job entrypoint command failed with exit code -9 (log: {log})"
    )
    assert job_message("Job entrypoint command failed with exit code 1. No logs available.", log).endswith(
        "No logs available."
    )


# --- SLURM: sbatch's refusal is the one message, not raw lines before it ------------------------


def test_sbatchs_refusal_is_one_message_not_its_raw_lines_first(tmp_path, monkeypatch, capfd):
    pytest.importorskip("submitit")
    from omegaconf import OmegaConf

    from isoflop_cli.config.schema import ClusterConfig
    from isoflop_cli.errors import SlurmRefused
    from isoflop_cli.slurm import SlurmClient

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 0\n")  # submitit takes SLURM to be there when srun is
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n"
    )
    for tool in ("srun", "sbatch"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    cluster = OmegaConf.structured(ClusterConfig)
    cluster.slurm.executor, cluster.slurm.partition = "slurm", "nope"
    client = SlurmClient(cluster, tmp_path / "slurm")
    with pytest.raises(SlurmRefused, match=r"SLURM refused the runs' jobs: .*Invalid partition name specified"):
        client.submit_job("true", "isoflop-a-1")  # one job
    with pytest.raises(SlurmRefused, match="Invalid partition name specified"), client.batch():
        client.submit_job("true", "isoflop-b-1")  # an array job, submitted as the batch ends
    assert "sbatch" not in capfd.readouterr().err


def _score_nan(group) -> None:
    from isoflop_cli.errors import ConfigError

    if group.is_main:  # rank 0 scores the batch
        raise ConfigError(
            "reward.fn 'user_rewards:nan_for_wrong' returned nan for completion 1: each score must be a finite number"
        )
    group.broadcast(None)


@pytest.mark.slow  # two spawned torch processes
def test_a_ranks_user_error_stays_one_line_in_a_sharded_run():
    from isoflop_cli.errors import ConfigError
    from isoflop_cli.recipe import distributed

    with pytest.raises(ConfigError) as e:  # not torch's ProcessRaisedException with the rank's traceback
        distributed.launch(_score_nan, 2, timeout_s=30)
    assert (
        str(e.value)
        == "reward.fn 'user_rewards:nan_for_wrong' returned nan for completion 1: each score must be a finite number"
    )


# --- paths and sizes: every name that becomes a path stays under its root; inputs are regular files;
# --- sizes have bounds (issue 29, section 4) ------------------------------------------------------


@pytest.mark.parametrize("override", ["model.name=../../x", "+grid.axes={model.name:[tiny-arith,../escaped]}"])
def test_a_model_name_that_would_leave_the_model_cache_is_refused(override, tmp_path):
    """`model.name=../../x` built the embedded model outside the model cache (also as a grid axis)."""
    one_error(runner.invoke(app, ["plan", override, "--root", str(tmp_path)]), "must be a plain directory name")
    assert not list(tmp_path.iterdir())


def test_a_named_pipe_as_a_data_file_is_refused_not_waited_on(tmp_path):
    """A FIFO as task.train blocked `plan` forever (reading it waits for a writer)."""
    import os

    fifo = tmp_path / "problems.jsonl"
    os.mkfifo(fifo)
    one_error(runner.invoke(app, [*DATASET, f"task.train={fifo}"]), "is not a regular file")
    one_error(runner.invoke(app, [*DATASET, f"task.train={tmp_path}/missing.jsonl"]), "does not exist")


@pytest.mark.parametrize(
    "override, needle",
    [
        ("task.digits=[50000000]", "task.digits"),
        ("task.digits=[400]", "task.digits"),
        ("task.operands=100000000", "task.operands"),
    ],
)
def test_arithmetic_sizes_beyond_any_model_are_refused_at_once(override, needle):
    """task.digits=[50000000] or task.operands=1e8 never returned; task.digits=[400] was an OverflowError."""
    one_error(runner.invoke(app, ["plan", override]), needle)


def test_a_group_relative_algorithm_refuses_groups_of_one(tmp_path):
    """Once: n=1 with grpo planned and charged learning FLOPs for groups whose advantage is always 0.
    Variant: a group-relative algorithm (cispo) on an axis beside one with a value head (ppo), and
    a single run of dr_grpo; ppo alone takes n=1."""
    one_error(
        runner.invoke(app, ["plan", "+grid.axes={algo.name:[ppo,cispo]}", "grid.n=[1,4]"]),
        "grid.n=1 with algo.name=cispo: its advantages are relative",
    )
    one_error(
        runner.invoke(app, ["run", "n=1", "algo.name=dr_grpo", "--run-dir", str(tmp_path / "r")]),
        "a group of 1 has no learning signal",
    )
    assert not (tmp_path / "r").exists()
    assert runner.invoke(app, ["plan", "algo.name=ppo", "grid.n=[1,4]"]).exit_code == 0


def test_an_eval_point_given_twice_is_refused_by_every_reader_of_results(tmp_path):
    """Once: race-pilot --from-results read duplicated (run_id, step) rows that fit and replay
    refused. Variant: a CSV whose second run repeats its last step, read by all three."""
    rows = {
        "run_id": ["a", "a", "b", "b", "b"],
        "step": [0, 2, 0, 2, 2],
        "n": [2, 2, 4, 4, 4],
        "reward": ["sparse"] * 5,
        "rollouts": [0, 8, 0, 8, 8],
        "flops_total": [0.0, 1e9, 0.0, 1e9, 1e9],
        "rho": [0.3] * 5,
        "val_native": [0.1, 0.2, 0.1, 0.3, 0.3],
        "val_avg@k": [0.1, 0.2, 0.1, 0.3, 0.3],
    }
    path = _results(tmp_path, "twice.csv", **rows)
    for command in (
        ["fit", path, "--out", str(tmp_path / "fit")],
        ["replay", path],
        ["race-pilot", "--from-results", path],
    ):
        one_error(runner.invoke(app, command), "twice.csv: run b has step 2 twice: each eval point once")


def test_a_sweep_dirs_results_must_be_its_manifests_runs(tmp_path):
    """Once: results.parquet replaced by another sweep's was fitted under this sweep's name. Variant:
    this sweep's run ids with another sweep's axis values, and a run the manifest does not hold."""
    from isoflop_cli.fit import data as fit_data
    from isoflop_cli.store import FINISHED, CellState, Manifest, SweepDir

    def sweep(path, ns):
        sweep_dir = SweepDir(path)
        sweep_dir.write_manifest(
            Manifest(cells={f"r{n}": CellState(columns={"n": n, "B_p": 2, "model": "tiny"}) for n in ns})
        )
        for n in ns:
            files = sweep_dir.run(f"r{n}")
            for step in range(4):
                files.append_metrics({"step": step, "rollouts": 16 * n * step, "val_avg@k": 0.1 * step / n})
            files.set_status(FINISHED)
        sweep_dir.collect()
        return sweep_dir

    ours, theirs = sweep(tmp_path / "ours", [2, 4]), sweep(tmp_path / "theirs", [2, 4])
    assert len(fit_data.read(ours.path)) == 8  # its own results read
    relabelled = pd.read_parquet(theirs.results_file).assign(n=lambda df: df["n"] * 2)
    relabelled.to_parquet(ours.results_file, index=False)
    one_error(
        runner.invoke(app, ["fit", str(ours.path), "--out", str(tmp_path / "fit")]),
        f"run r2 has n 4 where its cell in {ours.manifest_file} has 2: these are not this sweep's results",
    )
    pd.read_parquet(theirs.results_file).replace({"run_id": {"r4": "r8"}}).to_parquet(ours.results_file, index=False)
    one_error(runner.invoke(app, ["replay", str(ours.path)]), f"run r8 is not a cell of {ours.manifest_file}")


# --- rows checked against each other, not only one by one (issue 46) -------------------------------


def test_one_prompt_with_two_answers_is_refused_naming_its_rows(tmp_path):
    """Issue 46: the same prompt twice with two answers in a JSONL file passed, and calibrate put it
    in both the easy and the hard set. Variant: chat-message prompts in parquet, a number and a
    string answer; the same prompt with the same answer (3 and "3" read alike) is a duplicate, kept."""
    chat = [{"role": "user", "content": "1+2="}]
    rows = [
        {"prompt": chat, "answer": "3"},
        {"prompt": [{"role": "user", "content": "2+2="}], "answer": "4"},
        {"prompt": chat, "answer": "3"},
        {"prompt": [{"role": "user", "content": "2+3="}], "answer": "5"},
        {"prompt": chat, "answer": "30"},
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "chat.parquet")
    one_error(
        runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'chat.parquet'}"]),
        "chat.parquet rows 0 and 4: the same prompt '1+2=' has two answers ('3', '30')",
    )
    (tmp_path / "same.jsonl").write_text(
        '{"prompt": "1+2=", "answer": 3}\n{"prompt": "1+2=", "answer": "3"}\n{"prompt": "2+2=", "answer": 4}\n'
    )
    assert len(read_rows(str(tmp_path / "same.jsonl"), "task.train", "prompt", "answer")) == 3


def test_a_validation_file_that_is_the_training_file_is_said(tmp_path):
    """Issue 46: task.val equal to task.train passed silently. Variant: the same file through a link
    under another name (one warning line on stderr; the plan goes on: it may be intended)."""
    (tmp_path / "train.jsonl").write_text("".join(f'{{"prompt": "{a}+1=", "answer": {a + 1}}}\n' for a in range(8)))
    (tmp_path / "val.jsonl").symlink_to(tmp_path / "train.jsonl")
    result = runner.invoke(
        app, [*DATASET, f"task.train={tmp_path / 'train.jsonl'}", f"task.val={tmp_path / 'val.jsonl'}"]
    )
    warned = [line for line in result.stderr.splitlines() if "task.val" in line]  # the power warning aside
    assert (
        result.exit_code == 0
        and len(warned) == 1
        and warned[0].startswith("warning: task.val ")
        and "is the training file" in warned[0]
    ), result.output
    other = runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'train.jsonl'}", "task.val_fraction=0.5"])
    assert other.exit_code == 0 and "is the training file" not in other.output, other.output


# --- a reader holds a bounded row and file (issue 46) ----------------------------------------------


def test_an_oversized_row_is_refused_before_it_is_read_into_python(tmp_path, monkeypatch):
    """Issue 46: one 200 MB prompt line passed plan and the preflight, then every attempt was
    OOM-killed. Here a 3 MB row against limits lowered for the test: a JSONL line refused while
    reading at most the limit of it (json never sees it, the reader's peak memory stays below the
    row), and the variant, a 3 MB chat message in a parquet file, refused from Arrow's value lengths
    before pandas converts a row; a file above the file limit is refused from its size alone."""
    import tracemalloc

    from isoflop_cli.tasks import bounds, dataset

    monkeypatch.setattr(bounds, "ROW_ALLOWANCE", 64 << 10)
    big = "9" * (3 << 20)
    (tmp_path / "big.jsonl").write_text(
        f'{{"prompt": "1+2=", "answer": 3}}\n{{"prompt": "{big}+1=", "answer": 4}}\n{{"prompt": "2+2=", "answer": 4}}\n'
    )
    loads = json.loads
    monkeypatch.setattr(
        dataset.json,
        "loads",
        lambda text: loads(text) if len(text) < (64 << 10) + 8 * 64 + 2 else pytest.fail("read whole"),
    )
    line = one_error(
        runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'big.jsonl'}"]),
        "big.jsonl line 2 holds 3.0 MiB, above the 64.5 KiB a row may hold",
    )
    assert "64 bytes per token of task.max_prompt_tokens" in line
    tracemalloc.start()
    with pytest.raises(dataset.TaskError, match=r"line 2 holds 3\.0 MiB"):
        read_rows(str(tmp_path / "big.jsonl"), "task.train", "prompt", "answer", prompt_tokens=8)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < len(big) // 4, peak
    monkeypatch.setattr(dataset.json, "loads", loads)
    rows = [
        {"prompt": [{"role": "user", "content": c}], "answer": a} for c, a in (("1+2=", "3"), (big, "4"), ("2+2=", "4"))
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "big.parquet", row_group_size=2)
    monkeypatch.setattr(pd, "read_parquet", lambda *a, **k: pytest.fail("converted"))
    one_error(
        runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'big.parquet'}"]),
        "big.parquet row 1 holds 3.0 MiB, above the 64.5 KiB",
    )
    monkeypatch.setattr(bounds, "MAX_FILE_BYTES", 1 << 20)
    one_error(
        runner.invoke(app, [*DATASET, f"task.train={tmp_path / 'big.parquet'}"]),
        "a problem file may hold (every run keeps all its rows in memory)",
    )


def _sweep_rows(reverse: str | None = None) -> pd.DataFrame:
    """Two seeds of n = 2, 4, 8, eval points at 0..8,192 rollouts; `reverse`: that run's rollouts backwards."""
    rows = []
    for n in (2, 4, 8):
        for seed in (0, 1):
            for step, c in enumerate([0, 1024, 2048, 4096, 8192]):
                y = 0.3 + 0.05 * step + 0.01 * n * step / 8 + 0.01 * seed
                rows.append(
                    {
                        "run_id": f"n{n}s{seed}",
                        "n": n,
                        "B_p": 8,
                        "seed": seed,
                        "step": step,
                        "rollouts": c,
                        "val_avg@k": y,
                    }
                )
    df = pd.DataFrame(rows)
    if reverse:
        df.loc[df["run_id"] == reverse, "rollouts"] = df.loc[df["run_id"] == reverse, "rollouts"].to_numpy()[::-1]
    return df


def test_fit_reads_what_it_can_and_refuses_what_it_cannot(tmp_path):
    """Once: a column of lists was a TypeError traceback; results without run_id were read as a run a
    row ("cannot tell"); a run's rollouts given backwards were fitted, and moved the answer. Now the
    lists are ignored (the same fit as without them), runs without run_id are told apart by their axes
    and seed (the same answer as with it, said in a line), and compute that falls is one line, exit 2."""

    def answer(df: pd.DataFrame, name: str):
        df.to_parquet(tmp_path / f"{name}.parquet")
        result = runner.invoke(app, ["fit", str(tmp_path / f"{name}.parquet"), "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        return json.loads((tmp_path / name / "fit.json").read_text())["n_star_trend"], result.output

    plain_answer, _ = answer(_sweep_rows(), "plain")
    assert answer(_sweep_rows().assign(tags=[[1, 2]] * 30), "lists")[0] == plain_answer
    without, output = answer(_sweep_rows().drop(columns=["run_id"]), "without")
    assert without == plain_answer and "no run_id column: runs are identified by n, B_p, seed" in output
    _sweep_rows(reverse="n2s0").to_parquet(tmp_path / "reversed.parquet")
    one_error(
        runner.invoke(app, ["fit", str(tmp_path / "reversed.parquet"), "--out", str(tmp_path / "r")]),
        "run n2s0 has rollouts 4096 at step 1, less than at its step before: a run's compute only grows",
    )
    _sweep_rows().drop(columns=["run_id", "seed"]).to_parquet(tmp_path / "anonymous.parquet")
    one_error(
        runner.invoke(app, ["fit", str(tmp_path / "anonymous.parquet"), "--out", str(tmp_path / "a")]),
        "no run_id column, and no n and seed to tell its runs apart",
    )
