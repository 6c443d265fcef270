"""pytest's hooks and fixtures: a clean environment per test, no process in the fast subset.
What tests share besides (runs, checkpoints, paths) is in tests/helpers/."""

import contextlib
import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest
import torch
from helpers import processes
from warm_start import WarmServer

from trainfleet import program
from trainfleet.runtime.known_noise import silence_known_noise

pytest_plugins = ["multi_host"]  # the `hosts` fixture: several hosts with network stacks of their own

silence_known_noise()  # as every command does (trainfleet/main.py)
# The library runs for the template's project, as its `python -m project` does (project/__main__.py).
program.serve("project", "project.module.ClassificationModule")

# In-process runs share the 2 cores with the other worker's runs: OpenMP threads that wait for a busy core cost
# far more than they gain (a CNN test took 8x as long with 2 threads under load).
torch.set_num_threads(1)


SLOW_RULE = "mark it slow (@pytest.mark.slow, or pytestmark = pytest.mark.slow for a file): docs/development.md"


@contextlib.contextmanager
def no_child_processes(test: str):
    """Refuses, in a test not marked slow, what starts a process (a fork, a multiprocessing worker, a warm or fresh
    interpreter, a launcher or script): the fast subset (`-m "not slow"`) stays fast because no test in it can start
    one. Allowed: `git` queries, and a `python -c` query, as jsonargparse's stub resolver (typeshed_client) asks the
    interpreter its sys.path once."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise RuntimeError(f"{test} starts a process: {SLOW_RULE}")

    popen_init = subprocess.Popen.__init__

    def popen_if_quick(self: subprocess.Popen, args: object, *rest: object, **kwargs: object) -> None:
        argv = str(args).split() if isinstance(args, str | os.PathLike) else [str(arg) for arg in args]
        program = Path(argv[0]).name
        if program != "git" and not (program.startswith("python") and argv[1:2] == ["-c"]):
            refuse()
        popen_init(self, args, *rest, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "__init__", popen_if_quick)
        patch.setattr(os, "fork", refuse)
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
        patch.setattr(WarmServer, "start", refuse)
        yield


def process_guard(item: pytest.Item) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext() if item.get_closest_marker("slow") else no_child_processes(item.nodeid)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # module-scoped fixtures run here: a shared run counts too
    with process_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    with process_guard(item):
        return (yield)


@pytest.fixture(autouse=True)
def restore_environ():
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def close_warm_server():
    yield
    processes.close_warm_server()
