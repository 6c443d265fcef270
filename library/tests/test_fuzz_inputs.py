"""Generated wrong inputs through the real command line: value types and ranges, unknown keys, files that are not
configs, overlays combined. Every outcome is a command line that works or a refusal: exit 2, at most one screen
(25 lines), no traceback, nothing written.

The Trainer's numeric arguments and the launch environment's variables get their wrong values from the code itself:
the Trainer's signature with each argument's range (``trainfleet/trainer_ranges.py``) and the variables each cluster
environment's checks read (``trainfleet/launch_environment.py``): many per second through the check functions, a few
through the command line, each refused with exit 2 in a line or two.

Fast tier: parse and check only, in-process (``build_cli(run=False)`` parses, runs ``trainfleet/checks.py``
and builds the Trainer, model and data, as a run would before starting). Slow tier: a few real fits, each its own
process.
"""

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from helpers import DIGITS_CONFIG, REPO, project_env, quick_args, run_project
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch import Trainer

from trainfleet.checks import OVERSUBSCRIBE_VAR
from trainfleet.cli import build_cli
from trainfleet.launch_environment import CHECKED_VARIABLES, PORT_RANGE, environment_problem
from trainfleet.trainer_ranges import TRAINER_RANGES, Amount, Batches, Count, Unchecked, numeric_arguments

ONE_SCREEN = 25
KEYS = (  # a sample of every kind of key: the Trainer's, the model's, the data's, the template's own
    "seed_everything",
    "trainer.max_epochs",
    "trainer.max_steps",
    "trainer.max_time",
    "trainer.accumulate_grad_batches",
    "trainer.log_every_n_steps",
    "trainer.gradient_clip_val",
    "trainer.limit_train_batches",
    "trainer.val_check_interval",
    "trainer.devices",
    "trainer.num_nodes",
    "trainer.precision",
    "trainer.strategy",
    "trainer.default_root_dir",
    "model.label_smoothing",
    "model.network.init_args.hidden_sizes",
    "model.network.init_args.dropout",
    "model.scheduler.init_args.warmup_steps",
    "model.scheduler_interval",
    "data.init_args.batch_size",
    "data.init_args.val_fraction",
    "data.init_args.num_workers",
    "checkpoint.save_top_k",
    "checkpoint.every_n_train_steps",
    "preemption.check_every_n_steps",
)
OVERLAYS = sorted(str(path) for path in (REPO / "configs").glob("*.yaml") if path.name not in ("digits.yaml",))
# Overlays whose data needs files or downloads: parsed, but building them would read data that is not here.
NEEDS_DATA = ("image_folder.yaml", "mnist.yaml", "streaming.yaml", "table.yaml", "gpu.yaml")

values = st.one_of(
    st.integers(min_value=-(2**40), max_value=2**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from(["null", "true", "false", "[]", "[1, -2]", "{}", "0:00:01:00", "auto", "-1", "0", "1e309"]),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
)
unknown_keys = st.from_regex(r"(trainer|model|data|checkpoint)\.[a-z_]{1,12}", fullmatch=True)
not_configs = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"- a\n- list\n", b"just a string\n", b"trainer: 3\n", b"trainer:\n  callbacks+: 5\n", b"{"]),
)


@st.composite
def command_lines(draw) -> list[str]:
    args = ["--config", str(DIGITS_CONFIG)]
    for overlay in draw(st.lists(st.sampled_from(OVERLAYS), max_size=2)):
        if not overlay.endswith(NEEDS_DATA):
            args += ["--config", overlay]
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.one_of(st.sampled_from(KEYS), unknown_keys))
        args += [f"--{key}", draw(values)]
    if draw(st.booleans()):
        args += ["--config", draw(not_configs).hex()]  # replaced by a file of those bytes (below)
    return args


