"""Bad input: one clear line, exit code 2, nothing started or written."""

import os
import stat

import numpy as np
import pytest
from conftest import run_isoflop
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.config.compose import SWEEPS_DIR as SWEEPS

runner = CliRunner()

CASES = {
    "the clock in a run's identity": (
        ["plan", "task.instruction=${now:%H%M%S%f}"],
        "task.instruction=${now:%H%M%S%f}: ${now:...} has another value at every invocation",
    ),
    "the invocation in a sweep's name": (
        ["plan", "name=${hydra:runtime.cwd}"],
        "name=${hydra:runtime.cwd}: ${hydra:...}",
    ),
    "unknown key": (["plan", "grid.nn=[4]"], "unknown config key 'grid.nn' (did you mean grid.n?)"),
    "unknown key in a section": (["plan", "algo.temprature=0.5"], "(did you mean algo.temperature?)"),
    "unknown axis key": (
        ["plan", "+grid.axes={algo.kl_coeff:[0.1]}"],
        "unknown config key 'algo.kl_coeff' (did you mean algo.kl_coef?)",
    ),
    "unknown top-level key": (["plan", "foo=1"], "foo"),
    "wrong type": (["plan", "grid.n=abc"], "grid.n"),
    "wrong enum": (["plan", "algo.lr_scaling=cube"], "algo.lr_scaling"),
    "malformed override": (["plan", "grid.n=[4,"], "cannot parse the override 'grid.n=[4,'"),
    # Characters Hydra's grammar refuses unquoted: the override named, and how to quote it.
    "semicolon in a value": (
        ["plan", "name=a;b"],
        "cannot parse the override 'name=a;b': ';' is not allowed in an unquoted value; quote the value, name='a;b'",
    ),
    "control character in a value": (
        ["plan", "name=a\x01b"],
        "cannot parse the override 'name=a\\x01b': '\\x01' is not allowed",
    ),
    "newline in a value": (["run", "name=a\nb"], "cannot parse the override 'name=a\\nb'"),
    "non-ASCII in a value": (
        ["plan", "name=é"],
        "cannot parse the override 'name=é': 'é' is not allowed in an unquoted value",
    ),
    "n <= 0": (["plan", "grid.n=[4,0]"], "grid.n must be a finite number > 0"),
    "B_p <= 0": (["plan", "grid.B_p=[-1]"], "grid.B_p must be a finite number > 0"),
    "budget not a number": (["plan", "grid.budgets=[nan]"], "grid.budgets must be a finite number > 0"),
    "axis value out of range": (["plan", "+grid.axes={algo.temperature:[0.6,-1.0]}"], "algo.temperature must be"),
    "axis value of the wrong type": (["plan", "+grid.axes={algo.kl_coef:[abc]}"], "algo.kl_coef"),
    "axis model path missing": (["plan", "+grid.axes={model.path:[/nonexistent/ckpt]}"], "/nonexistent/ckpt"),
    "negative warm-up": (["plan", "algo.warmup_steps=-3"], "algo.warmup_steps"),
    "non-positive grad norm": (["plan", "algo.max_grad_norm=0"], "algo.max_grad_norm"),
    "broken interpolation": (["plan", "algo.temperature=${oops}"], "oops"),
    "sweep name is a path": (["plan", "name=../elsewhere"], "plain directory name"),
    "embedded model heads": (["plan", "model.build.num_kv_heads=3"], "num_kv_heads"),
    "stray share of one": (["plan", "model.build.stray=1"], "model.build.stray must be in [0, 1)"),
    "local head has no GPUs": (
        ["sweep", "cluster.gpus_per_run=1", "grid.n=[2]", "grid.B_p=[4]"],
        "cluster.gpus_per_run",
    ),
    "no Ray cluster at the address": (
        ["sweep", "cluster.address=http://127.0.0.1:9", "grid.n=[2]", "grid.B_p=[4]"],
        "cannot reach the Ray cluster",
    ),
    "not an address": (
        ["sweep", "cluster.address=notaurl", "grid.n=[2]", "grid.B_p=[4]"],
        "cannot reach the Ray cluster at notaurl",
    ),
    "fit axis is the metric": (["fit", "/nonexistent/sweep", "--axis", "val_avg@k"], "three different columns"),
    "race bootstrap negative": (["race-pilot", "--dry-run", "--bootstrap", "-5"], "--bootstrap"),
    "race cap out of range": (["race-pilot", "--dry-run", "--cap", "-1"], "--cap"),
    "batch above max_batch": (["plan", "grid.max_batch=4"], "no feasible cell"),
    "budget below one step": (["plan", "grid.budgets=[3]"], "no feasible cell"),
    "unknown model": (["plan", "model=gpt-9"], "model/gpt-9"),
    "missing model path": (["plan", "model=local"], "model.path"),
    "model path not a checkpoint": (["plan", "model.path=/nonexistent/ckpt"], "/nonexistent/ckpt"),
    "unknown sweep": (["plan", "--config", "nope"], "nope"),
    "unknown reward": (["plan", "reward.name=magic"], "reward.name"),
    "eval samples below k": (["plan", "eval.samples=2"], "eval.samples"),
    "unknown loss aggregation": (["plan", "algo.loss_agg=sum"], "algo.loss_agg"),
    "unknown algorithm": (["plan", "algo=ppo2"], "algo/ppo2"),
    "unknown algorithm name": (["plan", "algo.name=ppo2"], "algo.name 'ppo2' is not one of: grpo, dr_grpo, cispo, ppo"),
    "non-boolean std_norm": (["plan", "algo.std_norm=maybe"], "algo.std_norm"),
    "std_norm without group advantages": (["plan", "algo=ppo", "algo.std_norm=false"], "ppo's advantages are gae's"),
    "log copies never": (["plan", "cluster.log_every_s=0"], "cluster.log_every_s"),
    "unknown launcher": (["plan", "cluster.launcher=k8s"], "cluster.launcher 'k8s' is not one of: ray, slurm"),
    "unknown slurm executor": (["plan", "cluster=slurm", "cluster.slurm.executor=pbs"], "cluster.slurm.executor"),
    "negative LoRA rank": (["plan", "lora.rank=-1"], "lora.rank"),
    "unknown LoRA target": (["plan", "lora.targets=[q_proj,wq]"], "wq"),
    "minibatches above the batch": (["plan", "grid.n=[2]", "grid.B_p=[2]", "algo.minibatches=8"], "minibatches"),
    "fit path missing": (["fit", "/nonexistent/sweep"], "/nonexistent/sweep"),
    "status path missing": (["status", "/nonexistent/sweep"], "/nonexistent/sweep"),
    "run bad override": (["run", "n=0"], "n must be a finite number > 0"),
    # A repeated axis value would be planned and costed as a cell the sweep runs once.
    "repeated n": (["plan", "grid.n=[4,4]"], "grid.n lists 4 twice"),
    "repeated B_p": (["plan", "grid.B_p=[4,8,4]"], "grid.B_p lists 4 twice"),
    "repeated seed": (["plan", "grid.seed=[0,1,0]"], "grid.seed lists 0 twice"),
    "repeated budget": (["plan", "grid.budgets=[512,512]"], "grid.budgets lists 512"),
    "repeated axis value": (["plan", "+grid.axes={algo.kl_coef:[0.1,0.1]}"], "grid.axes.algo.kl_coef lists 0.1 twice"),
    "axis values equal once typed": (
        ["plan", "+grid.axes={algo.kl_coef:[0,0.0]}"],
        "grid.axes.algo.kl_coef lists 0.0 twice",
    ),
    "repeated list axis value": (["plan", "+grid.axes={task.ops:[[+],[+]]}"], "grid.axes.task.ops lists [+] twice"),
    "repeated group axis value": (
        ["plan", "+grid.axes={reward:[sparse,sparse]}"],
        "grid.axes.reward lists sparse twice",
    ),
    "axis values that are one run": (
        ["plan", "grid.n=[2]", "+grid.axes={calibrate.shard:[256,512]}"],
        "are the same run",
    ),
    "doctor checks every cell": (
        ["doctor", "+grid.axes={algo.kl_coef:[-1,0.1]}"],
        "algo.kl_coef must be a finite number >= 0, got -1.0",
    ),
    "task.train without task=dataset": (
        ["plan", "task.train=/tmp/problems.parquet"],
        "task.train names the problems of task=dataset; task=arith",
    ),
    "GPU memory of 0": (["plan", "cluster.gpu_memory_gib=0"], "cluster.gpu_memory_gib must be a finite number > 0"),
    "a config file not named .yaml": (["plan", "--config", "README.md"], "config file README.md: name it README.yaml"),
    "a cluster setting as an axis": (
        ["plan", "+grid.axes={cluster.gpus_per_run:[0,2]}"],
        "grid.axes.cluster.gpus_per_run: the cluster is the sweep's",
    ),
    "NaN GPUs": (["plan", "cluster.gpus_per_run=nan"], "cluster.gpus_per_run must be >= 0, got nan"),
    "infinite GPUs": (["run", "cluster.gpus_per_run=inf"], "cluster.gpus_per_run must be >= 0, got inf"),
    "NaN pause": (["run", "--pause-at", "nan"], "--pause-at must be a finite budget > 0, got nan"),
    "negative pause": (["run", "--pause-at", "-1"], "--pause-at must be a finite budget > 0, got -1.0"),
    # grid.axes entries are lists; a list value only where the key takes a list.
    "axis entry not a list": (
        ["plan", "+grid.axes={algo.kl_coef:0.1}"],
        "grid.axes.algo.kl_coef must be a list of values",
    ),
    "list value for a number": (["plan", "+grid.axes={algo.kl_coef:[[0.1]]}"], "algo.kl_coef"),
    "list value for a group": (
        ["plan", "+grid.axes={model:[[tiny-arith]]}"],
        "grid.axes.model takes names of model configs",
    ),
    # Every number finite, every path a run needs present.
    "NaN tis_cap": (["plan", "algo.tis_cap=nan"], "algo.tis_cap must be a finite number, got nan"),
    "infinite tis_cap": (["run", "algo.tis_cap=inf"], "algo.tis_cap must be a finite number, got inf"),
    "NaN unchecked float": (["plan", "lora.alpha=nan"], "lora.alpha must be a finite number"),
    "NaN axis value": (
        ["plan", "+grid.axes={algo.kl_coef:[0.1,nan]}"],
        "grid.axes.algo.kl_coef must be a finite number",
    ),
    "python missing": (
        ["plan", "cluster.python=/nonexistent/python3"],
        "cluster.python /nonexistent/python3 is not an executable file",
    ),
    "python not on PATH": (
        ["sweep", "cluster.python=no-such-python3"],
        "cluster.python no-such-python3 is not on PATH",
    ),
    # Draw loops: both splits hold what runs draw from them; completions fit the model.
    "eval problems above the validation split": (
        ["plan", "task.digits=[1]"],
        "eval.problems=256 exceeds the validation split: 16 of the 100 problems",
    ),
    "empty validation split": (
        ["run", "task.digits=[1]", "task.val_fraction=0.001", "eval.problems=1"],
        "exceeds the validation split: 0 of",
    ),
    "empty training split": (
        ["plan", "task.digits=[1]", "task.val_fraction=0.999", "eval.problems=1"],
        "leaves the training split empty",
    ),
    "validation split too rare to draw": (
        ["plan", "task.digits=[4]", "task.val_fraction=0.00001"],
        "of draws land in the validation split",
    ),
    "eval problems absurd": (["plan", "eval.problems=1000000000"], "eval.problems must be <= 100,000"),
    "completion above the context": (
        ["plan", "task.max_new_tokens=100000"],
        "task.max_new_tokens=100000: the longest prompt (6 tokens)",
    ),
    "completion above the context on an axis": (
        ["plan", "+grid.axes={task.max_new_tokens:[6,59]}"],
        "at most task.max_new_tokens=58",
    ),
    "PRM input above its context": (
        ["plan", "task=arith-steps", "reward=prm", "task.max_new_tokens=56"],
        "the embedded reward model",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_exits_2_with_one_line(name, tmp_path):
    args, needle = CASES[name]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert needle in lines[0]


def test_a_checkpoint_without_weights_is_planned_not_run(tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, '
        '"intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 19}'
    )
    assert runner.invoke(app, ["plan", f"model.path={tmp_path}"]).exit_code == 0  # planning reads config.json alone
    result = runner.invoke(app, ["sweep", "--root", str(tmp_path / "out"), f"model.path={tmp_path}"])
    assert result.exit_code == 2 and "has no weights" in result.output and not (tmp_path / "out").exists()
    # Weights a run cannot load, and weights without the tokenizer (transformers would build an empty
    # one from config.json, and every prompt would be no tokens): refused before anything starts.
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 64)
    result = runner.invoke(app, ["sweep", "--root", str(tmp_path / "out"), f"model.path={tmp_path}"])
    assert (
        result.exit_code == 2
        and "model.safetensors is not a readable safetensors file" in result.output
        and not (tmp_path / "out").exists()
    )
    from safetensors.numpy import save_file

    save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(tmp_path / "model.safetensors"))
    result = runner.invoke(app, ["sweep", "--root", str(tmp_path / "out"), f"model.path={tmp_path}"])
    assert result.exit_code == 2 and "has no tokenizer" in result.output and not (tmp_path / "out").exists(), (
        result.output
    )


