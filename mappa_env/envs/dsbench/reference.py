"""Reference actions for DSBench-v0: a plain scikit-learn pipeline written as agent replies.

They check a setup end to end without a model (the environment, sandboxes, scoring and
coach), give a baseline score per task, and show what good actions look like. Each
function returns the text an agent would write: a short note and one fenced Python block.
"""

from __future__ import annotations

from typing import Any


def _code(text: str) -> str:
    return f"Here is my code.\n```python\n{text}\n```"


def engineer_action(task: Any) -> str:
    """Data engineer: split features and target, keep numeric columns, one-hot the rest."""
    target = task.target_columns[0] if len(task.target_columns) == 1 else list(task.target_columns)
    return _code(
        "import pandas as pd, pickle\n"
        "train = pd.read_csv('train.csv'); test = pd.read_csv('test.csv')\n"
        f"target = {target!r}\n"
        f"X_train = train.drop(columns=[*([target] if isinstance(target, str) else target), "
        f"{task.id_column!r}])\n"
        "y_train = train[target]\n"
        f"X_test = test.drop(columns=[{task.id_column!r}])\n"
        "both = pd.get_dummies(pd.concat([X_train, X_test]), dummy_na=True).fillna(0)\n"
        "X_train, X_test = both.iloc[: len(X_train)], both.iloc[len(X_train) :]\n"
        "pickle.dump(X_train, open('X_train.pkl', 'wb'))\n"
        "pickle.dump(y_train, open('y_train.pkl', 'wb'))\n"
        "pickle.dump(X_test, open('X_test.pkl', 'wb'))\n"
        "print(X_train.shape, X_test.shape)"
    )


def modeler_action(task: Any) -> str:
    """Modeler: a random forest, 3-fold cross-validation printed, saved as model.pkl."""
    kind = "Classifier" if task.task_type == "classification" else "Regressor"
    return _code(
        "import pickle\n"
        f"from sklearn.ensemble import RandomForest{kind}\n"
        "from sklearn.model_selection import cross_val_score\n"
        "X = pickle.load(open('X_train.pkl', 'rb')); y = pickle.load(open('y_train.pkl', 'rb'))\n"
        f"model = RandomForest{kind}(n_estimators=50, random_state=0)\n"
        "print('CV score:', cross_val_score(model, X, y, cv=3).mean())\n"
        "model.fit(X, y)\n"
        "pickle.dump(model, open('model.pkl', 'wb'))"
    )


def analyst_action(task: Any, shuffle: bool = False) -> str:
    """Analyst: predict X_test and write submission.csv (rows shuffled when asked)."""
    targets = list(task.target_columns)
    order = ".sample(frac=1, random_state=3)" if shuffle else ""
    return _code(
        "import pickle, pandas as pd\n"
        "model = pickle.load(open('model.pkl', 'rb'))\n"
        "X_test = pickle.load(open('X_test.pkl', 'rb'))\n"
        "test = pd.read_csv('test.csv')\n"
        f"pred = pd.DataFrame(model.predict(X_test), columns={targets!r})\n"
        f"sub = pd.concat([test[[{task.id_column!r}]], pred], axis=1){order}\n"
        "sub.to_csv('submission.csv', index=False)\n"
        "print(len(sub))"
    )


def reference_script(task: Any, shuffle: bool = False) -> dict[str, list[str]]:
    """Every agent's replies for one episode: its code, then a code-free hand-over."""
    return {
        "data_engineer": [engineer_action(task), "Saved X_train.pkl, y_train.pkl and X_test.pkl."],
        "modeler": [modeler_action(task), "Saved model.pkl (a random forest)."],
        "analyst": [analyst_action(task, shuffle), "Wrote submission.csv."],
    }
