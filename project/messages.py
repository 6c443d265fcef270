"""How the template tells the user what happened, from any layer: one line on stderr, an error's first line."""

import sys


def report(message: str) -> None:
    # One write with its newline: print writes the newline apart, and another rank's line, written to the same pipe
    # in between, ended up inside this one (a CI run parsed "resume with: ..." with rank 1's line on its end).
    sys.stderr.write(f"[project] {message}\n")
    sys.stderr.flush()


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""