def test_a_typo_inside_a_config_file_is_named(tmp_path):
    (tmp_path / "base.yaml").write_text((SWEEPS / "default.yaml").read_text())
    (tmp_path / "typo.yaml").write_text("defaults:\n  - base\n  - _self_\nalgo:\n  kl_coeff: 0.1\n")
    result = runner.invoke(app, ["plan", "--config", str(tmp_path / "typo.yaml")])
    assert result.exit_code == 2 and "unknown config key 'algo.kl_coeff'" in result.output
    (tmp_path / "broken.yaml").write_text("defaults: [base\nalgo: {")
    result = runner.invoke(app, ["plan", "--config", str(tmp_path / "broken.yaml")])
    assert result.exit_code == 2 and "not valid YAML" in result.output
    (tmp_path / "loop.yaml").write_text(
        "defaults:\n  - base\n  - _self_\na: &a [*a]\n"
    )  # an anchor inside its own node
    result = runner.invoke(app, ["plan", "--config", str(tmp_path / "loop.yaml")])
    assert result.exit_code == 2 and "a value holds itself" in result.output, result.output


def test_a_malformed_results_line_is_named(tmp_path):
    for name, line in (("short", "b,4"), ("long", "b,4,16,0.2,9")):
        (tmp_path / f"{name}.csv").write_text(f"run_id,n,rollouts,val_avg@k\na,2,8,0.1\n{line}\n")
        result = runner.invoke(app, ["fit", str(tmp_path / f"{name}.csv")])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and "line 3 has" in lines[0], result.output


