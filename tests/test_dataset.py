"""Tasks from data files (`task=dataset`): the three formats, answer checking (math-verify, exact,
choice), chat prompts through a real BPE tokenizer, bad rows refused up front, and runs that train
on a file with the embedded model and with a Qwen2 checkpoint built here."""

import json
import random
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pytest
from typer.testing import CliRunner

from isoflop_cli.cli import app
from isoflop_cli.errors import ConfigError
from isoflop_cli.tasks.dataset import DatasetTask, read_rows
from isoflop_cli.tasks.verifiers import MathVerifier, choice, exact

PROBLEMS = [
    (a, b) for a in range(10) for b in range(40)
]  # 400 sums, answers reversed as the embedded model writes them


def arith_rows():
    return [
        {
            "prompt": [{"role": "user", "content": f"{a}+{b}="}],
            "reward_model": {"ground_truth": str(a + b)[::-1], "style": "rule"},
            "data_source": "sums",
            "extra_info": {"index": i},
        }
        for i, (a, b) in enumerate(PROBLEMS)
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same problems as verl parquet (chat prompts, nested answer), JSONL with its own keys, and
    a datasets save_to_disk directory."""
    import datasets

    d = tmp_path_factory.mktemp("data")
    rows = arith_rows()
    pd.DataFrame(rows).to_parquet(d / "train.parquet")
    with (d / "train.jsonl").open("w") as f:
        for r in rows:
            f.write(
                json.dumps(
                    {"question": r["prompt"][0]["content"], "meta": {"answer": r["reward_model"]["ground_truth"]}}
                )
                + "\n"
            )
    datasets.Dataset.from_list(rows).save_to_disk(str(d / "train_ds"))
    return d


def test_three_formats_read_alike_and_split_by_prompt(files):
    parquet = read_rows(str(files / "train.parquet"), "task.train", "prompt", "reward_model.ground_truth")
    jsonl = read_rows(str(files / "train.jsonl"), "task.train", "question", "meta.answer")
    on_disk = read_rows(str(files / "train_ds"), "task.train", "prompt", "reward_model.ground_truth")
    assert (
        [(r.text(), r.answer) for r in parquet]
        == [(r.text(), r.answer) for r in jsonl]
        == [(r.text(), r.answer) for r in on_disk]
    )
    assert (
        parquet[0].prompt == (("user", "0+0="),)
        and jsonl[0].prompt == "0+0="
        and parquet[57].answer == str(1 + 17)[::-1]
    )
    # The held-out share is a hash of each prompt: the same problems whatever the row order.
    task = DatasetTask(train=str(files / "train.parquet"), val_fraction=0.25)
    held = {r.text() for r in task.rows_of["val"]}
    assert 0.15 < len(held) / len(PROBLEMS) < 0.35 and not held & {r.text() for r in task.rows_of["train"]}
    shuffled = arith_rows()
    random.Random(0).shuffle(shuffled)
    pd.DataFrame(shuffled).to_parquet(files / "shuffled.parquet")
    assert {
        r.text() for r in DatasetTask(train=str(files / "shuffled.parquet"), val_fraction=0.25).rows_of["val"]
    } == held


MATH = [  # reference, completion, (parsed, correct)
    ("\\frac{1}{2}", "so the answer is \\boxed{0.5}", (True, True)),
    ("0.5", "we get $\\frac{1}{2}$", (True, True)),
    ("(1,2]", "The interval is \\boxed{(1, 2]}.", (True, True)),
    ("\\{1,2\\}", "\\boxed{\\{2,1\\}}", (True, True)),
    ("x^2+1", "\\boxed{1+x^2}", (True, True)),
    ("3", "First 4, then: \\boxed{3}", (True, True)),  # the boxed answer, not the first number
    ("3", "the result is 4", (True, False)),
    ("\\boxed{42}", "\\boxed{41}", (True, False)),  # a reference may carry its own \boxed{}
    ("7", "I do not know", (False, False)),
]


def test_math_verifier_equivalences_also_from_a_worker_thread():
    verify = MathVerifier()
    try:
        answers, completions, expected = zip(*MATH)
        direct = verify(list(answers), list(completions))
        assert [(v.parsed, v.correct) for v in direct] == list(expected)
        # math-verify's own timeout needs a main thread: ours checks in a process of its own.
        with ThreadPoolExecutor(1) as pool:
            threaded = pool.submit(verify, list(answers), list(completions)).result()
        assert threaded == direct
        assert verify.cpu_s > 0
    finally:
        verify.close()


def test_math_verifier_replaces_a_worker_that_dies():
    verify = MathVerifier()
    try:
        assert verify(["2"], ["\\boxed{2}"])[0].correct
        verify._proc.kill()
        verify._proc.join()
        assert verify(["2"], ["\\boxed{2}"])[0].correct  # a new worker answers
    finally:
        verify.close()


def test_exact_and_choice_verifiers():
    got = exact(["Paris", "12", "x"], ["  paris. ", "It is \\boxed{12}", ""])
    assert [(v.parsed, v.correct) for v in got] == [(True, True), (True, True), (False, False)]
    got = choice(
        ["B", "(C)", "A", "D"], ["The answer is (B).", "\\boxed{C}", "I pick B, not A... final: A", "no letter here"]
    )
    assert [(v.parsed, v.correct) for v in got] == [(True, True), (True, True), (True, True), (False, False)]


# --- chat prompts through a real tokenizer ---------------------------------------------------------

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A Qwen2-architecture checkpoint with a byte-level BPE tokenizer trained here on generated
    text, and a chat template: the path a real local checkpoint takes, small and random."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config

    out = tmp_path_factory.mktemp("chat-model")
    rng = random.Random(0)
    corpus = [
        f"What is {rng.randint(0, 99)} + {rng.randint(0, 99)}? Put the final answer within \\boxed{{}}. "
        f"The answer is \\boxed{{{rng.randint(0, 200)}}} and \\frac{{1}}{{2}} = 0.5"
        for _ in range(2000)
    ]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=512,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.pad_token_id,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def math_file(tmp_path_factory):
    rng = random.Random(1)
    rows = []
    for i in range(120):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        words = " and then some more words" * (i % 7 == 0) * 20  # every 7th prompt is long
        rows.append(
            {
                "prompt": [{"role": "user", "content": f"What is {a} + {b}?{words}"}],
                "reward_model": {"ground_truth": str(a + b)},
            }
        )
    path = tmp_path_factory.mktemp("math") / "math.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_chat_template_system_prompt_instruction_and_long_prompts_dropped(chat_model, math_file):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(chat_model)
    task = DatasetTask(
        train=str(math_file),
        val_fraction=0.25,
        prompt_limit=60,
        system_prompt="Be brief.",
        instruction="Put the final answer within \\boxed{}.",
    )
    task.prepare(tok)
    p = task.validation_set(1)[0]
    assert p.prompt.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is ")
    assert p.prompt.endswith("\nPut the final answer within \\boxed{}.<|im_end|>\n<|im_start|>assistant\n")
    # Dropped: exactly the prompts whose tokens exceed the limit, counted per split.
    for split, rows in task.rows_of.items():
        lengths = [len(tok(task._render(r, tok)).input_ids) for r in rows]
        assert task.dropped[split] == sum(n > 60 for n in lengths) > 0
    kept = [next(task.stream("train", seed=3)) for _ in range(200)]
    assert all(len(tok(q.prompt).input_ids) <= 60 for q in kept)
    plain = DatasetTask(train=str(math_file), val_fraction=0.25, chat_template="none", instruction="Answer:")
    plain.prepare(tok)
    assert (
        plain.validation_set(1)[0].prompt.startswith("What is ")
        and "<|im_start|>" not in plain.validation_set(1)[0].prompt
    )


def test_streams_are_seeded_epochs():
    task = DatasetTask.__new__(DatasetTask)
    from isoflop_cli.tasks import Problem

    task._problems = {"train": [Problem(prompt=str(i), answer="0") for i in range(10)]}
    first = [p.prompt for p, _ in zip(task.stream("train", 0), range(20))]
    assert (
        sorted(first[:10]) == sorted(first[10:]) == sorted(map(str, range(10)))
    )  # each epoch holds every problem once
    assert (
        first
        == [p.prompt for p, _ in zip(task.stream("train", 0), range(20))]
        != [p.prompt for p, _ in zip(task.stream("train", 1), range(20))]
    )


# --- bad input: one line naming the file and the row, exit 2, nothing run ----------------------------


def _bad(tmp_path, name, rows=None, raw=None):
    path = tmp_path / name
    if raw is not None:
        path.write_bytes(raw)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        pd.DataFrame(rows).to_parquet(path)
    return path


GOOD = {"prompt": "1+2=", "reward_model": {"ground_truth": "3"}}
BAD = {
    "missing answer key": (
        "t.jsonl",
        [GOOD, {"prompt": "1+1="}],
        None,
        "t.jsonl row 1: no 'reward_model.ground_truth'",
    ),
    "empty answer": (
        "t.jsonl",
        [GOOD, GOOD, {"prompt": "1+1=", "reward_model": {"ground_truth": " "}}],
        None,
        "row 2: 'reward_model.ground_truth' is empty",
    ),
    "prompt of the wrong type": (
        "t.jsonl",
        [{"prompt": 12, "reward_model": {"ground_truth": "3"}}],
        None,
        "row 0: 'prompt' must be a string or a list of chat messages",
    ),
    "malformed chat message": (
        "t.jsonl",
        [{"prompt": [{"role": "user"}], "reward_model": {"ground_truth": "3"}}],
        None,
        "row 0: 'prompt' must be a string or a list of chat messages",
    ),
    "a line that is not JSON": (
        "t.jsonl",
        None,
        b'{"prompt": "1+2=", "reward_model": {"ground_truth": "3"}}\n{oops\n',
        "t.jsonl line 2: not JSON",
    ),
    "unreadable parquet": ("t.parquet", None, b"this is not parquet", "t.parquet cannot be read"),
    "unknown format": ("t.csv", None, b"prompt,answer\n", "give a .parquet file, a .jsonl file"),
    "a character the embedded model cannot read": (
        "t.jsonl",
        [GOOD, {"prompt": "one+two=", "reward_model": {"ground_truth": "3"}}],
        None,
        "row 1: 'e' is not a character the embedded model reads",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_data_is_one_error_naming_file_and_row(tmp_path, case):
    name, rows, raw, message = BAD[case]
    path = _bad(tmp_path, name, rows, raw)
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "task=dataset",
            f"task.train={path}",
            "task.max_new_tokens=6",
            "task.max_prompt_tokens=8",
            "task.val_fraction=0.5",
            "eval.problems=1",
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split()), result.output


def test_missing_file_unknown_verifier_and_rewards_the_task_cannot_give(tmp_path):
    base = ["plan", "task=dataset", "task.max_new_tokens=6", "task.max_prompt_tokens=8", "eval.problems=1"]
    path = _bad(
        tmp_path, "t.jsonl", [{"prompt": f"{i}+2=", "reward_model": {"ground_truth": str(i + 2)}} for i in range(40)]
    )
    for extra, message in (
        ([f"task.train={tmp_path / 'nope.parquet'}"], "nope.parquet does not exist"),
        ([f"task.train={path}", "task.verifier=fuzzy"], "task.verifier 'fuzzy' is not one of: math, exact, choice"),
        ([f"task.train={path}", "reward=dense"], "reward dense gives partial credit"),
        ([f"task.train={path}", "reward=prm_proxy"], "reward prm_proxy scores steps"),
        (
            [f"task.train={path}", "task.val_fraction=0.5", "eval.problems=50"],
            "eval.problems=50 exceeds the validation problems",
        ),
    ):
        result = CliRunner().invoke(app, [*base, *extra])
        assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output


# --- runs -------------------------------------------------------------------------------------------

RUN = ["n=4", "B_p=4", "grid.budgets=[48]", "grid.eval_points=2", "eval.problems=16", "eval.samples=4", "task=dataset"]


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_embedded_model_trains_on_a_file_of_sums(tmp_path, files):
    """The arithmetic the embedded model was warm-started on, given as verl parquet and checked by
    math-verify: the model solves some of it from the start, as it does its own task."""
    result = CliRunner().invoke(
        app,
        [
            "run",
            *RUN,
            f"task.train={files / 'train.parquet'}",
            "task.max_new_tokens=6",
            "task.max_prompt_tokens=8",
            "--run-dir",
            str(tmp_path),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path)
    assert [r["rollouts"] for r in rows] == [0, 16, 48] and rows[-1]["prompts_dropped"] == 0
    # The verifier reads the model's answers (some validation answers are right: 3 to 4 of 64 by
    # the warm start; training rewards are scored, at a few percent on this split).
    assert rows[0]["val_avg@k"] > 0 and all(0 <= r["train_reward_mean"] < 0.5 for r in rows[1:])
    assert rows[-1]["reward_cpu_s"] > 0  # checking in the verifier's own process is counted


@pytest.mark.slow
def test_chat_checkpoint_trains_with_math_verify_and_a_custom_reward(tmp_path, chat_model, math_file, monkeypatch):
    """A Qwen2 checkpoint with a BPE tokenizer and chat template, on chat prompts (long ones dropped):
    the whole run path, then the same with the user's own reward function by import path."""
    common = [
        *RUN,
        "model=local",
        f"model.path={chat_model}",
        f"task.train={math_file}",
        "task.max_prompt_tokens=60",
        "task.max_new_tokens=8",
        r"task.instruction='Put the final answer within \boxed{}.'",
    ]
    result = CliRunner().invoke(app, ["run", *common, "reward=structured", "--run-dir", str(tmp_path / "structured")])
    assert result.exit_code == 0, result.output
    rows = _rows(tmp_path / "structured")
    assert rows[-1]["rollouts"] == 48 and rows[-1]["prompts_dropped"] > 0 and rows[-1]["tokens_generated"] > 0
    # reward=custom: a module of the user's, on the path of the process that runs it.
    (tmp_path / "my_rewards.py").write_text(
        textwrap.dedent("""
        def brevity(problems, completions):
            assert all(p.answer.isdigit() for p in problems)
            return [0.25 for _ in completions]
    """)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = CliRunner().invoke(
        app, ["run", *common, "reward=custom", "reward.fn=my_rewards:brevity", "--run-dir", str(tmp_path / "custom")]
    )
    assert result.exit_code == 0, result.output
    assert all(r["train_reward_mean"] == 0.25 for r in _rows(tmp_path / "custom")[1:])
    for fn, message in (
        ("my_rewards:nothing", "module my_rewards has no 'nothing'"),
        ("no_such_module:f", "No module named 'no_such_module'"),
        ("my_rewards", "must be package.module:function"),
    ):
        bad = CliRunner().invoke(app, ["plan", *common, "reward=custom", f"reward.fn={fn}"])
        assert bad.exit_code == 2 and message in bad.output, bad.output


@pytest.mark.slow
def test_eval_targets_native_held_out_sets_judges_and_per_problem_records(tmp_path, files):
    """Each eval point also scores the validation completions with the training reward
    (`val_native`), samples each held-out set and scores with each judge, all as evaluation compute:
    training is the same with or without them. Per-problem counts add up to val_avg@k."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from isoflop_cli import config
    from isoflop_cli.recipe.checkpoint import char_tokenizer, qwen2_config

    judge = tmp_path / "judge"
    tok = char_tokenizer()
    torch.manual_seed(0)
    b = config.load(None, []).reward.build
    AutoModelForSequenceClassification.from_config(qwen2_config(b, tok, num_labels=1)).save_pretrained(judge)
    tok.save_pretrained(judge)
    base = ["run", "n=4", "B_p=2", "grid.budgets=[32]", "grid.eval_points=2", "eval.problems=8", "eval.samples=4"]
    runs = {"plain": [], "extras": [f"+eval.sets={{sums:{files / 'train.parquet'}}}", f"+eval.judges={{tiny:{judge}}}"]}
    rows = {}
    for name, extra in runs.items():
        result = CliRunner().invoke(app, [*base, *extra, "--run-dir", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
        rows[name] = _rows(tmp_path / name)
    plain, extras = rows["plain"], rows["extras"]
    training = ("rollouts", "tokens_generated", "flops_total", "train_reward_mean", "train_loss", "val_avg@k")
    assert [[r[c] for c in training] for r in plain] == [[r[c] for c in training] for r in extras]
    assert all(e["flops_eval"] > p["flops_eval"] for p, e in zip(plain, extras))
    for r in extras:
        assert r["val_native"] == r["val_avg@k"]  # reward=sparse scores what the verifier checks
        assert 0 < r["downstream_sums_pass@1"] <= r["downstream_sums_best@k"] <= 1 and isinstance(
            r["judge_tiny"], float
        )
    records = [json.loads(line) for line in (tmp_path / "extras" / "problems.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [r["step"] for r in extras]
    for record, row in zip(records, extras):
        assert len(record["problem_id"]) == 8 and sum(record["correct"]) / (4 * 8) == pytest.approx(row["val_avg@k"])
    bad = CliRunner().invoke(app, [*base, f"+eval.judges={{tiny:{tmp_path}}}"])
    assert bad.exit_code == 2 and "eval.judges.tiny" in bad.output and "no config.json" in bad.output


def test_seed_study_configs_compose_on_a_real_style_checkpoint(chat_model, math_file):
    """The seed studies as configs: calibrate, then easy and hard sweeps on the files it writes, and
    the allocation setting for race-pilot."""
    from isoflop_cli import config
    from isoflop_cli.grid import expand

    files = [f"model.path={chat_model}", f"task.train={math_file}", "eval.problems=16"]
    easy, hard = (config.load(f"seed-{level}", files) for level in ("easy", "hard"))
    for cfg in (easy, hard):
        assert cfg.task.name == "dataset" and cfg.task.verifier == "math" and "\\boxed{}" in cfg.task.instruction
        assert (cfg.eval.k, cfg.eval.samples, cfg.algo.base_lr, cfg.algo.ref_batch) == (4, 16, 1e-6, 1024)
    assert easy.algo.kl_coef > 0 and easy.algo.entropy_coef > 0 and hard.algo.kl_coef == hard.algo.entropy_coef == 0
    cells = expand(easy)
    assert sum(c.feasible for c in cells) > 20 and max(c.axes["n"] for c in cells if c.feasible) == 2048
    with pytest.raises(ConfigError, match=r"calibration/seed-calibrate/easy\.parquet does not exist"):
        config.load("seed-easy", [f"model.path={chat_model}"])  # by default, the easy set calibrate writes
    calibrate = config.load("seed-calibrate", files)
    assert (calibrate.calibrate.samples, list(calibrate.calibrate.easy), list(calibrate.calibrate.hard)) == (
        16,
        [0.3, 0.6],
        [0.0, 0.0625],
    )
    assert (
        calibrate.task.instruction == easy.task.instruction
        and calibrate.task.max_new_tokens == easy.task.max_new_tokens
    )
    allocation = config.load("seed-allocation", ["model=tiny-arith", "cluster=local"])
    assert (
        list(allocation.grid.axes.reward) == ["sparse", "structured", "dense", "prm_proxy", "prm"]
        and allocation.lora.rank == 32
    )
