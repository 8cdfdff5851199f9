"""The engine around the recipe: samplers and their contract, data-parallel FSDP2 learners,
checkpoints and resume, and the switches that keep GPU-only paths off a CPU machine."""

import copy
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from typer.testing import CliRunner

from isoflop_cli.cli import app

SMALL = ["n=4", "B_p=2", "eval.problems=8", "eval.samples=4"]
PROMPTS = ["12+34=", "5+6=", "71+9="]


@pytest.fixture(scope="module")
def tiny():
    from isoflop_cli import config
    from isoflop_cli.recipe.checkpoint import load

    cfg = config.load()
    tokenizer, model = load(cfg.model, cfg.task)
    return tokenizer, model.eval()


@pytest.mark.slow
def test_shared_prefill_samples_the_same_and_its_logprobs_are_the_learners(tiny):
    from isoflop_cli.recipe.learner import Actor, Layout
    from isoflop_cli.recipe.sampler import HFSampler

    tokenizer, model = tiny
    out = {}
    for shared in (False, True):
        torch.manual_seed(0)
        out[shared] = HFSampler(model, tokenizer, shared_prefill=shared).sample(PROMPTS, 8, 0.6, 1.0, 6)
    assert out[True].prefill_rows == 3 and out[False].prefill_rows == 24
    assert torch.equal(out[True].sequences, out[False].sequences) and out[True].texts == out[False].texts
    r = out[True]
    with torch.no_grad():
        learner = Actor(model)(Layout.plain(r.sequences, r.attention_mask, r.prompt_width), 0.6).logp
    on = r.completion_mask[:, 1:].bool()
    assert (learner - r.logprobs)[on].abs().max() < 1e-4  # what truncated IS corrects is numerical noise here
    assert torch.equal(r.logprobs[~on], torch.zeros_like(r.logprobs[~on]))


