import pytest
from omegaconf import OmegaConf

from isoflop_cli import config
from isoflop_cli.errors import ConfigError
from isoflop_cli.grid import expand
from isoflop_cli.recipe.rewards import make_reward
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
    overrides = ["grid.n=[4]", "grid.B_p=[4]", "+grid.axes={reward:[sparse,structured,dense],model:[tiny-arith-s,tiny-arith-l]}"]
    cfg = config.load(None, overrides)
    cells = expand(cfg, recompose=lambda extra: config.load(None, overrides + extra))
    assert len(cells) == 6 and len({c.run_id for c in cells}) == 6
    assert {(c.cfg.reward.name, c.cfg.model.name) for c in cells} == {
        (r, m) for r in ("sparse", "structured", "dense") for m in ("tiny-arith-s", "tiny-arith-l")}
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
        "dense": "has_partial_credit", "prm_proxy": "has_steps", "prm": "has_steps"}
