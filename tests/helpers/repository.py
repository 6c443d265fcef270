"""Where the repository and its default config are."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DIGITS_CONFIG = REPO / "configs" / "digits.yaml"
