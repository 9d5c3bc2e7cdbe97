"""Hosts made of Linux network namespaces, joined by one bridge, for fault tests.

    bed = NetBed.create(tmp)                  # needs root; NetBedUnavailable otherwise
    web = bed.add_host("web")                 # a namespace with eth0 = 10.<n>.0.<i>/24
    proc = bed.spawn(web, ["python", ...], env, "web.log")
    bed.cut(web); bed.heal(web)               # its link down / up: nothing in or out
    bed.kill(proc); bed.kill_host(web)        # SIGKILL one process group / everything there
    bed.close()

The bridge lives in a namespace of its own (the "switch"), so the bed adds no
interface to the machine's network except one: the test process's own leg
(``10.<n>.0.254``), through which it drives and inspects the hosts. Nothing is
routed: the subnet is directly connected, and no host has a default route, so
traffic stays between the bed's namespaces. Each bed has a random tag, so beds
of several people on one machine never share names or addresses.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class NetBedUnavailable(RuntimeError):
    """Namespaces cannot be made here (not root, no ``ip``, a container without CAP_NET_ADMIN)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Host:
    name: str
    ns: str
    ip: str
    port: str  # its interface on the switch: down = cut off


@dataclass
class NetBed:
    tag: str
    subnet: int
    directory: Path
    hosts: dict[str, Host] = field(default_factory=dict)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"hb{self.tag}sw"

    @property
    def control_ip(self) -> str:
        return f"10.{self.subnet}.0.254"

    @classmethod
    def create(cls, directory: Path) -> NetBed:
        if os.geteuid() != 0:
            raise NetBedUnavailable("network namespaces need root (this run is not root)")
        used = _ip("-4", "-o", "addr", check=False).stdout
        subnet = next(n for n in range(200, 250) if f" 10.{n}.0." not in used)
        bed = cls(secrets.token_hex(2), subnet, directory)
        try:
            _ip("netns", "add", bed.switch)
        except (RuntimeError, FileNotFoundError) as exc:
            raise NetBedUnavailable(f"cannot create a network namespace: {exc}") from None
        _ip("-n", bed.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", bed.switch, "link", "set", "br0", "up")
        # The test process's leg: one veth end stays in this namespace.
        leg = f"hb{bed.tag}c"
        _ip("link", "add", leg, "type", "veth", "peer", "name", f"hb{bed.tag}cp")
        _ip("link", "set", f"hb{bed.tag}cp", "netns", bed.switch)
        _ip("-n", bed.switch, "link", "set", f"hb{bed.tag}cp", "master", "br0", "up")
        _ip("addr", "add", f"{bed.control_ip}/24", "dev", leg)
        _ip("link", "set", leg, "up")
        return bed

    def add_host(self, name: str) -> Host:
        index = len(self.hosts) + 1
        ns, port = f"hb{self.tag}{name}", f"p{index}"
        inside, outside = f"hb{self.tag}{index}i", f"hb{self.tag}{index}o"
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", inside, "type", "veth", "peer", "name", outside)
        _ip("link", "set", inside, "netns", ns)
        _ip("link", "set", outside, "netns", self.switch)
        _ip("-n", ns, "link", "set", inside, "name", "eth0")
        host = Host(name, ns, f"10.{self.subnet}.0.{index}", port)
        _ip("-n", ns, "addr", "add", f"{host.ip}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", self.switch, "link", "set", outside, "name", port)
        _ip("-n", self.switch, "link", "set", port, "master", "br0", "up")
        self.hosts[name] = host
        return host

    def spawn(
        self,
        host: Host,
        argv: list[str],
        env: dict[str, str],
        log_name: str,
        *,
        user: str | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` in a process group of its own."""
        prefix = ["ip", "netns", "exec", host.ns, *(["runuser", "-u", user, "--"] if user else [])]
        log = open(self.directory / log_name, "ab")  # noqa: SIM115 - handed to the child
        process = subprocess.Popen(
            [*prefix, *argv],
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.processes.append(process)
        return process

    def run(
        self, host: Host, argv: list[str], env: dict[str, str], *, user: str | None = None
    ) -> str:
        prefix = ["ip", "netns", "exec", host.ns, *(["runuser", "-u", user, "--"] if user else [])]
        done = subprocess.run(
            [*prefix, *argv], env=env, capture_output=True, text=True, check=False, timeout=120
        )
        if done.returncode != 0:
            raise RuntimeError(f"{argv} on {host.name} failed:\n{done.stdout}{done.stderr}")
        return done.stdout

    def cut(self, host: Host) -> None:
        """Drop every packet to and from ``host`` (its cable pulled at the switch)."""
        _ip("-n", self.switch, "link", "set", host.port, "down")

    def heal(self, host: Host) -> None:
        _ip("-n", self.switch, "link", "set", host.port, "up")

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL ``process``'s whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def pids(self, host: Host) -> list[int]:
        return [int(p) for p in _ip("netns", "pids", host.ns, check=False).stdout.split()]

    def kill_host(self, host: Host) -> int:
        """SIGKILL every process on ``host``, as a power cut would; return how many."""
        pids = self.pids(host)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for process in self.processes:
            if process.pid in pids:
                process.wait()
        return len(pids)

    def close(self) -> None:
        for host in self.hosts.values():
            self.kill_host(host)
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        time.sleep(0.2)
        for host in self.hosts.values():
            _ip("netns", "del", host.ns, check=False)
        _ip("link", "del", f"hb{self.tag}c", check=False)
        _ip("netns", "del", self.switch, check=False)
