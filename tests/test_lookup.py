"""The lookup study's pool and base model (isoflop_cli/recipe/lookup.py): a seeded table in the
embedded model's characters, read back as a user's problem file, and a warm start that leaves the
keys at different pass rates, problem by problem (what the arithmetic warm start did not: there
every problem sat at one shared rate)."""

import hashlib
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import run_isoflop
from test_embedded import base_scores
from transformers import AutoModelForCausalLM, AutoTokenizer

from isoflop_cli.calibrate import spread
from isoflop_cli.recipe import checkpoint, lookup
from isoflop_cli.recipe.sampler import HFSampler
from isoflop_cli.tasks.arith import ALPHABET
from isoflop_cli.tasks.dataset import read_rows

BASE_AVG = 0.592041015625  # step 0 of `isoflop run --config lookup` on the pool, on one and on two threads
SHA256 = (
    "1a47322bfec5da11dffe214bd6af30933437a43ce3d14f89ab0dac29a722df1d"  # printed by scripts/ship_embedded.py --lookup
)


def test_the_table_is_seeded_distinct_and_written_in_the_models_characters():
    rows = lookup.table(**lookup.TABLE)
    assert rows == lookup.table(**lookup.TABLE) != lookup.table(**{**lookup.TABLE, "seed": 1})
    assert len({p for p, _ in rows}) == lookup.TABLE["keys"]
    assert all(set(p + a) <= set(ALPHABET) for p, a in rows)
    assert {len(p) for p, _ in rows} == {lookup.TABLE["key_digits"] + 1} and {len(a) for _, a in rows} == {
        lookup.TABLE["value_digits"]
    }


def test_the_pool_reads_as_a_problem_file_and_the_model_ships(tmp_path, monkeypatch):
    monkeypatch.setenv("ISOFLOP_CACHE", str(tmp_path / "cache"))  # an empty cache: the shipped model, nothing built
    path = lookup.model_dir()
    lookup.write_pool(tmp_path / "pool.parquet")
    assert path.parent == checkpoint.SHIPPED, (
        "the lookup recipe changed: run scripts/ship_embedded.py --lookup and pin its SHA-256 here"
    )
    assert hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest() == SHA256
    rows = read_rows(str(tmp_path / "pool.parquet"), "task.train", "prompt", "reward_model.ground_truth")
    assert [(r.prompt, r.answer) for r in rows] == lookup.table(**lookup.TABLE)


@pytest.mark.slow
def test_the_warm_start_leaves_keys_from_known_to_rare():
    """16 samples per key of the shipped model: the keys differ far beyond sampling (one shared
    rate rejected, the true rates' sd above 0.15), and both of the study's bands hold keys."""
    rows = lookup.table(**lookup.TABLE)
    path = lookup.model_dir()
    tokenizer, model = (
        AutoTokenizer.from_pretrained(path, padding_side="left"),
        AutoModelForCausalLM.from_pretrained(path).eval(),
    )
    sampler = HFSampler(model, tokenizer)
    torch.manual_seed(0)
    rates = []
    for i in range(0, len(rows), 128):
        batch = rows[i : i + 128]
        texts = sampler.sample([p for p, _ in batch], 16, 1.0, 1.0, 5).texts
        rates += [sum(t == a for t in texts[j * 16 : (j + 1) * 16]) / 16 for j, (_, a) in enumerate(batch)]
    rates = pd.Series(rates)
    s = spread(rates, pd.Series([16] * len(rates)))
    assert not s.shared and s.difficulty_sd > 0.15
    assert rates.between(0.3, 0.6).sum() >= 25 and rates.between(0.0625, 0.125).sum() >= 25  # calibrate cut 50 and 38


@pytest.mark.slow
def test_the_base_score_is_the_same_on_one_and_two_threads(tmp_path):
    """`make sweep` on two machines with different thread counts, emulated: step 0's validation
    avg@k of the shipped lookup model over the whole pool (512 keys, 16 samples each) is pinned."""
    lookup.write_pool(pool := tmp_path / "pool.parquet")
    scores = base_scores(
        tmp_path, "--config", "lookup", f"model.path={lookup.model_dir()}", f"task.train={pool}", f"task.val={pool}"
    )
    assert scores[0] == scores[1] == pytest.approx(BASE_AVG, abs=1e-6), scores


