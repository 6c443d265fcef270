"""Generated wrong inputs through the real command line: value types and ranges, unknown keys, files that are not
configs, overlays combined. Every outcome is a command line that works or a refusal: exit 2, at most one screen
(25 lines), no traceback, nothing written.

Fast tier: parse and check only, in-process (``build_cli(run=False)`` parses, runs ``project/checks.py``
and builds the Trainer, model and data, as a run would before starting). Slow tier: a few real fits, each its own
process.
"""

import contextlib
import io
import sys
import tempfile
from pathlib import Path

import pytest
from helpers import DIGITS_CONFIG, REPO, project_env, quick_args, run_project
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from project.checks import OVERSUBSCRIBE_VAR
from project.cli import build_cli

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