@pytest.mark.slow
@pytest.mark.parametrize("shared, top_p", [(True, 1.0), (False, 1.0), (True, 0.8)])
def test_the_decode_loop_draws_what_generate_draws_until_rows_leave(tiny, shared, top_p):
    """Same seed, same tokens as `generate` with do_sample, top_k=0 and that top_p, up to the step
    where the first row says eos: the loop is `generate`'s sampling, not a different sampler. From
    there it runs fewer rows (the finished ones leave the batch), so the draws part; that the KV
    cache stays aligned after rows leave is the learner's log-probs matching the sampler's
    (test_shared_prefill_samples_the_same...). Top-p 0.8 at T = 1.5 cuts the nucleus on most steps."""
    from isoflop_cli.recipe.sampler import HFSampler

    tokenizer, model = tiny
    torch.manual_seed(2)
    ours = HFSampler(model, tokenizer, shared_prefill=shared).sample(PROMPTS, 8, 1.5, top_p, 6)
    enc = tokenizer(PROMPTS, padding=True, return_tensors="pt")
    torch.manual_seed(2)
    theirs = model.generate(
        input_ids=enc.input_ids.repeat_interleave(8, 0),
        attention_mask=enc.attention_mask.repeat_interleave(8, 0),
        do_sample=True,
        temperature=1.5,
        top_p=top_p,
        top_k=0,
        max_new_tokens=6,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    width = ours.prompt_width
    said_eos = (ours.sequences[:, width:] == tokenizer.eos_token_id).any(0).nonzero()
    first = int(said_eos[0]) if len(said_eos) else 6  # the first step at which a row finished
    assert 0 < first < ours.generated_width - 1  # rows left the batch, and later steps ran without them
    assert torch.equal(ours.sequences[:, : width + first + 1], theirs[:, : width + first + 1])
    assert len(set(ours.texts)) > 3  # the draws differ across rows: sampling, not greedy
    assert ours.decode_rows[first] < 24  # fewer rows in the decode step after the first eos


@pytest.mark.slow
def test_pack_gives_the_hf_samplers_layout(tiny):
    """The vLLM adapter returns token lists; `pack` must lay them out exactly as the HF sampler does."""
    from isoflop_cli.recipe.rollouts import pack
    from isoflop_cli.recipe.sampler import HFSampler

    tokenizer, model = tiny
    torch.manual_seed(1)
    r = HFSampler(model, tokenizer).sample(PROMPTS, 4, 1.0, 1.0, 6)
    width = r.prompt_width
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    completions = [row[width:][m[width:].bool()].tolist() for row, m in zip(r.sequences, r.completion_mask)]
    logprobs = [lp[width - 1 :][m[width:].bool()].tolist() for lp, m in zip(r.logprobs, r.completion_mask)]
    packed = pack(prompts, completions, logprobs, 4, tokenizer)
    for field in ("sequences", "attention_mask", "completion_mask", "logprobs"):
        assert torch.equal(getattr(packed, field), getattr(r, field)), field
    assert (packed.texts, packed.prompt_width, packed.prefill_rows) == (r.texts, r.prompt_width, r.prefill_rows)


@pytest.mark.slow
def test_sampler_copy_follows_load_weights(tiny):
    from isoflop_cli.recipe.sampler import HFSampler

    tokenizer, model = tiny
    sampler = HFSampler(model, tokenizer, own_copy=True)
    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():  # tied embeddings and head stay one tensor
            p.add_(0.01 * torch.randn_like(p))
    changed = other.state_dict()
    assert not torch.equal(sampler.model.state_dict()["lm_head.weight"], changed["lm_head.weight"])
    sampler.load_weights(changed.items())
    assert all(torch.equal(sampler.model.state_dict()[k], v) for k, v in changed.items())


def test_engine_switches_fail_with_clear_errors():
    runner = CliRunner()
    cases = {
        ("learner.bf16=true",): "learner.bf16 is GPU-only",
        ("learner.world_size=4", "cluster.gpus_per_run=2"): "needs a GPU each",
        ("algo.tis_cap=0.5",): "algo.tis_cap must be >= 1",
        ("learner.fsdp=false", "learner.world_size=2"): "run through FSDP2",
        ("sampler=nope",): "available: hf, vllm",
    }
    for overrides, message in cases.items():
        result = runner.invoke(app, ["plan", *overrides])
        assert result.exit_code == 2 and message in result.output, (overrides, result.output)
    if importlib_spec("vllm") is None:  # `plan` plans a vLLM sweep without vLLM; what starts runs needs it
        assert runner.invoke(app, ["plan", "sampler=vllm"]).exit_code == 0
        for overrides, message in {
            ("sampler=vllm",): "make setup-vllm",
            ("sampler=vllm", f"cluster.python={sys.executable}"): "needs vLLM in cluster.python",
        }.items():
            result = runner.invoke(app, ["run", *overrides])
            assert result.exit_code == 2 and message in result.output, (overrides, result.output)


def test_vllm_sampler_without_vllm_says_how_to_get_it():
    if importlib_spec("vllm") is not None:
        pytest.skip("vLLM is installed here")
    from omegaconf import OmegaConf

    from isoflop_cli.config.schema import SweepConfig
    from isoflop_cli.recipe.vllm_sampler import VllmSampler

    cfg = OmegaConf.structured(SweepConfig)
    with pytest.raises(RuntimeError, match=r"make setup-vllm"):
        VllmSampler("/nowhere", cfg.sampler, cfg.lora, tokenizer=None, seed=0, max_len=32)


def importlib_spec(name):
    import importlib.util

    return importlib.util.find_spec(name)


def metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [
        {k: v for k, v in r.items() if k != "wall_s" and k != "reward_cpu_s" and not k.startswith("time_")}
        for r in rows
    ]


@pytest.mark.slow
def test_two_fsdp_ranks_give_the_losses_of_one_process(tmp_path):
    """learner.world_size=2 (two processes, gloo, FSDP2) against one: the first 3 steps' losses
    within 1e-4, with a reference (KL), an entropy bonus and two mini-batches per step. The two
    ranks compute log-probs and entropies 5 tokens at a time (a rank's micro-batch: one group, 4
    completions of up to 6 tokens), so each chunk's logits are recomputed in backward from the
    head FSDP2 gathers (tied embeddings)."""
    args = [
        *SMALL,
        "B_p=4",
        "grid.budgets=[16,32,48]",
        "grid.eval_points=1",
        "algo.kl_coef=0.1",
        "algo.entropy_coef=0.01",
        "algo.minibatches=2",
    ]
    for ws, chunk in ((1, 2048), (2, 5)):
        result = CliRunner().invoke(
            app,
            [
                "run",
                *args,
                f"learner.world_size={ws}",
                f"learner.logit_chunk_tokens={chunk}",
                "--run-dir",
                str(tmp_path / f"ws{ws}"),
            ],
        )
        assert result.exit_code == 0, result.output
    one, two = metrics(tmp_path / "ws1"), metrics(tmp_path / "ws2")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 3]
    for a, b in zip(one[1:], two[1:]):
        for key in ("train_loss", "kl", "entropy", "clip_frac", "tis"):
            assert abs(a[key] - b[key]) < 1e-4, (a["step"], key, a[key], b[key])
        assert abs(a["entropy"]) > 0.05  # the compared losses are not all near zero
        same = (
            "val_avg@k",
            "flops_search",
            "flops_learning",
            "tokens_generated",
        )  # the prompt tree runs under FSDP too
        assert [a[k] for k in same] == [b[k] for k in same]


