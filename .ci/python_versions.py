"""Prints the minor Pythons that pyproject.toml's requires-python admits (`admitted`), or the one just below and
the one just above the range (`outside`): .ci/pythons checks each."""

import re
import sys
from pathlib import Path

from packaging.specifiers import SpecifierSet

MINORS = [f"3.{minor}" for minor in range(6, 30)]

[requires] = re.findall(r'(?m)^requires-python = "([^"]+)"', Path("pyproject.toml").read_text())  # tomllib: 3.11+
specifier = SpecifierSet(requires)
admitted = [version for version in MINORS if specifier.contains(f"{version}.0")]
if sys.argv[1] == "admitted":
    print(*admitted)
else:
    first, last = MINORS.index(admitted[0]), MINORS.index(admitted[-1])
    print(*MINORS[max(first - 1, 0) : first], *MINORS[last + 1 : last + 2])
