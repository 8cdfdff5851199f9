"""Hugging Face Hub ids for the model and the problem files, resolved through the local Hugging Face
cache (laid out here as huggingface_hub lays it out: blobs, snapshots/<commit> of links to them,
refs/main naming the commit), offline: nothing here touches the network."""

import hashlib
import os

import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli import config
from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"  # an older commit, kept in the cache beside main's


def cached_repo(hub, kind: str, repo: str, files: dict[str, bytes], commit: str = COMMIT, ref: str | None = "main"):
    """One repo in the cache at `commit`, each file a blob its snapshot links to, `ref` naming the commit."""
    root = hub / f"{kind}s--{repo.replace('/', '--')}"
    for name, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = root / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    if ref:
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return root / "snapshots" / commit


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An offline Hugging Face cache holding a tiny Qwen2 (org/tiny, at main and an older commit) and
    a data set of sums with a train and a test file (org/sums)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from isoflop_cli.recipe.checkpoint import char_tokenizer

    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    source = tmp_path / "tiny"
    tok = char_tokenizer()
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(
        Qwen2Config(
            vocab_size=len(tok),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
            max_position_embeddings=64,
            tie_word_embeddings=True,
        )
    ).save_pretrained(source)
    tok.save_pretrained(source)
    model_files = {f.name: f.read_bytes() for f in source.iterdir()}
    cached_repo(home / "hub", "model", "org/tiny", model_files)
    cached_repo(home / "hub", "model", "org/tiny", model_files, commit=OTHER, ref=None)
    data = {}
    for split, numbers in (("train", range(40)), ("test", range(40, 60))):
        path = tmp_path / f"{split}.parquet"
        pd.DataFrame([{"prompt": f"{i}+1=", "answer": str(i + 1), "data_source": "sums"} for i in numbers]).to_parquet(
            path
        )
        data[f"data/{split}-00000-of-00001.parquet"] = path.read_bytes()
    cached_repo(home / "hub", "dataset", "org/sums", data)
    return home / "hub"


BASE = [
    "model=local",
    "task=dataset",
    "task.answer_key=answer",
    "task.max_prompt_tokens=8",
    "task.max_new_tokens=4",
    "eval.problems=4",
]


def test_hub_ids_of_a_model_and_a_data_set_resolve_through_the_local_cache(hub, tmp_path, monkeypatch):
    from isoflop_cli import grid
    from isoflop_cli import hub as hub_mod
    from isoflop_cli.config.machine import check_runnable
    from isoflop_cli.recipe import checkpoint
    from isoflop_cli.tasks.dataset import DatasetTask

    monkeypatch.chdir(tmp_path)  # no local org/ directory: the ids are ids
    cfg = config.load(None, [*BASE, "model.path=org/tiny", "task.train=org/sums", "task.val=org/sums"])
    assert (
        cfg.model.path == "org/tiny" and cfg.task.train == "org/sums"
    )  # not made local paths: each node resolves them
    snapshot = hub / "models--org--tiny" / "snapshots" / COMMIT
    assert checkpoint.model_path(cfg.model, cfg.task) == snapshot
    check_runnable([cfg])  # the snapshot's weights and tokenizer, through their links to the blobs
    tokenizer, model = checkpoint.load(cfg.model, cfg.task)
    assert model.config.hidden_size == 16 and tokenizer.encode("1+1=")
    task = DatasetTask.from_config(cfg.task)  # task.train: the file naming the train split, task.val the test one
    assert [r.answer for r in task.rows_of["train"]][:2] == ["1", "2"] and task.rows_of["val"][0].answer == "41"
    assert task.rows_of["train"][0].columns == {"answer": "1", "data_source": "sums"}
    cells = grid.expand(cfg)  # run ids hash the data by content, found in the cache
    assert cells and all(c.run_id for c in cells)
    # A revision pins a commit; a path inside a data set's repo is hf://datasets/...
    assert hub_mod.checkpoint(f"org/tiny@{OTHER}", "model.path") == hub / "models--org--tiny" / "snapshots" / OTHER
    test_file = hub_mod.data_file("hf://datasets/org/sums/data/test-00000-of-00001.parquet", "task.train")
    assert test_file.name == "test-00000-of-00001.parquet" and test_file.is_symlink()
    pinned = config.load(
        None, [*BASE, f"model.path=org/tiny@{OTHER}", f"task.train=hf://datasets/org/sums@{COMMIT}/data"]
    )
    assert pinned.model.path == f"org/tiny@{OTHER}" and DatasetTask.from_config(pinned.task).rows_of["train"]