def status_step(run_dir) -> int:
    try:
        return json.loads((run_dir / "status.json").read_text()).get("step", 0)
    except (OSError, json.JSONDecodeError):
        return 0


@pytest.fixture
def one_thread(monkeypatch):
    """OMP_NUM_THREADS=1 for this test's runs, its own processes' and those it runs in this one (a run
    reads it into torch's thread count): the same float reductions in either. This process's thread
    count is given back after the test."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yield
    torch.set_num_threads(threads)


def run_here(*args: str):
    """`isoflop run` in this process (Typer's runner): a reference run, or a rerun whose process
    proves nothing a subprocess would not, without one more interpreter importing torch."""
    result = CliRunner().invoke(app, ["run", *args])
    assert result.exit_code == 0, result.output
    return result


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint_as_if_never_stopped(tmp_path, one_thread):
    """SIGKILL a run mid-run (PPO: a value head, and a LoRA adapter: state beyond the policy's
    weights), rerun it: it resumes from its checkpoint, records what one uninterrupted run records,
    and keeps no training state once finished. The takeover test below resumes the other shapes (one
    process, two FSDP ranks) from an attempt frozen at an arbitrary point, which leaves its files as a
    kill would."""
    args = [
        *SMALL,
        "grid.budgets=[64]",  # 8 steps, a checkpoint every 2: stopped at step 3 to 7, after one, short of the end
        "grid.eval_points=4",
        "checkpoint.every=2",
        "algo.kl_coef=0.01",
        "algo=ppo",
        "lora.rank=4",
        "algo.epochs=2",
    ]
    command = [sys.executable, "-m", "isoflop_cli", "run", *args, "--run-dir"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    run_here(*args, "--run-dir", str(whole))  # the uninterrupted run; only the killed one needs a process

    proc = subprocess.Popen(
        [*command, str(killed)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.time() + 300
    while status_step(killed) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 3 <= status_step(killed) < 8, "the run was not killed between its checkpoint and its end"
    assert (killed / "checkpoint" / "run_state.pt").exists()

    resumed = run_here(*args, "--run-dir", str(killed))
    assert "resumed from the checkpoint at step" in resumed.stdout
    assert metrics(killed) == metrics(whole)
    assert not (killed / "checkpoint").exists()  # a finished run keeps no training state


@pytest.mark.slow
@pytest.mark.parametrize("variant", [[], ["learner.world_size=2"]], ids=["one-process", "fsdp-2-ranks"])
def test_an_attempt_taken_over_stops_without_writing_and_the_run_is_one_uninterrupted_run(
    tmp_path, variant, one_thread
):
    """A run's processes frozen mid-run (SIGSTOP: a node cut off, as the sweep sees it) while a new
    attempt takes its directory over, resumes from the checkpoint and finishes; then the old one
    wakes. It stops at its first write with one line, writes nothing, and the run's rows, status
    and checkpoint are the new attempt's: one uninterrupted run's. With two ranks, rank 0's refusal
    reaches the run's process wrapped by torch.multiprocessing and is still read as a takeover."""
    args = [
        *SMALL,
        "grid.budgets=[64]",  # 8 steps, a checkpoint every 2: stopped at step 3 to 7, after one, short of the end
        "grid.eval_points=4",
        "checkpoint.every=2",
        "checkpoint.keep_final=true",
        "algo.kl_coef=0.01",
        *variant,
    ]
    command = [sys.executable, "-m", "isoflop_cli", "run", *args, "--run-dir"]
    whole, run_dir = tmp_path / "whole", tmp_path / "run"
    # The uninterrupted run, in this process. The two attempts are processes: one is frozen, and the
    # other's exit shows what a rank's progress bar would leave (a leaked semaphore).
    run_here(*args, "--run-dir", str(whole))

    old = subprocess.Popen(
        [*command, str(run_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while status_step(run_dir) < 3 and time.time() < deadline and old.poll() is None:
        time.sleep(0.02)
    os.killpg(old.pid, signal.SIGSTOP)
    try:
        frozen_at = status_step(run_dir)
        assert 3 <= frozen_at < 8 and (run_dir / "checkpoint" / "run_state.pt").exists()
        new = subprocess.run([*command, str(run_dir)], capture_output=True, text=True, timeout=600)
        assert new.returncode == 0, new.stdout + new.stderr
        assert "resumed from the checkpoint at step" in new.stdout
        # No progress bar in a run's log, and (two ranks) no semaphore a rank's bar left behind.
        assert "Loading weights" not in new.stdout + new.stderr and "leaked semaphore" not in new.stderr, new.stderr
        sealed = {name: (run_dir / name).read_bytes() for name in ("metrics.jsonl", "status.json", "problems.jsonl")}
        state = (run_dir / "checkpoint" / "run_state.pt").read_bytes()
    finally:
        os.killpg(old.pid, signal.SIGCONT)
    out, err = old.communicate(timeout=300)
    assert old.returncode == 1 and "another attempt" in err and "stops without writing more" in err, out + err
    assert "Traceback" not in err, err
    assert {name: (run_dir / name).read_bytes() for name in sealed} == sealed
    assert (run_dir / "checkpoint" / "run_state.pt").read_bytes() == state
    assert not list(tmp_path.glob("run/checkpoint.tmp*"))
    assert metrics(run_dir) == metrics(whole)
    assert all(abs(r["tis"] - 1) < 1e-3 for r in metrics(whole)[1:])  # sampler and learner score a token alike
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"


@pytest.mark.slow
def test_changed_config_neither_resumes_from_nor_overwrites_another_runs_records(tmp_path):
    """A run dir holding a killed run of another config (here another seed) is neither resumed from
    nor started over: its records and checkpoint prove they are another run's, so `run` refuses in
    one line (exit 2), naming how to run this cell, and leaves every byte (issue 46: before, it
    started over and erased them)."""
    args = [*SMALL, "grid.budgets=[64]", "grid.eval_points=2", "checkpoint.every=2"]
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "isoflop_cli", "run", *args, "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    while status_step(run_dir) < 3 and proc.poll() is None:
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = {
        p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "lease.json"
    }
    result = CliRunner().invoke(app, ["run", *args, "seed=1", "--run-dir", str(run_dir)])  # the refusal, in-process
    assert result.exit_code == 2 and "resumed" not in result.stdout and "aside" in result.stderr, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert {
        p.relative_to(run_dir): p.read_bytes() for p in run_dir.rglob("*") if p.is_file() and p.name != "lease.json"
    } == before


def test_a_save_after_a_swap_killed_in_its_clean_up_keeps_the_newest_state(tmp_path):
    """A kill between a save's swap and its removal of `checkpoint.old` leaves that directory (whole
    or half deleted); the next save must replace it, and a load must read the newest state."""
    from isoflop_cli.recipe import resume
    from isoflop_cli.recipe.distributed import Group

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    directory = tmp_path / "checkpoint"
    resume.save(directory, Group(), "run", model, optimizer, scheduler, {"step": 1})
    leftover = tmp_path / "checkpoint.old"
    leftover.mkdir()
    (leftover / "half-deleted").write_text("x")
    resume.save(directory, Group(), "run", model, optimizer, scheduler, {"step": 2})
    assert not leftover.exists()
    assert resume.load(directory, "run", model, optimizer, scheduler) == {"step": 2}


def test_a_checkpoint_of_another_computation_is_a_fresh_start_said_in_one_line(tmp_path, capsys):
    """A whole checkpoint whose fingerprint is not this run's (a copied run dir; one written before
    the fingerprint's current form) is not loaded: one line, then step 0."""
    from isoflop_cli.recipe import resume
    from isoflop_cli.recipe.distributed import Group

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    directory = tmp_path / "checkpoint"
    resume.save(directory, Group(), "a" * 40, model, optimizer, scheduler, {"step": 3})
    before = [p.detach().clone() for p in model.parameters()]
    torch.nn.init.zeros_(model.weight)
    assert resume.load(directory, "b" * 40, model, optimizer, scheduler) is None
    assert (
        "holds another computation's state (fingerprint aaaaaaaaaaaa, this run's bbbbbbbbbbbb)"
        in capsys.readouterr().out
    )
    assert not torch.equal(model.weight, before[0]) and directory.is_dir()  # nothing restored, nothing removed


@pytest.mark.slow
def test_micro_batches_accumulate_to_the_whole_batch_update(tmp_path):
    """learner.micro_batch splits each mini-batch's forward/backward; the update must not change."""
    args = [*SMALL, "grid.budgets=[8,16,24]", "grid.eval_points=1", "algo=ppo", "algo.kl_coef=0.1"]
    for micro in (0, 3):
        result = CliRunner().invoke(
            app, ["run", *args, f"learner.micro_batch={micro}", "--run-dir", str(tmp_path / f"m{micro}")]
        )
        assert result.exit_code == 0, result.output
    whole, split = metrics(tmp_path / "m0"), metrics(tmp_path / "m3")
    for a, b in zip(whole[1:], split[1:]):
        for key in ("train_loss", "kl", "value_loss", "clip_frac", "tis"):
            assert abs(a[key] - b[key]) < 1e-5, (a["step"], key, a[key], b[key])
        assert a["val_avg@k"] == b["val_avg@k"]


@pytest.mark.slow
def test_shared_prompt_in_learning_changes_the_cost_not_the_update(tmp_path):
    """learner.shared_prompt lays each prompt group out as one sequence in the learning passes:
    the same losses and evaluations as plain rows (with activation checkpointing too), fewer
    learning FLOPs."""
    args = [*SMALL, "grid.budgets=[8,16,24]", "grid.eval_points=1", "algo.kl_coef=0.1", "algo.epochs=2"]
    variants = {
        "tree": ["learner.shared_prompt=true"],
        "plain": ["learner.shared_prompt=false"],
        "tree-checkpointed": ["learner.shared_prompt=true", "learner.activation_checkpointing=true"],
    }
    for name, overrides in variants.items():
        result = CliRunner().invoke(app, ["run", *args, *overrides, "--run-dir", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    plain = metrics(tmp_path / "plain")
    for name in ("tree", "tree-checkpointed"):
        for a, b in zip(metrics(tmp_path / name)[1:], plain[1:]):
            for key in ("train_loss", "kl", "clip_frac", "tis"):
                assert abs(a[key] - b[key]) < 1e-4, (name, a["step"], key, a[key], b[key])
            assert a["val_avg@k"] == b["val_avg@k"] and a["flops_search"] == b["flops_search"]
            assert a["flops_learning"] < b["flops_learning"]