def calibrated_hard_set(tmp_path: Path, ray_address: str) -> tuple[Path, pd.Series, list[str]]:
    """`isoflop calibrate` on the lookup pool through a Ray job, checked (a rerun samples nothing
    twice; every key in the hard band, the study's 38): the hard set's file, its keys, and the
    options a sweep on it shares."""
    from isoflop_cli import config

    lookup.write_pool(pool := tmp_path / "pool.parquet")
    model, on_pool = f"model.path={lookup.model_dir()}", [f"task.train={pool}", f"task.val={pool}"]
    cfg = config.load("lookup", [model, *on_pool])
    low, high = cfg.calibrate.hard  # sweeps/lookup.yaml's band: one or two successes in 16
    common = ["--config", "lookup", "--root", str(tmp_path), model, f"cluster.address={ray_address}"]
    # One slice, as the study's: the slice's start seeds its sampling, so other slices cut other sets.
    calibrate = ["calibrate", *common, *on_pool, "name=calibration", "eval.problems=8"]
    calibrated = run_isoflop(*calibrate)
    assert calibrated.returncode == 0, calibrated.stdout + calibrated.stderr
    out = tmp_path / "calibration"
    df = pd.read_parquet(out / "calibration.parquet")
    samples = cfg.calibrate.samples
    assert list(df["problem_id"]) == list(range(lookup.TABLE["keys"])) and (df["samples"] == samples).all()
    assert (
        set((df["pass_rate"] * samples).round(9)) <= set(range(samples + 1)) and (df["mean_response_tokens"] > 0).all()
    )
    slices = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*/calibration.parquet")}
    assert len(slices) == 1
    again = run_isoflop(*calibrate)
    assert again.returncode == 0 and {p: p.stat().st_mtime_ns for p in slices} == slices, (
        again.stdout + again.stderr
    )  # nothing sampled twice
    rates = df.set_index("prompt")["pass_rate"]
    hard = out / "hard.parquet"
    keys = pd.read_parquet(hard)["prompt"]
    assert len(keys) == 38 and rates[keys].between(low, high).all()
    assert set(keys) == set(rates[rates.between(low, high)].index)  # the band's keys, all of them
    return hard, keys, common


@pytest.mark.e2e
def test_calibrate_cuts_the_study_hard_set_in_a_ray_job_and_samples_nothing_twice(tmp_path, ray_address):
    """`isoflop calibrate` end to end, as the study runs it: the shipped model's hard set of the pool
    (a Ray job; a rerun samples nothing twice; every key in its band, the study's 38). The sweep on
    that set, the study's claim, is `study` below (`make study`)."""
    calibrated_hard_set(tmp_path, ray_address)


@pytest.mark.e2e
@pytest.mark.study
def test_on_the_calibrated_hard_set_every_seed_of_n16_ends_above_every_seed_of_n2(tmp_path, ray_address):
    """The study's hard-set claim, cut down to n = 2 and 16, seeds 0 and 1, and its largest budget:
    `isoflop calibrate` cuts the shipped model's hard set (checked as in the test above), and at
    32,768 rollouts on that set the lower seed of n = 16 scores above the higher seed of n = 2.
    Measured in the study: 0.969 and 0.972 against 0.893 and 0.919; its n = 2 gains 0.015 over the
    last doubling of compute, n = 16 0.027 (docs/default-study.md). Minutes of training: `make
    study` runs it, not `make test`."""
    hard, keys, common = calibrated_hard_set(tmp_path, ray_address)

    # The sweep trains on the set calibrate wrote.
    swept = run_isoflop(
        "sweep",
        *common,
        f"task.train={hard}",
        f"task.val={hard}",
        "name=hard",
        f"eval.problems={len(keys)}",
        "grid.n=[2,16]",
        "grid.seed=[0,1]",
        "grid.budgets=[32768]",
        "grid.eval_points=1",
    )
    assert swept.returncode == 0, swept.stdout + swept.stderr
    df = pd.read_parquet(tmp_path / "hard" / "results.parquet")
    last = df[df["rollouts"] == 32768].groupby("n")["val_avg@k"]
    assert last.count().to_dict() == {2: 2, 16: 2}
    assert last.min()[16] > last.max()[2], last.apply(list).to_dict()