def test_a_hub_id_not_in_the_cache_is_one_line_saying_how_to_allow_the_download(hub, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for extra, needle in (
        (
            ["model.path=org/missing", "task.train=org/sums"],
            "model.path org/missing is neither a local path nor a model in the local Hugging Face cache",
        ),
        (["model.path=org/missing", "task.train=org/sums"], "allow the download with model.download=true"),
        (["model.path=org/missing", "model.download=true", "task.train=org/sums"], "unset HF_HUB_OFFLINE"),
        (["model.path=org/tiny@v2", "task.train=org/sums"], "org/tiny@v2 is neither"),
        (["model.path=org/tiny", "task.train=org/nothing"], "allow the download with task.download=true"),
        (["model.path=org/tiny", "task.train=hf://datasets/org/sums/data/nope.parquet"], "has no data/nope.parquet"),
    ):
        result = CliRunner().invoke(app, ["plan", *BASE, *extra])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and needle in " ".join(result.output.split()), result.output
    # Two subsets' train files (gsm8k's main and socratic): name one, as the message shows.
    from isoflop_cli.hub import data_file

    train = (hub / "datasets--org--sums" / "snapshots" / COMMIT / "data" / "train-00000-of-00001.parquet").read_bytes()
    cached_repo(hub, "dataset", "org/two", {"main/train.parquet": train, "socratic/train.parquet": train})
    with pytest.raises(
        ConfigError, match=r"2 files could be it \(.*task\.train=hf://datasets/org/two/main/train\.parquet"
    ):
        data_file("org/two", "task.train")
    assert data_file("hf://datasets/org/two/socratic", "task.train").parent.name == "socratic"


def test_a_local_path_is_never_taken_for_a_hub_id(tmp_path, monkeypatch):
    from isoflop_cli.hub import hub_id

    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    assert hub_id("org/tiny") is None  # it exists here
    assert hub_id("runs/calibration/easy.parquet") is None and hub_id("./a/b") is None and hub_id("/a/b") is None
    assert hub_id("org/other@v1").revision == "v1" and hub_id("hf://datasets/org/sums@v1/data").path == "data"


def test_result_rows_record_the_checkpoint_isoflop_version_and_commit_and_no_all_null_metric(
    hub, tmp_path, monkeypatch
):
    import re

    from isoflop_cli import grid
    from isoflop_cli.store import CellState, Manifest, SweepDir
    from isoflop_cli.sweep import run_columns

    monkeypatch.chdir(tmp_path)
    cfg = config.load(None, [*BASE, "model.path=org/tiny", "task.train=org/sums"])
    columns = run_columns(next(c for c in grid.expand(cfg) if c.feasible))
    assert (
        columns["model"] == "local" and columns["checkpoint"] == f"org/tiny@{COMMIT}"
    )  # the commit main named in the cache
    assert columns["isoflop_version"] and re.fullmatch(
        r"[0-9a-f]{40}(-dirty)?", columns["isoflop_commit"]
    )  # this checkout's
    assert (
        run_columns(next(c for c in grid.expand(config.load(None, [])) if c.feasible))["checkpoint"]
        == "embedded:tiny-arith"
    )
    # results.parquet: the provenance beside the axes; a metric no run records (kl without a KL term) left out.
    sweep = SweepDir(tmp_path / "sweep")
    sweep.write_manifest(
        Manifest(
            cells={
                "a": CellState(
                    columns={"n": 4, "B_p": 2, **{k: columns[k] for k in ("checkpoint", "isoflop_commit")}}, M=4
                )
            }
        )
    )
    files = sweep.run("a")
    files.dir.mkdir(parents=True)
    for step in (0, 2):
        files.append_metrics(
            {
                "step": step,
                "rollouts": 8 * step,
                "flops_total": 1e9 * step,
                "val_avg@k": 0.5,
                "kl": None,
                "entropy": None,
            }
        )
    files.finish(files.read_metrics(), step=2, M=4)
    sweep.collect()
    df = pd.read_parquet(tmp_path / "sweep" / "results.parquet")
    assert {"checkpoint", "isoflop_commit", "val_avg@k"} <= set(df.columns) and not {"kl", "entropy"} & set(df.columns)
    assert set(df["checkpoint"]) == {f"org/tiny@{COMMIT}"}
