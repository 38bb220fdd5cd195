"""Hosts emulated in Linux network namespaces, on one machine (root, `ip`): what the launch
scripts and tests/distributed/test_hosts.py run multi-host jobs on.

    python3 launch/emulated_hosts.py up 2                 # h0 10.213.77.1, h1 10.213.77.2
    python3 launch/emulated_hosts.py exec h1 -- ip -br addr     # like ssh: words joined, run by sh
    python3 launch/emulated_hosts.py exec 10.213.77.2 -- 'echo $HOME'
    python3 launch/emulated_hosts.py kill h1              # every process of h1 (kill -9)
    python3 launch/emulated_hosts.py list                 # the hosts, as JSON
    python3 launch/emulated_hosts.py down                 # processes, namespaces, veths, bridge

Each host is a network namespace `<prefix>h<i>` with `lo` and one veth (`eth0`, address
`<subnet>.<i+1>/24`); the veths' other ends join a bridge `<prefix>br` in the root namespace
that has no address: the hosts reach each other and nothing else (no route leaves the subnet,
and the machine's own addresses are not on it). On a host the machine's name resolves to the
host's address, as a cloud VM's /etc/hosts maps its name to its internal address (`ip netns
exec` puts /etc/netns/<namespace>/hosts over /etc/hosts): what gloo, JAX's CPU collectives,
tells the other processes to connect to. The prefix (`arh<k>`) and subnet
(`10.213.<77+k>.0/24`) are the first k whose names and subnet nothing on the machine uses.

A host has its own HOME and TMPDIR. HOME is the same path on every host (`<root>/home`, as
/home/user is on real VMs) but host-local: each command runs in a mount namespace where that
path is bound to the host's own folder, so a file one host writes under ~ is not there on the
others (what a shared-workdir check must catch). TMPDIR differs by path (`<root>/h<i>/tmp`):
Ray keeps its sockets and session there (`ray start --temp-dir`, or $TMPDIR/ray). Everything
else of the filesystem (the checkout, its virtual environment) is shared, as if rsynced.

`exec` runs with a fresh environment, as ssh would: PATH, LANG, HOME, TMPDIR, USER, and
ASYNCRL_HOST (the host's name), plus the cluster's `up --env K=V` and the call's `--env K=V`;
cwd is HOME. The state (hosts, root)
is `<root>/hosts.json`; `--root` (default $ASYNCRL_HOSTS_ROOT, else /tmp/arh0) names it.

Every process of a host lives in its namespace, so `kill` and `down` find each one (`ip netns
pids`), including daemons such as Ray's: nothing outlives `down`. Not `ray stop` here: the
namespaces share one process table, and `ray stop` kills every Ray process on the machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

STATE = "hosts.json"
SUBNET_BASE = (10, 213, 77)  # + k in the third octet: an unusual RFC 1918 /24
MAX_CLUSTERS = 16


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def require_root_and_ip() -> None:
    """Raises naming what is missing: emulated hosts need root and iproute2."""
    if shutil.which("ip") is None:
        raise RuntimeError("emulated hosts need iproute2's `ip` (apt-get install iproute2)")
    if os.geteuid() != 0:
        raise RuntimeError("emulated hosts need root (network namespaces, a bridge, bind mounts)")
    done = _ip("netns", "list", check=False)
    if done.returncode != 0:
        raise RuntimeError(f"`ip netns list` failed: {done.stderr.strip()}")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str  # h<i>
    namespace: str
    address: str
    local: str  # the folder HOME is bound to on this host
    tmp: str  # TMPDIR (a distinct path per host)


class EmulatedHosts:
    """N hosts on a private bridge; a context manager that always tears down."""

    def __init__(self, root: str, prefix: str, subnet: str, hosts: list[Host],
                 owner_pid: int | None = None, env: dict[str, str] | None = None):
        self.root, self.prefix, self.subnet, self.hosts = root, prefix, subnet, hosts
        self.owner_pid = owner_pid
        self.env = dict(env or {})  # what every command on every host gets (/etc/environment)

    # ------------------------------------------------------------------ state

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br"

    @property
    def home(self) -> str:
        """HOME on every host: one path, host-local contents."""
        return os.path.join(self.root, "home")

    def save(self) -> None:
        state = {"root": self.root, "prefix": self.prefix, "subnet": self.subnet,
                 "owner_pid": self.owner_pid, "env": self.env,
                 "hosts": [dataclasses.asdict(h) for h in self.hosts]}
        with open(os.path.join(self.root, STATE), "w") as f:
            json.dump(state, f, indent=1)

    @classmethod
    def load(cls, root: str) -> "EmulatedHosts":
        path = os.path.join(root, STATE)
        if not os.path.exists(path):
            raise RuntimeError(f"no emulated hosts at {root} ({path} is missing): run `up` first, "
                               f"or name the root (--root, ASYNCRL_HOSTS_ROOT)")
        with open(path) as f:
            state = json.load(f)
        return cls(state["root"], state["prefix"], state["subnet"],
                   [Host(**h) for h in state["hosts"]], state.get("owner_pid"), state.get("env"))

    def path(self, name: str, path: str) -> str:
        """Where a path of a host's HOME lies for processes outside the hosts."""
        relative = os.path.relpath(path, self.home)
        if relative.startswith(".."):
            return path  # not under HOME: the shared filesystem
        return os.path.join(self.host(name).local, relative)

    def host(self, name: str) -> Host:
        """A host by name (h1), namespace or address."""
        for h in self.hosts:
            if name in (h.name, h.namespace, h.address):
                return h
        raise KeyError(f"no emulated host {name!r}: {', '.join(h.name + ' ' + h.address for h in self.hosts)}")

    # ------------------------------------------------------------------ up and down

    @classmethod
    def up(cls, n: int, root: str | None = None, owner_pid: int | None = None,
           env: dict[str, str] | None = None) -> "EmulatedHosts":
        """N hosts on the first free prefix and subnet; `env`: variables every command on
        them gets. A cluster left behind by a process that died (its owner_pid is gone) is
        torn down first."""
        require_root_and_ip()
        if not 1 <= n <= 200:
            raise ValueError(f"between 1 and 200 hosts, not {n}")
        for k in range(MAX_CLUSTERS):
            prefix, this_root = f"arh{k}", root or f"/tmp/arh{k}"
            _reclaim_if_orphaned(this_root)
            subnet = ipaddress.ip_network("%d.%d.%d.0/24" % (*SUBNET_BASE[:2], SUBNET_BASE[2] + k))
            if _in_use(prefix, subnet) or (os.path.exists(os.path.join(this_root, STATE))):
                if root:
                    raise RuntimeError(f"{this_root} or its names/subnet ({prefix}*, {subnet}) are "
                                       "in use; `down` it or choose another --root")
                continue
            # The bridge is the lock: creating it fails if another `up` took this prefix.
            if _ip("link", "add", f"{prefix}br", "type", "bridge", check=False).returncode:
                continue
            hosts = cls(this_root, prefix, str(subnet), [], owner_pid, env)
            try:
                hosts._build(n, subnet)
            except BaseException:
                hosts.down()
                raise
            return hosts
        raise RuntimeError(f"no free prefix arh0..arh{MAX_CLUSTERS - 1}: `down` old clusters")

    def _build(self, n: int, subnet) -> None:
        os.makedirs(self.root, exist_ok=True)
        os.makedirs(self.home, exist_ok=True)
        self.save()  # first: a failure from here on can still be torn down from the state
        _ip("link", "set", self.bridge, "up")
        for i in range(n):
            name, ns = f"h{i}", f"{self.prefix}h{i}"
            address = str(subnet.network_address + i + 1)
            base = os.path.join(self.root, name)
            host = Host(name, ns, address, os.path.join(base, "home"), os.path.join(base, "tmp"))
            self.hosts.append(host)
            self.save()
            for folder in (host.local, host.tmp):
                os.makedirs(folder, exist_ok=True)
            outside, inside = f"{self.prefix}v{i}", f"{self.prefix}p{i}"
            _ip("netns", "add", ns)
            _ip("link", "add", outside, "type", "veth", "peer", "name", inside)
            _ip("link", "set", inside, "netns", ns)
            _ip("link", "set", outside, "master", self.bridge)
            _ip("link", "set", outside, "up")
            _ip("-n", ns, "link", "set", inside, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            os.makedirs(_etc(ns), exist_ok=True)
            with open(os.path.join(_etc(ns), "hosts"), "w") as f:
                f.write(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")

    def kill(self, name: str, grace_s: float = 0.0) -> list[int]:
        """Every process of a host: SIGTERM, then after grace_s SIGKILL (0: SIGKILL at once)."""
        ns = self.host(name).namespace
        pids = _pids(ns)
        if grace_s > 0:
            _signal(pids, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _pids(ns) and time.monotonic() < deadline:
                time.sleep(0.1)
        for _ in range(50):  # a process may fork while we kill
            left = _pids(ns)
            if not left:
                break
            _signal(left, signal.SIGKILL)
            time.sleep(0.1)
        return pids

    def down(self, keep_files: bool = False) -> None:
        """Every process, namespace, veth and the bridge; the root folder unless keep_files.
        Idempotent, and it goes on past errors (the first is raised at the end)."""
        errors = []
        for host in self.hosts:
            try:
                if _ip("netns", "pids", host.namespace, check=False).returncode == 0:
                    self.kill(host.name)
                    _ip("netns", "del", host.namespace, check=False)  # its veth end goes too
                shutil.rmtree(_etc(host.namespace), ignore_errors=True)
            except Exception as error:  # noqa: BLE001 - tear down the rest
                errors.append(error)
        # Root-side ends (normally gone with their peer), then the bridge.
        for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
            link = line.split(":")[1].strip().split("@")[0]
            if link.startswith(f"{self.prefix}v") or link.startswith(f"{self.prefix}p"):
                _ip("link", "del", link, check=False)
        _ip("link", "del", self.bridge, check=False)
        if not keep_files:
            shutil.rmtree(self.root, ignore_errors=True)
        elif os.path.exists(os.path.join(self.root, STATE)):
            os.remove(os.path.join(self.root, STATE))
        if errors:
            raise errors[0]

    def __enter__(self) -> "EmulatedHosts":
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    # ------------------------------------------------------------------ running

    def argv(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """The command line that runs `argv` on a host: in its network namespace, with its
        HOME bound over the shared HOME path, a fresh environment, from HOME."""
        host = self.host(name)
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                       "LANG": os.environ.get("LANG", "C.UTF-8"), "HOME": self.home,
                       "TMPDIR": host.tmp, "USER": os.environ.get("USER", "root"),
                       "ASYNCRL_HOST": host.name, **self.env, **(env or {})}
        # `ip netns exec` gives the command a mount namespace of its own (slave to the
        # root's): the bind is seen by it and its children only.
        script = 'mount --bind "$1" "$2" && cd "$2" && shift 2 && exec "$@"'
        return ["ip", "netns", "exec", host.namespace, "sh", "-c", script, "sh", host.local,
                self.home, "env", "-i", *(f"{k}={v}" for k, v in environment.items()), *argv]

    def popen(self, name: str, argv: list[str], env: dict[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """`argv` on a host; the Popen's pid ends up being the program's own (each step execs)."""
        return subprocess.Popen(self.argv(name, argv, env), **kwargs)

    def run(self, name: str, argv: list[str], env: dict[str, str] | None = None,
            **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(name, argv, env), **kwargs)

    def shell(self, name: str, command: str, env: dict[str, str] | None = None,
              **kwargs) -> subprocess.CompletedProcess:
        """One shell command line on a host, as `ssh host 'command'` runs it."""
        return self.run(name, ["sh", "-c", command], env, **kwargs)


def _etc(namespace: str) -> str:
    """The files `ip netns exec` binds over /etc for commands in `namespace`."""
    return os.path.join("/etc/netns", namespace)


def _pids(namespace: str) -> list[int]:
    done = _ip("netns", "pids", namespace, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _in_use(prefix: str, subnet) -> bool:
    """Whether a link or namespace has the prefix, or an address or route of the root
    namespace overlaps the subnet."""
    if any(ns.split()[0].startswith(prefix) for ns in _ip("netns", "list").stdout.splitlines() if ns):
        return True
    for line in _ip("-o", "link", "show").stdout.splitlines():
        if line.split(":")[1].strip().startswith(prefix):
            return True
    for family in ("-4",):
        for line in _ip(family, "-o", "addr", "show").stdout.splitlines():
            if ipaddress.ip_interface(line.split()[3]).network.overlaps(subnet):
                return True
        for line in _ip(family, "route", "show", "table", "all").stdout.splitlines():
            word = line.split()[0] if line.split() else ""
            if word in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit",
                        "throw", "multicast", "unicast"):
                word = line.split()[1] if word != "default" and len(line.split()) > 1 else ""
            try:
                if ipaddress.ip_network(word, strict=False).overlaps(subnet):
                    return True
            except ValueError:
                continue
    return False


def _reclaim_if_orphaned(root: str) -> None:
    """Tears down a cluster whose owner (a test process that was killed) is gone."""
    try:
        hosts = EmulatedHosts.load(root)
    except (RuntimeError, ValueError, OSError):
        return
    if hosts.owner_pid is None:
        return
    try:
        os.kill(hosts.owner_pid, 0)
    except ProcessLookupError:
        hosts.down()


# ---------------------------------------------------------------------------- the CLI


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=None,
                        help="the cluster's folder (default $ASYNCRL_HOSTS_ROOT, else /tmp/arh0 for "
                             "exec/kill/list/down; up takes the first free /tmp/arh<k>)")
    sub = parser.add_subparsers(dest="what", required=True)
    up = sub.add_parser("up", help="create N hosts")
    up.add_argument("n", type=int)
    up.add_argument("--env", action="append", default=[], metavar="K=V",
                    help="a variable every command on every host gets")
    run = sub.add_parser("exec", help="run a command on a host, as ssh would")
    run.add_argument("host", help="h<i>, its namespace or its address")
    run.add_argument("--env", action="append", default=[], metavar="K=V")
    run.add_argument("command", nargs=argparse.REMAINDER)
    sub.add_parser("kill", help="kill -9 every process of a host").add_argument("host")
    sub.add_parser("list", help="the hosts, as JSON")
    sub.add_parser("down", help="tear everything down")
    args = parser.parse_args(argv)
    root = args.root or os.environ.get("ASYNCRL_HOSTS_ROOT")
    try:
        if args.what == "up":
            hosts = EmulatedHosts.up(args.n, root, env=dict(kv.split("=", 1) for kv in args.env))
            print(f"export ASYNCRL_HOSTS_ROOT={hosts.root}", file=sys.stderr)
            print(json.dumps([dataclasses.asdict(h) for h in hosts.hosts], indent=1))
            return 0
        hosts = EmulatedHosts.load(root or "/tmp/arh0")
        if args.what == "exec":
            words = args.command[1:] if args.command[:1] == ["--"] else args.command
            if not words:
                parser.error("exec HOST -- COMMAND")
            env = dict(kv.split("=", 1) for kv in args.env)
            command = " ".join(words)  # as ssh: the words joined, run by the host's shell
            os.execvp("ip", hosts.argv(args.host, ["sh", "-c", command], env))
        elif args.what == "kill":
            print(" ".join(map(str, hosts.kill(args.host))))
        elif args.what == "list":
            print(json.dumps([dataclasses.asdict(h) for h in hosts.hosts], indent=1))
        elif args.what == "down":
            hosts.down()
    except (RuntimeError, KeyError) as error:
        print(f"error: {error.args[0] if error.args else error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
