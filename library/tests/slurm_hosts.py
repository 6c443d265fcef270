"""A SLURM cluster across the test hosts (tests/multi_host.py): slurmctld and one slurmd on host 0, one slurmd on host
1, each node at its host's own address, so that a job's ranks meet across a real network as on a cluster.

Its configuration is its own (``SLURM_CONF``), apart from tests/fixtures/slurm_cluster.sh's cluster on this machine's
loopback, which may run at the same time; munge, which authenticates both, is that script's (a socket on the shared
file system). The clients (sbatch, squeue, scontrol) run on host 0, where the controller listens. ``slurm_hosts``
(module fixture) starts it and stops it; where it cannot start, the tests skip and say why.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from multi_host import Host, Hosts
from slurm_cluster import ACTIVE_STATES

CONTROLLER_PORT = 16917
NODE_PORT = 17101  # the same on every host: each has its own network stack
START_S = 60


@dataclass(frozen=True)
class HostCluster:
    conf: Path
    client: Host  # where sbatch and friends reach the controller
    names: tuple[str, ...]

    def run(
        self, *argv: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """A SLURM client command on host 0, with this cluster's configuration."""
        environ = {**(env or {}), "SLURM_CONF": str(self.conf)}
        command = self.client.command(list(argv))
        return subprocess.run(
            command, env=environ, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )

    def wait(self, job: str, timeout: float = 300) -> str:
        """The job's final state (COMPLETED, FAILED, ...), polled: ``sbatch --wait`` polls at 2, 10 and 42 s, which
        made a 9 s job a 42 s one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            fields = dict(
                field.split("=", 1)
                for field in self.run("scontrol", "show", "job", "-o", job).stdout.split()
                if "=" in field
            )
            if fields.get("JobState", "PENDING") not in ACTIVE_STATES:
                return fields["JobState"]
            time.sleep(0.3)
        self.run("scancel", job)
        pytest.fail(f"job {job} on the hosts' cluster not finished after {timeout:.0f} s (cancelled)")

    def idle(self) -> bool:
        lines = self.run("sinfo", "-h", "-N", "-o", "%N %t").stdout.splitlines()
        states = dict(line.split() for line in lines if len(line.split()) == 2)
        return all(states.get(name) == "idle" for name in self.names)


def conf_text(hosts: list[Host], directory: Path) -> str:
    nodes = "".join(
        f"NodeName={host.name} NodeHostname={host.name} NodeAddr={host.address} Port={NODE_PORT} CPUs=1"
        " RealMemory=1000 State=UNKNOWN\n"
        for host in hosts
    )
    return f"""ClusterName=hosts
SlurmctldHost={hosts[0].name}({hosts[0].address})
SlurmctldPort={CONTROLLER_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation={directory}/state
SlurmdSpoolDir={directory}/spool/%n
SlurmctldPidFile={directory}/run/slurmctld.pid
SlurmdPidFile={directory}/run/slurmd-%n.pid
SlurmctldLogFile={directory}/log/slurmctld.log
SlurmdLogFile={directory}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=60
InactiveLimit=0
Waittime=0
MpiDefault=none
SwitchType=switch/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={directory}/log/jobcomp.log
{nodes}PartitionName=hosts Nodes={",".join(host.name for host in hosts)} Default=YES MaxTime=INFINITE State=UP
"""


def cannot_start() -> str | None:
    if shutil.which("slurmctld") is None or shutil.which("slurmd") is None:
        return "no slurmctld/slurmd (tests/fixtures/slurm_cluster.sh up installs them)"
    munge = subprocess.run("munge -n | unmunge", shell=True, capture_output=True, timeout=30)
    if munge.returncode:
        return "munge does not answer (tests/fixtures/slurm_cluster.sh up starts it)"
    return None


def start(hosts: list[Host], directory: Path) -> HostCluster:
    for folder in ("state", "run", "log", *(f"spool/{host.name}" for host in hosts)):
        (directory / folder).mkdir(parents=True, exist_ok=True)
    conf = directory / "slurm.conf"
    conf.write_text(conf_text(hosts, directory))
    cluster = HostCluster(conf, hosts[0], tuple(host.name for host in hosts))
    daemons = [(hosts[0], ["slurmctld", "-c", "-f", str(conf)])]
    daemons += [(host, ["slurmd", "-N", host.name, "-f", str(conf)]) for host in hosts]
    deadline = time.monotonic() + START_S
    for host, argv in daemons:  # each daemonizes, staying in its host's namespaces
        if subprocess.run(host.daemon_command(argv), capture_output=True, timeout=60).returncode:
            deadline = 0  # the logs say why
            break
    while time.monotonic() < deadline:
        if cluster.idle():
            return cluster
        time.sleep(0.5)
    logs = "".join(path.read_text()[-1500:] for path in (directory / "log").glob("*.log"))
    stop(cluster, directory)
    raise RuntimeError(f"the nodes were not idle within {START_S} s:\n{logs}")


def stop(cluster: HostCluster, directory: Path) -> None:
    cluster.run("scancel", "--partition", "hosts", timeout=30)
    cluster.run("scontrol", "shutdown", timeout=30)
    time.sleep(1)
    for pid_file in (directory / "run").glob("*.pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.fixture(scope="module")
def slurm_hosts(hosts: Hosts, tmp_path_factory) -> Iterator[HostCluster]:
    reason = cannot_start()
    if reason:
        pytest.skip(f"SLURM across hosts: {reason}")
    directory = tmp_path_factory.mktemp("slurm_hosts")
    try:
        cluster = start([hosts[0], hosts[1]], directory)
    except RuntimeError as error:
        pytest.skip(f"SLURM across hosts would not start: {error}")
    yield cluster
    stop(cluster, directory)
