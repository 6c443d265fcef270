"""`python -m project` without its start-up, for the suite: a server that has imported it forks each run.

Every run of the suite used to pay the interpreter's start and the imports of torch, Lightning, torchmetrics
and torchvision (about 8 s on a 2-core machine) before its first line of ours; over about 150 runs that was
most of the suite's time. Here one server process imports the project once, and each run is a child forked
from it: a real, separate process that sets its working folder, environment, arguments and output files,
then runs ``-m project ARGS`` (or ``-c CODE``) the way ``python`` runs it, and exits the way Python exits.
Its local ranks are forked in turn (trainfleet/runtime/launcher.py). What only a fresh interpreter shows (the console
command, the program name, the launchers' own scripts) stays tested with real ``python -m project`` runs.

Protocol, one JSON line each way: ``{"start": {argv, cwd, env, stdout, stderr}}`` -> ``{"pid"}``;
``{"wait": pid, "timeout": s}`` -> ``{"returncode"}`` or ``{"timeout": true}``; ``{"ready": true}`` -> ``{}`` once
the imports are done.
"""

import contextlib
import fcntl
import json
import os
import runpy
import signal
import subprocess
import sys
import time
from pathlib import Path

SERVER = Path(__file__).resolve()


class WarmRun:
    """One run forked by the server; it leads its own session, which every process of the run belongs to."""

    def __init__(self, server: "WarmServer", pid: int, argv: list[str], stdout: Path, stderr: Path) -> None:
        self.server, self.pid, self.argv, self.stdout, self.stderr = server, pid, argv, stdout, stderr
        self.returncode: int | None = None

    def wait(self, timeout: float) -> int:
        """Waits for the run's first process, then for every process that holds its output (its ranks, their
        workers), as ``subprocess.run`` waits for a pipe every rank inherits."""
        deadline = time.monotonic() + timeout
        self.returncode = self.server.wait(self.pid, timeout)
        with open(self.stdout) as output:
            while not try_lock(output):
                if time.monotonic() > deadline:
                    self.kill()
                    raise subprocess.TimeoutExpired(f"run {self.pid}", timeout)
                time.sleep(0.05)
        return self.returncode

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):  # every process of the run ended already
            os.killpg(self.pid, signal.SIGKILL)


class WarmServer:
    """The client side: starts the server on first use (its imports take a start-up's time once)."""

    def __init__(self, env: dict[str, str], command: list[str] | None = None) -> None:
        """COMMAND starts the server (default: this interpreter running this file); another host's namespaces wrap
        it there (tests/test_network_faults.py), and every run it forks is on that host."""
        self.process = subprocess.Popen(
            command or [sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
        )

    def _ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            raise RuntimeError(f"the warm-start server ended (exit code {self.process.wait()})")
        return json.loads(reply)

    def start(self, argv: list[str], cwd: Path, env: dict[str, str], output_dir: Path) -> WarmRun:
        """Starts ``python ARGV`` (``-m MODULE ...`` or ``-c CODE ...``), its output going to files in OUTPUT_DIR."""
        stdout, stderr = output_dir / "stdout", output_dir / "stderr"
        request = {"argv": argv, "cwd": str(cwd), "env": env, "stdout": str(stdout), "stderr": str(stderr)}
        return WarmRun(self, self._ask({"start": request})["pid"], argv, stdout, stderr)

    def ready(self) -> None:
        """Returns once the server has imported the project: a test that times its runs does not time that."""
        self._ask({"ready": True})

    def wait(self, pid: int, timeout: float) -> int:
        reply = self._ask({"wait": pid, "timeout": timeout})
        if reply.get("timeout"):
            raise subprocess.TimeoutExpired(f"run {pid}", timeout)
        return reply["returncode"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=30)


def try_lock(file) -> bool:
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


# The server side.


def serve() -> None:
    import trainfleet.cli  # noqa: F401  the start-up every run shares; nothing else runs here, so no thread starts

    for line in sys.stdin:
        request = json.loads(line)
        if "start" in request:
            pid = os.fork()
            if pid == 0:
                run(request["start"])  # never returns: the child exits as Python does
            reply = {"pid": pid}
        elif "ready" in request:
            reply = {}
        else:
            reply = wait(request["wait"], request["timeout"])
        print(json.dumps(reply), flush=True)


def wait(pid: int, timeout: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"returncode": os.waitstatus_to_exitcode(status)}
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"timeout": True}
        time.sleep(0.02)


def run(request: dict) -> None:
    """In the forked child: becomes ``python ARGV`` run in CWD with ENV, printing to the two files."""
    os.setsid()  # the run's processes form a session: a timeout kills them all, a test can look for leftovers
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.path[:0] = [path for path in request["env"].get("PYTHONPATH", "").split(os.pathsep) if path]
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # not the server's requests
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        opened = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    fcntl.flock(1, fcntl.LOCK_SH)  # held while any process of the run holds its output: see WarmRun.wait
    sys.stdout.reconfigure(line_buffering=True)
    option, target, *args = request["argv"]
    if option == "-m":  # as `python -m MODULE`: sys.argv[0] and __main__ (which Lightning's launcher reads) set
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif option == "-c":
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    else:
        raise ValueError(f"python {option}: only -m MODULE and -c CODE are served")
    sys.exit(0)  # the child never returns into the server's loop


if __name__ == "__main__":
    serve()
