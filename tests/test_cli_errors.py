"""Bad input exits non-zero with a message that names the problem, and writes nothing."""

from conftest import DIGITS_CONFIG, REPO, quick_args, run_project


def _fails(tmp_path, *args: str) -> str:
    result = run_project(*args, cwd=tmp_path, timeout=120)
    assert result.returncode != 0
    assert not (tmp_path / "run").exists()
    return result.stderr


def test_unknown_config_key(tmp_path):
    stderr = _fails(tmp_path, "fit", *quick_args(tmp_path / "run", "--model.no_such_key", "1"))
    assert "no_such_key" in stderr


def test_missing_config_file(tmp_path):
    stderr = _fails(tmp_path, "fit", "--config", str(tmp_path / "missing.yaml"))
    assert "missing.yaml" in stderr


def test_missing_checkpoint(tmp_path):
    missing = tmp_path / "nope.ckpt"
    stderr = _fails(tmp_path, "test", *quick_args(tmp_path / "run", "--ckpt_path", str(missing)))
    assert "nope.ckpt" in stderr


def test_config_file_is_the_documented_default():
    assert DIGITS_CONFIG.is_file() and DIGITS_CONFIG.parent == REPO / "configs"
