"""The launch environment (trainfleet/launch_environment.py): a variable the run's cluster environment would read
that cannot work is refused before anything starts, naming the variable, its value and its range; exit 2, no run
folder."""

import sys

import pytest
from helpers import quick_args
from jsonargparse import Namespace
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment
from test_cli_errors import ONE_SCREEN, _refused

from trainfleet.launch_environment import chosen_environment, environment_problem, launch_problem

TORCHRUN_2X2 = {  # what torchrun sets for the second process of the second node of --nnodes 2 --nproc-per-node 2
    "TORCHELASTIC_RUN_ID": "none",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "ROLE_RANK": "3",
    "ROLE_WORLD_SIZE": "4",
}
LAUNCH_VARS = (*TORCHRUN_2X2, "NODE_RANK", "STANDALONE_PORT", "SLURM_NTASKS", "SLURM_JOB_NAME")


@pytest.fixture(autouse=True)
def clean_launch_environment(monkeypatch):
    """No leftover launcher variables from the suite's process; LightningCLI warns when sys.argv (pytest's) and args
    are both given."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "argv", ["project"])


@pytest.mark.parametrize(
    ("variables", "flags", "message"),
    [
        (
            {"MASTER_PORT": "99999"},
            [],
            "MASTER_PORT='99999' in the environment is out of range: it must be in [1, 65535] (a TCP port",
        ),
        (
            {"MASTER_PORT": "abc"},
            [],
            "MASTER_PORT='abc' in the environment is not an integer: it must be an integer in [1, 65535]",
        ),
        (
            {"NODE_RANK": "5", "MASTER_PORT": "29500"},
            ["--trainer.num_nodes", "2"],
            "NODE_RANK='5' in the environment is out of range: it must be in [0, 1] (this node's rank, 0 to"
            " trainer.num_nodes - 1, with --trainer.num_nodes 2)",
        ),
        ({"MASTER_ADDR": ""}, [], "MASTER_ADDR='' in the environment names no host"),
        (
            {**TORCHRUN_2X2, "RANK": "0", "GROUP_RANK": "0", "ROLE_RANK": "0", "LOCAL_RANK": "0"},
            ["--trainer.devices", "1"],
            "WORLD_SIZE='4' in the environment (from torchrun) must be 1, what --trainer.num_nodes 1 and"
            " --trainer.devices 1 give",
        ),
    ],
    ids=["port-99999", "port-abc", "node-rank-5-of-2", "empty-address", "torchrun-world-size"],
)
def test_a_launch_variable_that_cannot_work_is_refused_before_anything_starts(
    capsys, monkeypatch, tmp_path, variables, flags, message
):
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    stderr = _refused(capsys, tmp_path / "run", "fit", *quick_args(tmp_path / "run", *flags))
    assert message in stderr, stderr
    assert len(stderr.splitlines()) <= ONE_SCREEN and "Traceback" not in stderr, stderr


@pytest.mark.parametrize(
    ("environment", "environ", "num_nodes", "devices"),
    [
        (LightningEnvironment, {}, 1, 1),
        (LightningEnvironment, {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1", "NODE_RANK": "1"}, 2, 8),
        (LightningEnvironment, {"MASTER_PORT": "65535", "LOCAL_RANK": "7", "GROUP_RANK": "1"}, 2, 8),
        (LightningEnvironment, {"NODE_RANK": "3", "LOCAL_RANK": "5"}, 4, None),  # devices auto: no upper bound
        (LightningEnvironment, {"WORLD_SIZE": "99", "RANK": "-1"}, 1, 1),  # not read by LightningEnvironment
        (TorchElasticEnvironment, TORCHRUN_2X2, 2, 2),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "NODE_RANK": "7"}, 2, 2),  # not read under torchrun
        (TorchElasticEnvironment, {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}, 1, None),
        (SLURMEnvironment, {"NODE_RANK": "9", "LOCAL_RANK": "9", "MASTER_PORT": "29500"}, 1, 1),  # SLURM_* read
        (None, {"MASTER_PORT": "abc"}, 1, 1),  # LSF, MPI, ...: not checked here
    ],
)
def test_a_launch_environment_that_works_passes(environment, environ, num_nodes, devices):
    assert environment_problem(environment, environ, num_nodes, devices) is None


@pytest.mark.parametrize(
    ("environment", "environ", "num_nodes", "devices", "message"),
    [
        (LightningEnvironment, {"MASTER_ADDR": "node 0"}, 1, 1, "MASTER_ADDR='node 0' in the environment names no"),
        (LightningEnvironment, {"MASTER_PORT": "0"}, 1, 1, "MASTER_PORT='0' in the environment is out of range"),
        (LightningEnvironment, {"MASTER_PORT": ""}, 1, 1, "MASTER_PORT='' in the environment is not an integer"),
        (LightningEnvironment, {"STANDALONE_PORT": "70000"}, 1, 1, "STANDALONE_PORT='70000' in the environment is"),
        (LightningEnvironment, {"NODE_RANK": "-1"}, 2, 1, "NODE_RANK='-1' in the environment is out of range"),
        (LightningEnvironment, {"NODE_RANK": "one"}, 2, 1, "NODE_RANK='one' in the environment is not an integer"),
        (LightningEnvironment, {"GROUP_RANK": "2"}, 2, 1, "GROUP_RANK='2' in the environment is out of range"),
        (LightningEnvironment, {"LOCAL_RANK": ""}, 1, 1, "LOCAL_RANK='' in the environment is not an integer"),
        (LightningEnvironment, {"LOCAL_RANK": "2"}, 1, 2, "LOCAL_RANK='2' in the environment is out of range: it"),
        (LightningEnvironment, {"LOCAL_RANK": "-2"}, 1, None, "LOCAL_RANK='-2' in the environment is out of range"),
        (SLURMEnvironment, {"MASTER_PORT": "65536"}, 1, 1, "MASTER_PORT='65536' in the environment is out of range"),
        (TorchElasticEnvironment, {"RANK": "0"}, 1, 1, "TORCHELASTIC_RUN_ID is set (a torchrun launch) but"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "RANK": "4"}, 2, 2, "RANK='4' in the environment is out of range"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "WORLD_SIZE": "x"}, 2, 2, "WORLD_SIZE='x' in the environment is"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "WORLD_SIZE": "0"}, 2, None, "WORLD_SIZE='0' in the environment"),
        (
            TorchElasticEnvironment,
            {**TORCHRUN_2X2, "WORLD_SIZE": "8"},
            2,
            4,
            "LOCAL_WORLD_SIZE='2' in the environment (from torchrun) must",
        ),
        (TorchElasticEnvironment, TORCHRUN_2X2, 4, None, "GROUP_WORLD_SIZE='2' in the environment (from torchrun)"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "LOCAL_RANK": "2"}, 2, 2, "LOCAL_RANK='2' in the environment is"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "GROUP_RANK": "2"}, 2, 2, "GROUP_RANK='2' in the environment is"),
        (TorchElasticEnvironment, {**TORCHRUN_2X2, "ROLE_RANK": "-1"}, 2, 2, "ROLE_RANK='-1' in the environment is"),
    ],
)
def test_a_launch_environment_that_cannot_work_names_the_variable_its_value_and_range(
    environment, environ, num_nodes, devices, message
):
    problem = environment_problem(environment, environ, num_nodes, devices)
    assert problem is not None and problem.startswith(message), problem
    assert "\n" not in problem


def test_the_environment_checked_is_the_one_lightning_will_use(monkeypatch):
    assert chosen_environment(None) is LightningEnvironment
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert chosen_environment(None) is SLURMEnvironment
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun inside an allocation: Lightning's first choice
    assert chosen_environment(None) is TorchElasticEnvironment
    named = Namespace(class_path="lightning.fabric.plugins.environments.LightningEnvironment")
    assert chosen_environment([Namespace(class_path="trainfleet.checkpoints.files.AtomicCheckpointIO"), named]) is (
        LightningEnvironment
    )


def test_the_config_s_counts_bound_the_ranks():
    assert launch_problem(Namespace(num_nodes=2, devices="auto", plugins=None), {"NODE_RANK": "1"}) is None
    two_devices = Namespace(num_nodes=1, devices=[0, 1], plugins=None)
    problem = launch_problem(two_devices, {"NODE_RANK": "1", "LOCAL_RANK": "0"})
    assert problem.startswith("NODE_RANK='1' in the environment is out of range: it must be in [0, 0]")
    problem = launch_problem(two_devices, {"LOCAL_RANK": "2"})
    assert "it must be in [0, 1]" in problem
