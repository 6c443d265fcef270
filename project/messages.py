"""How the template tells the user what happened, from any layer: one line on stderr, an error's first line."""

import sys


def report(message: str) -> None:
    print(f"[project] {message}", file=sys.stderr, flush=True)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""
