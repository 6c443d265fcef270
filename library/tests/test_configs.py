"""Every shipped config parses into real constructor arguments (jsonargparse rejects unknown keys)."""

import pytest
import yaml
from helpers import DIGITS_CONFIG, REPO, run_project


def _print_config(*configs) -> dict:
    args = [arg for config in configs for arg in ("--config", str(config))]
    result = run_project("fit", *args, "--print_config", cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


@pytest.mark.slow
def test_gpu_overlay_selects_nccl_ddp_on_all_gpus():
    config = _print_config(DIGITS_CONFIG, REPO / "configs" / "gpu.yaml")
    trainer = config["trainer"]
    assert trainer["accelerator"] == "gpu" and trainer["devices"] == -1
    assert trainer["strategy"]["class_path"] == "trainfleet.runtime.strategy.DDPStrategy"
    assert trainer["strategy"]["init_args"]["process_group_backend"] == "nccl"
    # The base config's model and data are kept.
    assert config["model"]["network"]["class_path"] == "project.networks.MLP"
    assert config["checkpoint"]["save_last"] is True


def test_every_overlay_that_changes_the_data_or_the_model_has_its_own_run_folder():
    """Runs of different experiments never share a folder, where `--ckpt_path last` would find the other's."""
    base = yaml.safe_load(DIGITS_CONFIG.read_text())["trainer"]["default_root_dir"]
    folders = {}
    for overlay in sorted((REPO / "configs").glob("*.yaml")):
        config = yaml.safe_load(overlay.read_text())
        if overlay != DIGITS_CONFIG and ("data" in config or "model" in config):
            folders[overlay.name] = config.get("trainer", {}).get("default_root_dir")
    assert folders.keys() >= {"image_folder.yaml", "mnist.yaml", "streaming.yaml"}
    assert None not in folders.values() and base not in folders.values(), folders
    assert len(set(folders.values())) == len(folders), folders
