"""The mappa command as a newcomer meets it: flags anywhere, readable help, one way in."""

from __future__ import annotations

import json
import re

import pytest

from mappa_train.cli import first_sentence, plain_text
from mappa_train.command import build_parser, parse_args


def test_global_flags_are_taken_after_the_sub_command():
    assert parse_args(["eval", "-v", "--episodes", "1"]).verbose is True
    assert parse_args(["train", "--steps", "2", "--verbose"]).verbose is True
    assert parse_args(["-v", "train"]).verbose is True
    assert parse_args(["eval"]).verbose is False


def test_train_help_is_plain_text_and_short(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    text = commands.choices["train"].format_help()
    assert "``" not in text
    assert not re.search(r":[a-z]+:`", text)
    assert len(text.splitlines()) < 330  # 416 with every docstring in full (306 now)
    assert "--stop-unscored-steps" in text


def test_docstrings_become_plain_sentences():
    doc = "Uses :mod:`mappa_train.resume` and :func:`~a.b.fn` with ``None``. Then more."
    assert plain_text(doc) == "Uses mappa_train.resume and fn with None. Then more."
    assert first_sentence(plain_text(doc)) == "Uses mappa_train.resume and fn with None."
    assert first_sentence("e.g. 4 samples at 0.6. Next") == "e.g. 4 samples at 0.6."


def test_both_commands_take_tasks_and_the_sandbox_the_same_ways():
    from mappa_agents.cli import env_options_from_args
    from mappa_train.cli import config_from_args

    train = config_from_args(parse_args(["train", "--tasks", "gen:6", "--sandbox", "none"]))
    assert train.env_options == {"tasks": "gen:6", "sandbox": None}
    train = config_from_args(parse_args(["train", "--env-options", '{"tasks": "gen:6"}']))
    assert train.env_options == {"tasks": "gen:6"}
    for argv in (
        ["eval", "--tasks", "gen:6", "--sandbox", "none"],
        ["eval", "--env-options", '{"tasks": "gen:6", "sandbox": null}'],
    ):
        options = env_options_from_args(parse_args(argv))
        assert (options["tasks"], options["sandbox"]) == ("gen:6", None)
    with pytest.raises(ValueError, match="--tasks 'gen:6' and env_options tasks='gen:8' disagree"):
        config_from_args(
            parse_args(["train", "--tasks", "gen:6", "--env-options", '{"tasks": "gen:8"}'])
        )


def test_a_run_dir_without_checkpoints_is_one_line(tmp_path, capsys):
    from mappa_train.command import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    assert main(["eval", "--system", str(run), "--sandbox", "none", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mappa eval: {run} holds no complete checkpoint")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("flags", "start"),
    [
        (["--train-agents", "nobody"], "train_agents names ['nobody']"),
        (["--advantage-estimator", "nope"], "unknown advantage estimator 'nope'"),
    ],
)
def test_a_setting_the_trainer_refuses_is_one_line(tmp_path, capsys, flags, start):
    from mappa_train.command import main

    argv = ["train", "--output-dir", str(tmp_path / "run"), "--sandbox", "none", *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"mappa train: {start}")
    assert len(err.splitlines()) == 1


def test_an_audit_of_problems_it_cannot_solve_honestly_is_one_line(tmp_path, capsys):
    from mappa_train.command import main

    tasks = tmp_path / "riddles.json"
    tasks.write_text(json.dumps([{"id": "r1", "prompt": "What has keys but no locks?",
                                  "answer": "12"}]))  # fmt: skip
    argv = ["coach", "audit", "--env", "MathChat-v0", "--coach", "rules", "--tasks", str(tasks)]
    argv += ["--out", str(tmp_path / "audit"), "--sandbox", "none"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "a MathChat audit needs problems whose solution it can write" in err
    assert "task 'r1' is neither" in err
    assert len(err.splitlines()) == 1


def test_an_audit_takes_no_credit_mode_and_refuses_one_given_as_an_option(tmp_path, capsys):
    """The audit scores under process credit: a credit mode it would drop is refused."""
    from mappa_train.command import main

    argv = ["coach", "audit", "--env", "MathChat-v0", "--coach", "rules", "--sandbox", "none"]
    argv += ["--out", str(tmp_path / "audit")]
    with pytest.raises(SystemExit) as flag:
        main([*argv, "--credit-mode", "outcome"])
    assert flag.value.code == 2
    assert "unrecognized arguments: --credit-mode" in capsys.readouterr().err
    assert main([*argv, "--env-option", "credit_mode=outcome"]) == 2
    err = capsys.readouterr().err.strip()
    assert "['credit_mode'] are the audit's" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("name", "text", "start"),
    [
        ("bad.yaml", "steps: [1, 2\nlr: :\n", "is not valid YAML (expected ',' or ']'"),
        ("bad.json", '{"steps": 2,}', "is not valid JSON (Expecting property name"),
        ("missing.yaml", None, "is neither a file nor a bundled recipe"),
    ],
)
def test_a_config_file_that_cannot_be_read_is_one_line(tmp_path, capsys, name, text, start):
    from mappa_train.command import main

    config = tmp_path / name
    if text is not None:
        config.write_text(text)
    assert main(["train", "--config", str(config), "--output-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mappa train: ")
    assert str(config) in err
    assert start in err


@pytest.mark.parametrize("command", ["train", "eval"])
def test_an_unknown_env_id_is_one_line_listing_the_known_ones(tmp_path, capsys, command):
    from mappa_train.command import main

    out = "--output-dir" if command == "train" else "--out"
    argv = [command, "--env", "MathChatt-v0", "--sandbox", "none", out, str(tmp_path / "run")]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"mappa {command}: unknown environment 'MathChatt-v0'; registered: ")
    assert "'DSBench-v0', 'MathChat-v0'" in err


def test_eval_help_shows_the_defaults(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    parser = build_parser()
    (commands,) = [a for a in parser._actions if a.dest == "command"]
    text = " ".join(commands.choices["eval"].format_help().split())
    assert "output directory (default: runs/eval)" in text
    assert "sampling temperature (default: 0.6)" in text
    assert "(default: smollm2-135m)" in text
    # A default the help already states is not repeated; no default is not shown.
    assert "(default: 8)" in text  # --concurrency
    assert text.count("(default: 8)") == 1  # not --episodes, whose help says "default 8"
    assert "(default: None)" not in text
