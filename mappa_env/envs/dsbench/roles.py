"""DSBench-v0's team: the three agents, the files each must leave, and what they are told.

The names (:data:`DATA_ENGINEER`, :data:`MODELER`, :data:`ANALYST`), the contract of
files between them (:data:`ARTIFACTS`, :data:`NEEDS`), the task's input files, the
system description and each agent's system prompt.
"""

from __future__ import annotations

DATA_ENGINEER = "data_engineer"
MODELER = "modeler"
ANALYST = "analyst"

#: Files each agent must leave in the workspace.
ARTIFACTS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: ("X_train.pkl", "y_train.pkl", "X_test.pkl"),
    MODELER: ("model.pkl",),
    ANALYST: ("submission.csv",),
}
#: Artifacts an agent needs from upstream.
NEEDS: dict[str, tuple[str, ...]] = {
    DATA_ENGINEER: (),
    MODELER: ("X_train.pkl", "y_train.pkl"),
    ANALYST: ("model.pkl", "X_test.pkl"),
}
INPUT_FILES = ("train.csv", "test.csv", "sample_submission.csv")
SUBMISSION_FILE = "submission.csv"

SYSTEM_DESCRIPTION = (
    "Three agents solve a Kaggle-style data-modelling task together, one after another, in "
    "one shared working directory that holds train.csv, test.csv and sample_submission.csv: "
    "(1) the data engineer prepares the data and saves X_train.pkl, y_train.pkl and X_test.pkl "
    "(plus any fitted transformers) with a short summary; (2) the modeler trains a model on "
    "them, prints cross-validation metrics and saves model.pkl; (3) the analyst predicts on "
    "X_test.pkl with model.pkl and writes submission.csv in the task's submission format. "
    "Each agent runs Python in its own interpreter: work passes between agents only through "
    "files and their final messages. The submission is scored with the task's metric."
)

#: Each agent's system prompt (before :data:`ROLE_FOOTER`).
ROLE_PROMPTS = {
    DATA_ENGINEER: (
        "You are the data engineer, agent 1 of 3 in a data-science team working in one shared "
        "directory. After you, the modeler trains a model and the analyst writes the submission."
        "\nYour job: load train.csv and test.csv, clean and encode the features (handle missing "
        "values and categorical columns, keep the row order of train.csv and test.csv), and "
        "save with pickle:"
        " X_train.pkl (features), y_train.pkl (target) and X_test.pkl (test features, same "
        "columns as X_train). Save any fitted transformers too."
    ),
    MODELER: (
        "You are the modeler, agent 2 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_train.pkl, y_train.pkl and X_test.pkl;"
        " after you, the analyst uses your model to write the submission.\nYour job: load "
        "X_train.pkl and y_train.pkl, train a good model for the task's metric, print its "
        "cross-validation score, and save the fitted model with pickle as model.pkl."
    ),
    ANALYST: (
        "You are the analyst, agent 3 of 3 in a data-science team working in one shared "
        "directory. Before you, the data engineer saved X_test.pkl and the modeler saved "
        "model.pkl.\nYour job: load them, predict for every row of test.csv, and write "
        "submission.csv exactly in the format of sample_submission.csv (same id column and "
        "target column names, one row per test id)."
    ),
}
#: The end of every agent's system prompt: ``{turns}`` and ``{budget}`` are filled in.
ROLE_FOOTER = (
    "\nRun Python by writing one ```python block per reply; it runs in the shared directory and "
    "you will see its output. Your variables persist between your own turns, but the other "
    "agents cannot see them: only files. You have up to {turns} turns. A reply without a code "
    "block ends your part: make it a short summary for the next agent of what you saved. "
    "Keep each reply within {budget} tokens."
)