def parse_and_check(args: list[str], folder: Path) -> tuple[int, str]:
    """``ARGS`` built as a run would be, without running: (exit code, 0 when it works; what it printed to stderr)."""
    for index, arg in enumerate(args):
        if index and args[index - 1] == "--config" and not arg.endswith(".yaml"):
            path = folder / f"not_a_config_{index}.yaml"
            path.write_bytes(bytes.fromhex(arg))
            args[index] = str(path)
    stderr, saved_argv = io.StringIO(), sys.argv
    sys.argv = ["project"]  # LightningCLI warns when both sys.argv (pytest's) and args are given
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_cli([*args, "--trainer.default_root_dir", str(folder / "run")], run=False)
            code = 0
        except SystemExit as error:
            code = error.code
        finally:
            sys.argv = saved_argv
    return code, stderr.getvalue()


@settings(
    max_examples=15,  # about 1 s each (Trainer, model and data built): the fast tier stays fast
    phases=(Phase.explicit, Phase.reuse, Phase.generate),  # no shrinking: a failure shows its example as generated
    deadline=None,
    derandomize=True,  # the same examples in every run: a failure here is reproducible, not a flake
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(command_lines())
@example(["--config", str(DIGITS_CONFIG), "--config", b"trainer: 0\n".hex()])  # found by this test: a StopIteration
@example(["--config", str(DIGITS_CONFIG), "--config", b"trainer: 3\n".hex()])
@example(["--config", str(DIGITS_CONFIG), "--config", bytes([0x80]).hex()])  # found: a UnicodeDecodeError
def test_every_wrong_input_works_or_is_refused_on_one_screen(args):
    with tempfile.TemporaryDirectory() as folder:
        code, stderr = parse_and_check(list(args), Path(folder))
        assert code in (0, 2), (args, code, stderr[-2000:])
        assert "Traceback" not in stderr, (args, stderr[-2000:])
        assert len(stderr.splitlines()) <= ONE_SCREEN, (args, stderr)
        if code == 2:
            assert "error:" in stderr and not (Path(folder) / "run").exists(), (args, stderr)


SHORT = 3  # lines of stderr a refusal of one number or variable may take: the usage line, the error, a wrapped line
FAST_SETTINGS = settings(max_examples=300, deadline=None, derandomize=True, phases=(Phase.explicit, Phase.generate))
CLI_SETTINGS = settings(  # about 0.3 s each: parsed and checked, refused before anything is built
    max_examples=12,
    deadline=None,
    derandomize=True,
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=[HealthCheck.too_slow],
)
TRAINER_NUMBERS = numeric_arguments(Trainer.__init__)


def wrong_numbers(rule) -> st.SearchStrategy:
    """Values outside RULE's range, from its own bounds: a new kind of rule must say here what is wrong for it."""
    if isinstance(rule, Count):
        return st.integers(max_value=rule.low - 1).filter(lambda value: value not in rule.special)
    if isinstance(rule, Amount):
        return st.floats(max_value=rule.low, allow_nan=False).filter(lambda value: value < rule.low)
    if isinstance(rule, Batches):
        fractions = st.floats(min_value=1, allow_nan=False).filter(lambda value: not value.is_integer())
        below = st.floats(max_value=0, allow_nan=False).filter(lambda value: value < 0 or (rule.low and value == 0))
        timed = [st.just("00:00:00:00")] if rule.timed else []
        return st.one_of(st.integers(max_value=rule.low - 1), fractions, below, *timed)
    assert isinstance(rule, Unchecked), f"say the wrong values of {type(rule).__name__}"
    return st.integers(max_value=-2)  # refused by Lightning or the parser, naming it


@st.composite
def trainer_numbers(draw, checked_here: bool = False) -> tuple[str, object]:
    """(an argument of the Trainer's signature that may be a number, a value outside its range)."""
    names = [name for name in TRAINER_NUMBERS if not (checked_here and isinstance(TRAINER_RANGES[name], Unchecked))]
    name = draw(st.sampled_from(names))
    return name, draw(wrong_numbers(TRAINER_RANGES[name]))


@FAST_SETTINGS
@given(trainer_numbers(checked_here=True))
def test_every_numeric_trainer_argument_refuses_its_wrong_values_in_one_line(case):
    name, value = case
    problem = TRAINER_RANGES[name].problem(f"trainer.{name}", value)
    assert problem is not None and f"trainer.{name} must be" in problem and "\n" not in problem, (case, problem)


@CLI_SETTINGS
@given(trainer_numbers())
@example(("val_check_interval", 0))
@example(("check_val_every_n_epoch", 0))
@example(("num_sanity_val_steps", -3))
def test_a_trainer_number_out_of_its_range_is_refused_through_the_command_line(case):
    name, value = case
    with tempfile.TemporaryDirectory() as folder:
        code, stderr = parse_and_check(["--config", str(DIGITS_CONFIG), f"--trainer.{name}", str(value)], Path(folder))
        assert code == 2 and "error:" in stderr and f"{name}" in stderr, (case, code, stderr[-2000:])
        # Not checked here (Unchecked): refused by Lightning or the parser, whose choices for precision take 9 lines.
        short = ONE_SCREEN if isinstance(TRAINER_RANGES[name], Unchecked) else SHORT
        assert "Traceback" not in stderr and len(stderr.splitlines()) <= short, (case, stderr)
        assert not (Path(folder) / "run").exists()


NOT_INTEGERS = st.text(alphabet="abcex.- ", max_size=6)  # no digit: int() refuses every one
ADDRESSES = st.sampled_from(["", " ", "node 0", "10.0.0.1\t", "\n"])


def wrong_launch_values(name: str, nodes: int, devices: int) -> st.SearchStrategy[str]:
    """Values of the launch variable NAME that cannot work with NODES nodes of DEVICES processes: the range each
    must be in, as torch, torchrun and Lightning use it."""
    if name == "MASTER_ADDR":
        return ADDRESSES
    world = nodes * devices
    ranges = {
        **dict.fromkeys(("MASTER_PORT", "STANDALONE_PORT"), PORT_RANGE),
        **dict.fromkeys(("NODE_RANK", "GROUP_RANK"), (0, nodes - 1)),
        **dict.fromkeys(("RANK", "ROLE_RANK"), (0, world - 1)),
        "LOCAL_RANK": (0, devices - 1),
        "WORLD_SIZE": (world, world),
        "LOCAL_WORLD_SIZE": (devices, devices),
        "GROUP_WORLD_SIZE": (nodes, nodes),
        "ROLE_WORLD_SIZE": (1, None),  # any size from 1 (a ROLE_RANK beyond it is ROLE_RANK's problem)
    }
    low, high = ranges[name]
    below = st.integers(max_value=low - 1)
    numbers = below if high is None else st.one_of(below, st.integers(min_value=high + 1))
    return st.one_of(numbers.map(str), NOT_INTEGERS)


def torchrun_variables(nodes: int, devices: int) -> dict[str, str]:
    """What torchrun sets for the first process of the last node of NODES nodes of DEVICES processes."""
    rank, world = (nodes - 1) * devices, nodes * devices
    return {
        "TORCHELASTIC_RUN_ID": "none",
        **{"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "RANK": str(rank), "WORLD_SIZE": str(world)},
        **{"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(devices), "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world)},
        **{"GROUP_RANK": str(nodes - 1), "GROUP_WORLD_SIZE": str(nodes)},
    }


@st.composite
def launch_cases(draw, quiet_ranks: bool = True) -> tuple[type, dict[str, str], int, int, str]:
    """(an environment, its variables with one wrong, nodes, devices, the wrong one's name). QUIET_RANKS False: no
    LOCAL_RANK but 0, whose process says the refusal (a launcher starts every process with the same command)."""
    environment = draw(st.sampled_from(list(CHECKED_VARIABLES)))
    nodes, devices = draw(st.integers(1, 4)), draw(st.integers(1, 8))
    names = [name for name in CHECKED_VARIABLES[environment] if quiet_ranks or name != "LOCAL_RANK"]
    name = draw(st.sampled_from(names))
    variables = torchrun_variables(nodes, devices) if environment is TorchElasticEnvironment else {}
    variables[name] = draw(wrong_launch_values(name, nodes, devices))
    return environment, variables, nodes, devices, name


@FAST_SETTINGS
@given(launch_cases())
def test_every_launch_variable_refuses_its_wrong_values_naming_it_and_its_value(case):
    environment, variables, nodes, devices, name = case
    problem = environment_problem(environment, variables, nodes, devices)
    assert problem is not None and f"{name}={variables[name]!r} in the environment" in problem, (case, problem)
    assert "\n" not in problem.replace(repr(variables[name]), "")


LAUNCH_VARS = {name for names in CHECKED_VARIABLES.values() for name in names} | {"TORCHELASTIC_RUN_ID", "NODE_RANK"}


@CLI_SETTINGS
@given(launch_cases(quiet_ranks=False).filter(lambda case: case[0] is not SLURMEnvironment))
@example((LightningEnvironment, {"MASTER_PORT": "99999"}, 1, 1, "MASTER_PORT"))
@example((LightningEnvironment, {"MASTER_PORT": "abc"}, 1, 1, "MASTER_PORT"))
@example((LightningEnvironment, {"NODE_RANK": "5"}, 2, 1, "NODE_RANK"))
def test_a_launch_variable_out_of_its_range_is_refused_through_the_command_line(case):
    """Through the parser with the environment set as a launcher would set it (SLURM's own counts: cli.py)."""
    _, variables, nodes, devices, name = case
    flags = ["--trainer.num_nodes", str(nodes), "--trainer.devices", str(devices)]
    clean = {key: value for key, value in os.environ.items() if key not in LAUNCH_VARS and not key.startswith("SLURM_")}
    with tempfile.TemporaryDirectory() as folder, mock.patch.dict(os.environ, {**clean, **variables}, clear=True):
        os.environ[OVERSUBSCRIBE_VAR] = "1"  # devices up to 8 on this host's cores: not what is tested here
        code, stderr = parse_and_check(["--config", str(DIGITS_CONFIG), *flags], Path(folder))
        assert code == 2 and f"error: {name}=" in stderr, (case, code, stderr[-2000:])
        assert "Traceback" not in stderr and len(stderr.splitlines()) <= SHORT + 1, (case, stderr)
        assert not (Path(folder) / "run").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flags", "code", "message"),
    [
        (["--trainer.max_epochs", "-1", "--trainer.max_steps", "3"], 0, "`Trainer.fit` stopped: `max_steps=3` reached"),
        (["--trainer.accumulate_grad_batches", "0"], 2, "trainer.accumulate_grad_batches must be >= 1"),
        (["--trainer.devices", "99"], 2, "trainer.devices 99 starts 99 CPU processes on this host"),
    ],
    ids=["infinite-epochs", "accumulate-0", "99-processes"],
)
def test_a_real_fit_works_or_is_refused_on_one_screen(tmp_path, flags, code, message):
    env = project_env()
    env.pop(OVERSUBSCRIBE_VAR)  # the suite's runs insist on more processes than cores; this one must not
    result = run_project("fit", *quick_args(tmp_path / "run", *flags), cwd=tmp_path, timeout=300, env=env)
    assert result.returncode == code, result.stderr[-3000:]
    assert message in result.stdout + result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.splitlines()) <= ONE_SCREEN or code == 0, result.stderr
    assert (tmp_path / "run").exists() == (code == 0)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("variables", "flags", "message"),
    [
        ({"MASTER_PORT": "99999"}, [], "MASTER_PORT='99999' in the environment"),
        ({"NODE_RANK": "5"}, ["--trainer.num_nodes", "2"], "NODE_RANK='5' in the environment is out of range"),
        ({}, ["--trainer.check_val_every_n_epoch", "0"], "trainer.check_val_every_n_epoch must be >= 1"),
    ],
    ids=["port-99999", "node-rank-5-of-2", "check-val-0"],
)
def test_a_real_fit_refuses_a_launch_variable_or_trainer_number_on_two_lines(tmp_path, variables, flags, message):
    """A real process: the message as a user sees it, the exit code, and no run folder."""
    env = project_env(**variables)
    result = run_project("fit", *quick_args(tmp_path / "run", *flags), cwd=tmp_path, timeout=300, env=env)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) <= SHORT, result.stderr
    assert not (tmp_path / "run").exists()