def test_sweep_errors_start_nothing(tmp_path):
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", "--root", str(out), "grid.n=[0]"])
    assert result.exit_code == 2
    assert not out.exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_out_dir(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    result = runner.invoke(app, ["sweep", "--root", str(locked / "x")])
    assert result.exit_code == 2 and "not writable" in result.output


def test_out_dir_under_a_file_is_unwritable(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = runner.invoke(app, ["sweep", "--root", str(blocker / "x")])
    assert result.exit_code == 2 and "not writable" in result.output


def test_dry_run_and_plan_json(tmp_path):
    result = runner.invoke(app, ["sweep", "--dry-run", "--root", str(tmp_path / "o"), "grid.n=[2,4]", "grid.B_p=[4]"])
    assert result.exit_code == 0 and not (tmp_path / "o").exists()
    result = runner.invoke(app, ["plan", "--json", "grid.n=[2,4]", "grid.B_p=[4]", "grid.budgets=[64]"])
    import json

    records = json.loads(result.stdout)["cells"]  # the object alone on stdout; warnings go to stderr
    assert [r["M"] for r in records] == [8, 4]
    assert records[0]["eval_at"][-1] == 64 and records[0]["budget_column"] == "rollouts"


@pytest.mark.parametrize("text", ["", "\n", "# nothing but a comment\n"])
def test_an_empty_config_file_is_named(tmp_path, text):
    (tmp_path / "empty.yaml").write_text(text)
    result = runner.invoke(app, ["plan", "--config", str(tmp_path / "empty.yaml")])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "empty.yaml is empty" in lines[0], result.output


def test_list_valued_axes_plan_as_json_and_table():
    import json

    args = [
        "grid.n=[4]",
        "grid.B_p=[4]",
        "lora.rank=2",
        "+grid.axes={task.ops:[[+],[+,-,'*']],lora.targets:[[q_proj],[q_proj,v_proj]]}",
    ]
    result = runner.invoke(app, ["plan", "--json", *args])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout)["cells"]  # the object alone on stdout; warnings go to stderr
    assert [r["axes"]["task.ops"] for r in records] == [["+"], ["+"], ["+", "-", "*"], ["+", "-", "*"]]
    assert [r["axes"]["lora.targets"] for r in records] == [["q_proj"], ["q_proj", "v_proj"]] * 2
    ids = [r["run_id"] for r in records]
    assert len(set(ids)) == 4 and ids[3].startswith("n4_bp4_s0_ops-+,-,__targets-q_proj,v_proj_")
    assert all(set(i) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.,=+-") for i in ids)  # a directory and job name
    result = runner.invoke(app, ["plan", *args, "+grid.axes.reward=[sparse,dense]"])
    assert result.exit_code == 0 and "8 feasible cells of 8" in result.output, result.output


def test_draw_loops_refuse_up_front(tmp_path):
    # An empty split used to spin `run` forever at step 0: now exit 2 before anything is built.
    for split in (["task.val_fraction=0.999", "eval.problems=1"], ["task.val_fraction=0.001", "eval.problems=1"]):
        result = run_isoflop("run", "--run-dir", str(tmp_path / "r"), "task.digits=[1]", *split, timeout=120)
        assert result.returncode == 2 and "split" in result.stderr and not (tmp_path / "r").exists(), result.stderr


def test_long_completions_plan_without_a_stall(tmp_path):
    # A checkpoint whose config.json does not bound its context: planning is O(1) in max_new_tokens.
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, '
        '"intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 19}'
    )
    (tmp_path / "model.safetensors").touch()
    result = run_isoflop("plan", "--json", f"model.path={tmp_path}", "task.max_new_tokens=100000000", timeout=60)
    assert result.returncode == 0, result.stderr
    (tmp_path / "config.json").write_text(
        '{"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, "max_position_embeddings": 32, '
        '"intermediate_size": 128, "num_attention_heads": 4, "vocab_size": 19}'
    )
    result = run_isoflop("plan", f"model.path={tmp_path}", "task.max_new_tokens=27", timeout=60)
    assert (
        result.returncode == 2
        and "above the 32 of model.path" in result.stderr
        and "at most task.max_new_tokens=26" in result.stderr
    )


def test_a_model_cache_that_is_a_file_is_named(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("")
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "cache"))
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 2 and "(ISOFLOP_CACHE) is not a directory" in result.output, result.output
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "cache" / "below"))
    result = runner.invoke(app, ["run", "--run-dir", str(tmp_path / "r")])
    assert result.exit_code == 2 and "is not a writable directory" in result.output, result.output


