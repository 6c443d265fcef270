"""Inputs that cannot be read (an image cut short, a table row with a missing value): found before the first step and
listed all at once, the count and the first few, rather than one at a time mid-epoch with a traceback.

Training refuses them by default (exit 2: a data set silently smaller than the user thinks is worse than a stop);
each data module's ``skip_unreadable`` switch trains without them, saying how many it left out. ``predict`` carries on:
each unreadable input gets a row with its reason in ``predictions.csv`` (runs/outputs.py).
"""

from lightning.pytorch.utilities import rank_zero_only

from trainfleet.messages import report

SHOWN = 3  # the first few named; the count says how many more


def listing(problems: dict[str, str]) -> str:
    """The first few PROBLEMS (input: reason), and how many more."""
    shown = [f"{name} ({reason})" for name, reason in list(problems.items())[:SHOWN]]
    more = len(problems) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more else "")


def refuse_or_skip(problems: dict[str, str], total: int, what: str, skip: bool) -> None:
    """Raises (the CLI exits 2) naming PROBLEMS among TOTAL inputs, or, with SKIP, says once that they are left out."""
    if not problems:
        return
    counted = f"{len(problems)} of {total} {what}"
    if not skip:
        raise ValueError(
            f"{counted} cannot be read: {listing(problems)}; fix or remove them, or give"
            " --data.init_args.skip_unreadable true to train without them"
        )
    say(f"training without {counted} that cannot be read (skip_unreadable): {listing(problems)}")


@rank_zero_only
def say(message: str) -> None:
    report(message)
