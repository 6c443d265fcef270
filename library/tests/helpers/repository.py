"""Where the template, its library and its default config are."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the template: the project, its configs and scripts
LIBRARY = REPO / "library"  # trainfleet: its package, tests, benchmarks and docs
DIGITS_CONFIG = REPO / "configs" / "digits.yaml"