def test_a_trackers_directory_that_cannot_be_made_is_named_before_any_run(tmp_path):
    """Trackers never fail a run (each failure is a warning in its log), so a tracking.dir no run
    could write would have lost every run's tracking quietly: the CLI refuses it first."""
    (tmp_path / "file").write_text("")
    for where, needle in [
        (tmp_path / "file", "is not a directory"),
        (tmp_path / "file" / "below", f"cannot be made: {tmp_path / 'file'} is not a writable directory"),
    ]:
        result = runner.invoke(
            app, ["run", "--run-dir", str(tmp_path / "r"), "tracking.backends=[tensorboard]", f"tracking.dir={where}"]
        )
        assert result.exit_code == 2 and f"the trackers' directory {where} (tracking.dir) {needle}" in result.output, (
            result.output
        )
    assert not (tmp_path / "r").exists()
    for nothing_there in (
        [],
        ["tracking.backends=[mlflow]", "tracking.mlflow_uri=http://127.0.0.1:1"],
    ):  # a server takes MLflow's runs
        plain = runner.invoke(app, ["plan", f"tracking.dir={tmp_path / 'file'}", *nothing_there])
        assert plain.exit_code == 0, plain.output


@pytest.mark.parametrize("columns", [80, 120])
def test_every_command_s_help_shows_every_word_of_its_texts(columns, monkeypatch):
    """Each command's help, at 80 and 120 columns, holds its docstring and each option's help
    whole: nothing read as markup and dropped (a "[default: ...]" once vanished), no word lost to
    wrapping."""
    import re

    import typer.main

    monkeypatch.setenv("COLUMNS", str(columns))
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        if command.hidden:
            continue
        result = CliRunner().invoke(app, [name, "--help"], terminal_width=columns)
        assert result.exit_code == 0, result.output
        shown = re.sub(r"[\s│╭╮╰╯─]+", " ", result.output)
        texts = [command.help or ""] + [
            p.help for p in command.params if getattr(p, "help", None) and not getattr(p, "hidden", False)
        ]
        for text in texts:
            words = " ".join(text.split())
            assert words in shown, (name, columns, words)


