"""Every TrainConfig field and every environment option is type-checked by its annotation."""

from __future__ import annotations

import pytest

from mappa_env.errors import SettingsError
from mappa_env.typecheck import SettingsTypeError, check_env_options
from mappa_train.config import TrainConfig


def _from_yaml(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return TrainConfig.from_file(path)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ('mask_truncated: "false"', ["mask_truncated", "'false'", "boolean", "write false"]),
        ("steps: 1.5", ["steps", "1.5", "an integer", "fractional"]),
        ('lr: "1e-3"', ["lr", "'1e-3'", "a number", "write 1e-3 without quotes"]),
        ("steps: ten", ["steps", "'ten'", "an integer"]),
        ("adam_betas: 0.9", ["adam_betas", "0.9", "a list of 2 numbers"]),
        ("env_options: [1, 2]", ["env_options", "[1, 2]", "a mapping"]),
        ("train_batch_size: true", ["train_batch_size", "True", "an integer"]),
        ("eval_sets: {x: 3}", ["eval_sets", "mappings"]),
    ],
)
def test_a_wrong_type_names_the_field_the_value_and_the_type(tmp_path, line, words):
    with pytest.raises(SettingsTypeError) as caught:
        _from_yaml(tmp_path, line + "\n")
    for word in words:
        assert word in str(caught.value)


def test_yaml_numbers_and_lists_read_as_the_fields_types(tmp_path):
    config = _from_yaml(tmp_path, "lr: 1e-3\nadam_betas: [0.9, 0.99]\nsteps: 4.0\nkl_coef: 0\n")
    assert config.lr == 0.001
    assert config.adam_betas == (0.9, 0.99)
    assert config.steps == 4
    assert isinstance(config.steps, int)
    assert isinstance(config.kl_coef, float)
    assert TrainConfig() == TrainConfig(**TrainConfig().to_dict())


def test_env_options_are_checked_against_the_environment_constructor():
    check_env_options("MathChat-v0", {"tasks": "gen:6", "sandbox": None, "turns": {"verifier": 2}})
    with pytest.raises(SettingsError, match=r"names \['bogus'\], which MathChat-v0 does not take"):
        check_env_options("MathChat-v0", {"bogus": 1})
    with pytest.raises(SettingsTypeError, match=r"env_options\.max_new_tokens must be an integer"):
        check_env_options("MathChat-v0", {"max_new_tokens": "64"})
    with pytest.raises(SettingsTypeError, match=r"env_options\.isolation must be one of"):
        check_env_options("MathChat-v0", {"isolation": "nope"})
    with pytest.raises(SettingsTypeError, match="must be a mapping of option name"):
        check_env_options("MathChat-v0", [1, 2])


def test_mappa_train_says_what_is_wrong_in_one_line(capsys):
    from mappa_train.command import main

    code = main(["train", "--env-options", '{"tasks": "gen:4", "bogus": 1}', "--steps", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("mappa train: env_options names ['bogus']")
    assert len(err.splitlines()) == 1
    assert main(["train", "--steps", "ten"]) == 2
    assert "steps must be an integer, got 'ten'" in capsys.readouterr().err


def test_mappa_eval_checks_its_env_options_before_loading_anything(capsys):
    from mappa_train.command import main

    code = main(["eval", "--sandbox", "none", "--env-option", "turns=3", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("mappa eval: --env-option.turns must be a mapping")
