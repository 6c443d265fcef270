"""The FSDP overlay: parses into Lightning's FSDPStrategy with the documented settings.

Lightning refuses FSDP on CPU, so training with it is a GPU-only path; here the config is parsed by
the real CLI, its strategy is built, and the CPU refusal is checked to be a clear, harmless error.
"""

import pytest
import torch
import yaml
from conftest import DIGITS_CONFIG, REPO, run_project
from jsonargparse import ArgumentParser
from lightning.pytorch.strategies import FSDPStrategy, Strategy
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

FSDP_CONFIG = REPO / "configs" / "fsdp.yaml"
CONFIGS = ["--config", str(DIGITS_CONFIG), "--config", str(FSDP_CONFIG)]


@pytest.fixture(scope="module")
def printed_config() -> dict:
    result = run_project("fit", *CONFIGS, "--print_config", cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return yaml.safe_load(result.stdout)


def test_overlay_switches_the_base_config_to_fsdp_on_gpus(printed_config):
    trainer = printed_config["trainer"]
    assert trainer["accelerator"] == "gpu" and trainer["devices"] == -1
    assert trainer["strategy"]["class_path"] == "lightning.pytorch.strategies.FSDPStrategy"
    assert printed_config["model"]["network"]["class_path"] == "project.networks.MLP"  # the base model is kept
    assert printed_config["checkpoint"]["save_last"] is True


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # jsonargparse>=4.49 renamed instantiate_classes
def test_strategy_builds_with_per_layer_wrapping_full_sharding_and_full_checkpoints(printed_config):
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    config = parser.parse_object({"strategy": printed_config["trainer"]["strategy"]})
    strategy = parser.instantiate_classes(config).strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.FULL_SHARD
    assert strategy._state_dict_type == "full"  # consolidated checkpoints, loadable without FSDP
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy)
    assert set(policy._module_classes) == {torch.nn.Linear, torch.nn.Conv2d}


def test_fsdp_on_cpu_is_refused_clearly_before_anything_is_written(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *CONFIGS,
        "--trainer.accelerator",
        "cpu",
        "--trainer.devices",
        "1",
        "--trainer.default_root_dir",
        str(run_dir),
    ]
    result = run_project("fit", *args, cwd=REPO, timeout=120)
    assert result.returncode == 2
    assert "requires a GPU accelerator" in result.stderr
    assert not run_dir.exists()
