"""bench: find the fastest PyTorch training configuration that fits a GPU, by measuring.

The command line (`bench`) is the main interface; from Python, `load_study` gives a study's trials
as a pandas DataFrame for notebooks and pipelines.
"""
from pathlib import Path

__version__ = "0.1.0"


def load_study(study: str | None = None, results: str | Path = "results", storage: str | None = None):
    """A study's trials as a pandas DataFrame: one row per trial, `config.<knob>` columns, the
    headline figures, and the `pareto` / `best` / `baseline` / `tier` marks `bench report` shows.

    study: name (default: the most recent under `results`); storage: an Optuna storage URL.
    """
    import pandas as pd

    from harness import cli, ledger, report, storage as stores

    results = Path(results)
    name = study or ledger.latest_study(results, storage)
    loaded = ledger.load(stores.existing_storage(storage, results, name), name)
    rows, info = ledger.rows_of(loaded), ledger.study_info(loaded)
    # the choice `bench report` and `bench apply` make, read as they read it: the study's spec, and through it
    # the training run its apply target describes (a compile pays back within it, or is not chosen)
    spec = cli.study_spec(cli.spec_path_of(info, storage, results), info)
    return pd.DataFrame(report.flat(cli.study_choice(rows, info, spec)))
