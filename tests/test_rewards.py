import pytest
from omegaconf import OmegaConf

from isoflop_cli import config
from isoflop_cli.errors import ConfigError
from isoflop_cli.grid import expand
from isoflop_cli.recipe.rewards import make_reward
from isoflop_cli.tasks import Problem
from isoflop_cli.tasks.arith import ArithTask

TASK = ArithTask()
P = TASK.problem([47, 38], ["+"])  # 85, answered reversed: "58"
CASES = {  # completion: (sparse, structured, dense)
    "58": (1.0, 1.0, 1.0),
    " 58 ": (1.0, 1.0, 1.0),
    "57": (0.0, 0.2, 0.5),
    "85": (0.0, 0.2, 0.0),
    "581": (0.0, 0.2, 2 / 3),
    "5": (0.0, 0.2, 0.5),
    "5+8": (0.0, 0.0, 1 / 3),
    "=": (0.0, 0.0, 0.0),
}


@pytest.mark.parametrize("name,column", [("sparse", 0), ("structured", 1), ("dense", 2)])
def test_rewards_on_hand_made_completions(name, column):
    reward = make_reward(OmegaConf.create({"name": name, "format_weight": 0.2}), TASK)
    scores, spent = reward([P] * len(CASES), list(CASES))
    assert reward.rule_based and spent == 0.0
    assert scores == pytest.approx([v[column] for v in CASES.values()])


def test_reward_is_a_grid_axis_and_model_family_too():
    overrides = [
        "grid.n=[4]",
        "grid.B_p=[4]",
        "+grid.axes={reward:[sparse,structured,dense],model:[tiny-arith-s,tiny-arith-l]}",
    ]
    cfg = config.load(None, overrides)
    cells = expand(cfg, recompose=lambda extra: config.load(None, overrides + extra))
    assert len(cells) == 6 and len({c.run_id for c in cells}) == 6
    assert {(c.cfg.reward.name, c.cfg.model.name) for c in cells} == {
        (r, m) for r in ("sparse", "structured", "dense") for m in ("tiny-arith-s", "tiny-arith-l")
    }
    sizes = {c.cfg.model.name: c.cfg.model.build.hidden_size for c in cells}
    assert sizes == {"tiny-arith-s": 64, "tiny-arith-l": 256}


STEPS = ArithTask(steps=True)
Q = STEPS.problem([57, 68], ["+"])  # columns 7+8 = 15 -> "51", 5+6+1 = 12 -> "21"; answer 125 -> "521"


def test_step_solutions_and_their_rewards():
    assert (Q.steps, Q.answer, Q.solution) == (("51", "21"), "521", "51,21;521")
    cases = {  # completion: (sparse, structured, prm_proxy)
        "51,21;521": (1.0, 1.0, 1.0),
        "51,20;520": (0.0, 0.2, 1 / 3),
        "50,21;521": (1.0, 1.0, 2 / 3),
        "521": (1.0, 0.8, 1 / 3),  # right answer, no work shown
        "51,21,00;521": (1.0, 1.0, 3 / 4),  # an extra step counts as wrong
        "51;21": (0.0, 0.2, 1 / 3),
        "garbage": (0.0, 0.0, 0.0),
    }
    for name, column in (("sparse", 0), ("structured", 1), ("prm_proxy", 2)):
        reward = make_reward(OmegaConf.create({"name": name, "format_weight": 0.2}), STEPS)
        assert reward.rule_based
        scores, spent = reward([Q] * len(cases), list(cases))
        assert spent == 0.0
        assert scores == pytest.approx([v[column] for v in cases.values()]), name


def test_step_rewards_need_a_task_that_shows_its_work():
    for name in ("prm_proxy", "prm"):
        with pytest.raises(ConfigError, match="task=arith-steps"):
            config.load(None, [f"reward={name}"])
    assert config.load(None, ["reward=prm", "task=arith-steps"]).task.steps


def test_registries_refuse_a_second_entry_of_one_name():
    from isoflop_cli.recipe.losses import ADVANTAGES
    from isoflop_cli.recipe.losses import register as register_loss
    from isoflop_cli.rewards import REWARDS, register, sparse

    with pytest.raises(ValueError, match="registered twice"):
        register("sparse")(lambda task, reward: None)
    with pytest.raises(ValueError, match="registered twice"):
        register_loss(ADVANTAGES, "group")(lambda inputs: None)
    assert REWARDS["sparse"].scorer is sparse and ADVANTAGES["group"].__name__ != "<lambda>"


