"""PipelineEnv as a shell composed of its workspace, its judging and its records."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from mappa_env.envs import judging, pipeline, records, workspace
from mappa_env.envs.pipeline import PipelineEnv
from tests import toy_env

ROOT = Path(__file__).resolve().parents[1]

# What subclasses, runners and tests call on an environment, wherever the code lives.
METHODS = {
    workspace.EpisodeWorkspace: [
        "workdir",
        "task_code_timeout_s",
        "copy_workspace",
        "restore_workspace",
        "run_code",
        "_hold_quota",
        "sandbox_confinement",
        "helper_confinement",
        "isolation_report",
        "check_sandbox",
        "_prestart",
        "_take_prestarted",
        "_close_spare",
        "release_sandbox",
        "_remove_workdir",
    ],
    judging.CoachJudging: ["coach_sees_truth", "_judge", "_coach_request", "_provisional_reward"],
    records.EpisodeRecords: [
        "state",
        "transcript_text",
        "last_record",
        "records_of",
        "credit_settings",
        "_final_rewards",
        "_step_info",
        "_finish",
    ],
}


@pytest.mark.parametrize("part", list(METHODS), ids=lambda part: part.__name__)
def test_the_environment_takes_each_method_from_its_part(part):
    assert issubclass(PipelineEnv, part)
    for name in METHODS[part]:
        assert name in vars(part), name
        assert getattr(PipelineEnv, name) is getattr(part, name), name


def test_the_shell_module_still_gives_the_names_that_moved():
    for name in ("ActionRecord", "ToolOutcome"):
        assert getattr(pipeline, name) is getattr(records, name)
    for name in ("REVEAL_POLICIES", "check_invalid_reward"):
        assert getattr(pipeline, name) is getattr(judging, name)
    for name in (
        "DEFAULT_WORKSPACE_QUOTA_MB",
        "MAX_CODE_TIMEOUT_S",
        "MIN_CODE_TIMEOUT_S",
        "resolve_sandbox_factory",
    ):
        assert getattr(pipeline, name) is getattr(workspace, name)


@pytest.mark.parametrize("part", ["workspace", "judging", "records"])
def test_a_part_imports_without_the_shell(part):
    code = (
        f"import json, sys\nimport mappa_env.envs.{part}\nprint(json.dumps(sorted(sys.modules)))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True
    )
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert f"mappa_env.envs.{part}" in loaded
    assert "mappa_env.envs.pipeline" not in loaded


def test_the_deprecated_reward_mode_warns_at_the_line_that_made_the_environment():
    # The check moved into a helper of the constructor; the warning still names the
    # caller of PipelineEnv.__init__ (here the subclass's super().__init__ line).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = toy_env.LetterEnv(coach=None, reward_mode="outcome", sandbox=None)
    env.close()
    (warning,) = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert "reward_mode is deprecated" in str(warning.message)
    assert Path(warning.filename) == Path(toy_env.__file__)
