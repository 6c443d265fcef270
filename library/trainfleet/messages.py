"""How the template tells the user what happened, from any layer: one line on stderr, an error's first line."""

import sys
from typing import TextIO

from trainfleet import program


def write_line(text: str, stream: TextIO) -> None:
    """TEXT and its newline in one write, flushed: ranks share one stdout and stderr (a pipe, under srun and
    torchrun), and print writes the newline apart, so another rank's line written in between ended up inside this
    one (a CI run parsed "resume with: ..." with rank 1's line on its end)."""
    stream.write(text + "\n")
    stream.flush()


def report(message: str) -> None:
    write_line(f"{program.prefix()} {message}", sys.stderr)


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""