def test_a_config_whose_aliases_expand_beyond_the_limit_is_refused_at_once(tmp_path, monkeypatch):
    """Issue 46: a 9^7-leaf alias bomb of lists printed nothing for 150 s. Variant: a bomb of
    mappings (9^5 leaves) against a lowered limit, refused in one line within seconds."""
    import time

    from isoflop_cli.config import compose

    monkeypatch.setattr(compose, "MAX_VALUES", 10_000)
    levels = ["defaults:\n  - base\n  - _self_\nx0: &a0 {" + ", ".join(f"k{j}: 1" for j in range(9)) + "}\n"]
    levels += [f"x{i}: &a{i} {{" + ", ".join(f"k{j}: *a{i - 1}" for j in range(9)) + "}\n" for i in range(1, 5)]
    (tmp_path / "base.yaml").write_text((SWEEPS / "default.yaml").read_text())
    (tmp_path / "bomb.yaml").write_text("".join(levels))
    start = time.monotonic()
    result = runner.invoke(app, ["plan", "--config", str(tmp_path / "bomb.yaml")])
    lines = result.output.strip().splitlines()
    assert (
        result.exit_code == 2
        and len(lines) == 1
        and "expands to more than 10,000 values through its YAML aliases" in lines[0]
    ), result.output
    assert time.monotonic() - start < 10


@pytest.mark.parametrize(
    "given, needle",
    [(".", "is a directory, not a file"), ("/dev/null", "is not a regular file (a device, a pipe or a socket)")],
)
def test_a_config_that_is_no_file_says_what_it_is(given, needle, tmp_path):
    """Issue 46: a directory or /dev/zero as --config was "config file not found". Variants: the
    current directory, /dev/null; and a dangling link."""
    one = runner.invoke(app, ["plan", "--config", given])
    assert one.exit_code == 2 and needle in one.output and "not found" not in one.output, one.output
    (tmp_path / "gone.yaml").symlink_to(tmp_path / "nowhere.yaml")
    dangling = runner.invoke(app, ["plan", "--config", str(tmp_path / "gone.yaml")])
    assert dangling.exit_code == 2 and "is a link to nothing" in dangling.output, dangling.output
