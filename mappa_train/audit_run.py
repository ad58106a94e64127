"""What ``mappa coach audit --config`` audits: the tasks and coach settings of a training run.

A coach audit on generated expressions says little about a coach that will judge word
problems. Given a training config (a file, or a bundled recipe's name), the audit takes
that run's environment, its training tasks and other environment options, its coach and
the reveal policy its coach judges under. A credit test file (``recipe:`` and ``arms:``,
e.g. ``mathchat-credit-test``) names its training recipe; its treatment arm is the run
audited (its env options and credit laid over the recipe, as the test's runs are made).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mappa_env.credit import COACH_MODES
from mappa_env.errors import SettingsError
from mappa_train.bundled import resolve_config
from mappa_train.config import TrainConfig, read_config_file

# Options the audit sets itself: it passes the coach, the reveal policy and process credit.
_AUDIT_OWNED = ("coach", "reveal", "credit_mode", "outcome_weight", "backprop_decay")


@dataclass(frozen=True)
class AuditedRun:
    """The settings of a training run that matter to its coach.

    Attributes:
        name: The ``--config`` value as given (a recipe name or a file).
        env: The environment id.
        coach: The run's coach spec.
        env_options: The training environment's options, less those the audit owns
            (``coach``, ``reveal``, credit).
        reveal: The reveal policy the run's environments are given (``None``: the
            coach's own default).
        credit_mode: The run's credit; one under which the coach's scores pay rewards.
        arm: For a credit test file, the arm audited (its treatment).
    """

    name: str
    env: str
    coach: str
    env_options: dict[str, Any]
    reveal: str | None
    credit_mode: str
    arm: str | None = None
    notes: list[str] = field(default_factory=list)


def audited_run(value: str) -> AuditedRun:
    """The run a ``mappa coach audit --config`` value names.

    Args:
        value: A training config file, a credit test file, or a bundled recipe's name
            (:func:`~mappa_train.bundled.resolve_config`).

    Returns:
        The run's :class:`AuditedRun`.

    Raises:
        SettingsError: For a config that cannot be read, or a run whose credit pays no
            coach score (nothing of its coach reaches training).
    """
    path = resolve_config(value)
    data = read_config_file(path)
    arm_name = None
    if "recipe" in data and "arms" in data:
        test = data
        arm_name = str(test.get("treatment") or "")
        arm = (test.get("arms") or {}).get(arm_name)
        if arm is None:
            raise SettingsError(
                f"--config {value}: its treatment {arm_name!r} is not one of its arms "
                f"{sorted(test.get('arms') or {})}"
            )
        data = read_config_file(path.parent / str(test["recipe"]))
        # As the credit test makes its runs: the arm's options over the recipe's.
        data["env_options"] = {**(data.get("env_options") or {}), **(arm.get("env_options") or {})}
        data["credit_mode"] = arm.get("credit_mode", data.get("credit_mode", "process"))
    config = TrainConfig.from_dict(data)
    if not config.credit.uses_coach:
        raise SettingsError(
            f"--config {value} trains under credit_mode={config.credit_mode!r}: its coach "
            f"pays no reward, so there is no coach to audit; give a run under "
            f"{', '.join(COACH_MODES)} credit, or --env and --coach without --config"
        )
    options = dict(config.env_options)
    reveal = options.get("reveal")
    for key in _AUDIT_OWNED:
        options.pop(key, None)
    notes = []
    if config.credit_mode != "process":
        notes.append(
            f"The run trains under {config.credit_mode} credit: the coach's scores pay part "
            "of each reward; the audit compares them under process credit."
        )
    return AuditedRun(
        name=value,
        env=config.env,
        coach=config.coach,
        env_options=options,
        reveal=reveal,
        credit_mode=config.credit_mode,
        arm=arm_name,
        notes=notes,
    )
