"""``python -m project COMMAND``: this project's command line, the trainfleet library's (fit, validate,
test, predict, doctor, sweep, consolidate) with this project's LightningModule as the ``model``."""

from trainfleet.main import run as run_library


def run() -> None:
    run_library("project", "project.module.ClassificationModule")


if __name__ == "__main__":
    run()