def test_each_reward_config_names_a_registered_reward_and_only_prm_scores_with_a_model():
    from pathlib import Path

    from isoflop_cli.config.compose import CONF_DIR
    from isoflop_cli.rewards import REWARDS

    names = {OmegaConf.load(p).name for p in (Path(CONF_DIR) / "reward").glob("*.yaml")}
    assert names <= set(REWARDS)
    assert {name for name, spec in REWARDS.items() if spec.model_based} == {"prm"}
    assert {name: spec.needs for name, spec in REWARDS.items() if spec.needs} == {
        "dense": "has_partial_credit",
        "prm_proxy": "has_steps",
        "prm": "has_steps",
    }


# --- the users' own signatures: verl's compute_score, TRL's reward functions --------------------------

VERL_FILE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """As verl's gsm8k scorer: the text after the last '####', weighted by the row's difficulty."""
    if data_source != "openai/gsm8k":
        return 0.0
    found = solution_str.split("####")[-1].strip()
    weight = {"easy": 0.5, "hard": 1.0}[extra_info["difficulty"]]
    return {"score": weight * (found == ground_truth), "acc": found == ground_truth, "index": extra_info["index"]}
'''

TRL_MODULE = '''
def accuracy_reward(completions, solution, difficulty, **kwargs):
    """As TRL's examples: chat completions, the answer column by its name, another column too."""
    assert kwargs["prompts"][0][0]["role"] == "user" and "data_source" in kwargs
    return [
        float(c[0]["content"].strip() == s) * (2.0 if d == "hard" else 1.0)
        for c, s, d in zip(completions, solution, difficulty)
    ]


def length_reward(prompts, completions, **kwargs):
    return [len(c) / 10 + len(p) / 100 for p, c in zip(prompts, completions)]


def three(a, b, c):
    return [0.0]


def isoflop_style(problems, completions):
    return [float(c == p.answer) for p, c in zip(problems, completions)]
