import pytest

from isoflop_cli.tasks.arith import ArithTask, _value


def test_answers_reversed_and_exact():
    task = ArithTask()
    p = task.problem([47, 38], ["+"])
    assert (p.prompt, p.answer) == ("47+38=", "58")
    assert task.verify(p, "58") and not task.verify(p, "85")
    assert ArithTask(reverse_answer=False).problem([47, 38], ["+"]).answer == "85"
    assert ArithTask().problem([3, 9], ["-"]).answer == "-6"
    assert _value([2, 3, 4], ["+", "*"]) == 14 and _value([2, 3, 4], ["*", "-"]) == 2


@pytest.mark.slow  # draws whole splits: ~6 s
def test_splits_disjoint_seeded_and_sized():
    task = ArithTask(digits=(1, 2))
    val = task.validation_set(50)
    assert len(val) == 50 and len({p.prompt for p in val}) == 50
    assert val == task.validation_set(50)
    stream = task.stream("train", seed=0)
    train = {next(stream).prompt for _ in range(2000)}
    assert not train & {p.prompt for p in val}
    one_digit = ArithTask(digits=(1,)).validation_set(1000)
    assert 5 < len(one_digit) < 40  # ~20% of the 100 one-digit sums


@pytest.mark.slow  # draws whole splits: ~6 s
def test_split_sizes_exact_and_drawn():
    import random

    task = ArithTask(digits=(1,))
    s = task.splits()
    assert s.exact and s.total == 100 and s.train + s.val == 100
    assert len(task.validation_set(1000)) == s.val  # every validation problem, and no more
    weighted = ArithTask(digits=(1, 2, 2), ops=("+", "+", "-"))
    rng, draws = random.Random(0), 50_000
    share = sum(weighted.is_validation(weighted.draw(rng)) for _ in range(draws)) / draws
    assert abs(share - weighted.splits().p_val) < 0.01
    big = ArithTask(digits=(4,)).splits()  # 81M problems: expected, not counted
    assert not big.exact and big.val == big.total * 0.2


def test_an_empty_split_stops_the_stream(monkeypatch):
    import pytest

    from isoflop_cli.tasks import arith

    monkeypatch.setattr(arith, "MAX_REJECTS", 10_000)
    task = ArithTask(digits=(1,), val_fraction=0.001)
    assert task.splits().val == 0
    with pytest.raises(arith.EmptySplit, match="the val split"):
        next(task.stream("val", seed=0))
    with pytest.raises(arith.EmptySplit):  # validation_set draws through the same stream
        task.validation_set(5)


def test_warm_start_targets_carry_a_stray_digit_at_the_configured_share():
    """model.build.stray: that share of warm-start answers (in expectation) is followed by one random
    digit before eos, learned like the answer; at 0 the targets are the answers exactly."""
    import random

    from isoflop_cli.recipe.checkpoint import _sft_batch, char_tokenizer

    tok = char_tokenizer()
    stream = ArithTask().stream("train", seed=0)
    problems = [next(stream) for _ in range(2000)]

    def targets(stray: float) -> list[str]:
        _, labels = _sft_batch(tok, problems, random.Random(0), stray)
        return [tok.decode([t for t in row.tolist() if t >= 0], skip_special_tokens=False) for row in labels]

    eos = tok.eos_token
    assert targets(0.0) == [p.answer + eos for p in problems]
    with_stray = targets(0.6)
    extra = [t[len(p.answer) : -len(eos)] for p, t in zip(problems, with_stray)]
    assert all(t.startswith(p.answer) and t.endswith(eos) for p, t in zip(problems, with_stray))
    assert all(e == "" or (len(e) == 1 and e.isdigit()) for e in extra)
    share = sum(e != "" for e in extra) / len(extra)
    assert abs(share - 0.6) < 0.04, share  # 2000 draws: sd 0.011


def test_a_build_of_zero_warm_start_steps_is_the_seeded_initialisation(tmp_path):
    """model.build.steps=0 (a random model, e.g. to size memory) divided by zero in the warm start's
    schedule: it saves the seeded initialisation, weight for weight."""
    import torch
    from omegaconf import OmegaConf
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from isoflop_cli.config.schema import ModelBuildConfig
    from isoflop_cli.recipe.checkpoint import build, char_tokenizer, qwen2_config

    b = OmegaConf.structured(
        ModelBuildConfig(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, steps=0)
    )
    build(b, ArithTask(), tmp_path)
    torch.manual_seed(b.seed)
    init = AutoModelForCausalLM.from_config(qwen2_config(b, char_tokenizer())).state_dict()
    saved = load_file(tmp_path / "model.safetensors")
    assert saved and all(torch.equal(saved[k], init[k]) for k in saved)