'''

# A problem file with chat prompts and columns of its own: (question, answer, data_source, difficulty).
ROWS = [
    ("What is 2+2?", "4", "openai/gsm8k", "easy"),
    ("What is 7*6?", "42", "openai/gsm8k", "hard"),
    ("Name a prime.", "7", "other", "hard"),
]
COMPLETIONS = ["so #### 4", "#### 41", "#### 7"]  # right, wrong, right
VERL = [0.5, 0.0, 0.0]  # verl: 0.5 * right (easy); hard but wrong; another data_source scores 0


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    (tmp_path / "verl_reward.py").write_text(VERL_FILE)
    (tmp_path / "trl_rewards.py").write_text(TRL_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


class Words:
    """A tokenizer for `DatasetTask.prepare`: a token per word, no chat template (plain prompts)."""

    chat_template = None

    def __call__(self, texts):
        from types import SimpleNamespace

        return SimpleNamespace(input_ids=[t.split() for t in texts])


def _problem_file(tmp_path):
    """The rows as a verl-style parquet (chat prompts, data_source, extra_info) with TRL's answer column."""
    import pandas as pd

    from isoflop_cli.tasks.dataset import DatasetTask

    rows = [
        {
            "prompt": [{"role": "user", "content": q}],
            "solution": a,
            "data_source": s,
            "difficulty": d,
            "extra_info": {"index": i},
        }
        for i, (q, a, s, d) in enumerate(ROWS)
    ]
    pd.DataFrame(rows).to_parquet(tmp_path / "problems.parquet")
    task = DatasetTask(
        train=str(tmp_path / "problems.parquet"), val=str(tmp_path / "problems.parquet"), answer_key="solution"
    )
    task.prepare(Words())
    return task, sorted(task.problems("train"), key=lambda p: int(p.id))


def _custom(fn, style="auto"):
    return OmegaConf.create({"name": "custom", "fn": fn, "style": style})


def test_a_verl_compute_score_from_a_file_scores_as_in_verl(user_files):
    task, problems = _problem_file(user_files)
    assert task.columns == ("solution", "data_source", "difficulty", "extra_info")
    assert problems[1].columns == {
        "solution": "42",
        "data_source": "openai/gsm8k",
        "difficulty": "hard",
        "extra_info": {"index": 1},
    }
    reward = make_reward(_custom(f"{user_files / 'verl_reward.py'}:compute_score"), task)
    assert reward(problems, COMPLETIONS)[0] == VERL  # a dict returned is verl's {"score": ...}
    # The adapter alone, by hand: data_source and ground truth as arguments, extra_info the row's
    # other columns over verl's own.
    from isoflop_cli.rewards import STYLES, load_function

    seen = []
    STYLES["verl"].call(lambda **kw: seen.append(kw) or 1.0, task.columns)(problems[:1], ["#### 4"])
    assert seen == [
        {
            "data_source": "openai/gsm8k",
            "solution_str": "#### 4",
            "ground_truth": "4",
            "extra_info": {"solution": "4", "difficulty": "easy", "index": 0},
        }
    ]
    assert load_function(f"{user_files / 'verl_reward.py'}:compute_score") is load_function(
        f"{user_files / 'verl_reward.py'}:compute_score"
    )


def test_a_trl_reward_function_gets_chat_completions_and_the_columns_as_in_trl(user_files):
    task, problems = _problem_file(user_files)
    # TRL: completions as assistant messages (chat prompts), the answer column 'solution' and
    # 'difficulty' as keyword lists.
    reward = make_reward(_custom("trl_rewards:accuracy_reward"), task)
    assert reward(problems, ["4", "41", "7"])[0] == [1.0, 0.0, 2.0]
    assert reward(problems, COMPLETIONS)[0] == [0.0, 0.0, 0.0]  # TRL compares the whole text: '#### 7' is not '7'
    # Plain-text prompts: prompts and completions are the strings, as TRL gives a standard (not conversational) set.
    plain = [Problem(prompt="rendered by the template", answer="4", given_prompt="What is 2+2?")]
    assert make_reward(_custom("trl_rewards:length_reward", "trl"), task)(plain, ["four"])[0] == [
        pytest.approx(0.4 + 0.12)
    ]


def test_styles_are_told_from_signatures_and_isoflops_own_still_works(user_files):
    from isoflop_cli.rewards import style_of

    columns = ("solution", "difficulty")
    assert style_of(lambda data_source, solution_str, ground_truth, extra_info=None: 0, "auto", columns, "f") == "verl"
    assert style_of(lambda completions, **kwargs: 0, "auto", columns, "f") == "trl"
    assert style_of(lambda completions, solution: 0, "auto", columns, "f") == "trl"  # a column by name, no **kwargs
    assert style_of(lambda problems, completions: 0, "auto", columns, "f") == "isoflop"
    # isoflop's own (problems, completions), the only one before styles, with a config that has no reward.style.
    assert make_reward(OmegaConf.create({"name": "custom", "fn": "trl_rewards:isoflop_style"}), TASK)(
        [P, P], ["58", "85"]
    )[0] == [1.0, 0.0]


@pytest.mark.parametrize(
    "fn, style, message",
    [
        ("{d}/missing.py:compute_score", "auto", "missing.py does not exist"),
        ("{d}/verl_reward.py:nothing", "auto", "verl_reward.py has no 'nothing'"),
        ("trl_rewards:nothing", "auto", "module trl_rewards has no 'nothing'"),
        ("trl_rewards:three", "auto", "fits no reward signature"),
        (
            "trl_rewards:accuracy_reward",
            "auto",
            "fits no reward signature",
        ),  # 'solution' is no column of the arithmetic task
        ("trl_rewards:accuracy_reward", "verl", "does not fit reward.style=verl"),
        ("{d}/verl_reward.py:compute_score", "trl", "it requires 'data_source'"),
        ("trl_rewards:length_reward", "other", "reward.style 'other' is not one of: auto, verl, trl, isoflop"),
    ],
)
def test_bad_reward_functions_are_refused_before_any_compute(user_files, fn, style, message):
    from typer.testing import CliRunner

    from isoflop_cli.cli import app

    result = CliRunner().invoke(
        app, ["plan", "reward=custom", f"reward.fn={fn.format(d=user_files)}", f"reward.style={style}"]
    )
    errors = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and message in " ".join(result.output.split()), result.output
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
