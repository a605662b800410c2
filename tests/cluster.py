"""A two-node Ray cluster on one machine, started the way an operator starts one: `ray start --head` and
`ray start --address`, on loopback, each node with one CPU and a custom resource naming it ("node_a" on the
head, "node_b" on the worker). Serve's proxy runs on both nodes, on ports of their own.

The test drives the cluster through tests/cluster_driver.py in a child process (this process may already be
connected to the session's own cluster). `stop()` kills every process of this cluster by PID, found by the
GCS address or the temp dir in their command lines: `ray stop` would also stop the session's cluster.
"""

import json
import os
import secrets
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
RAY = str(Path(sys.executable).with_name("ray"))
# A dead node is declared dead after `failure_threshold` missed checks, `period` apart (Ray's defaults: 5 x 3 s,
# after a 5 s grace). Shorter here so the test sees a node loss in seconds; a 2 s timeout keeps a busy
# 2-core machine from missing checks of a live node.
HEALTH = {"RAY_health_check_initial_delay_ms": "1000", "RAY_health_check_period_ms": "1000",
          "RAY_health_check_timeout_ms": "2000", "RAY_health_check_failure_threshold": "5"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TwoNodeCluster:
    def __init__(self) -> None:
        self.temp = tempfile.mkdtemp(prefix="ray2n-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        self.gcs_port, self.port_a, self.port_b = free_port(), free_port(), free_port()
        self.node_manager_b = free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.driver: subprocess.Popen | None = None
        self._lock = threading.Lock()

    @property
    def urls(self) -> dict[str, str]:
        """Each node's Serve proxy."""
        return {"node_a": f"http://127.0.0.1:{self.port_a}", "node_b": f"http://127.0.0.1:{self.port_b}"}

    def start(self, timeout: float = 180) -> "TwoNodeCluster":
        # Ray's token authentication, as a real cluster runs it: one token that every node and the driver read.
        token = Path(self.temp) / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        env = {**os.environ, **HEALTH, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
        common = ["--num-cpus=1", "--node-ip-address=127.0.0.1", "--disable-usage-stats", "--num-gpus=0"]
        self._ray(["start", "--head", f"--port={self.gcs_port}", "--include-dashboard=false",
                   f"--temp-dir={self.temp}", '--resources={"node_a": 1}', *common], env, timeout)
        # The worker node's proxy binds its own port: two proxies on one machine cannot share one.
        self._ray(["start", f"--address={self.address}", f"--node-manager-port={self.node_manager_b}",
                   '--resources={"node_b": 1}', *common], {**env, "RAY_SERVE_WORKER_PROXY_HTTP_PORT": str(self.port_b)},
                  timeout)
        self.driver = subprocess.Popen([sys.executable, "-m", "tests.cluster_driver", self.address, str(self.port_a)],
                                       cwd=REPO, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                       stderr=open(Path(self.temp) / "driver.log", "w"))
        ready = self._reply(timeout)
        assert ready.get("ready"), ready
        return self

    def _ray(self, args: list[str], env: dict, timeout: float) -> None:
        proc = subprocess.run([RAY, *args], env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"ray {args[0]} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"

    def call(self, op: str, timeout: float = 300, **args) -> dict:
        """One request to the driver; raises with the driver's error if it failed."""
        assert self.driver and self.driver.poll() is None, "the cluster driver has exited"
        with self._lock:  # one request at a time: replies come back in order
            self.driver.stdin.write(json.dumps({"op": op, **args}) + "\n")
            self.driver.stdin.flush()
            reply = self._reply(timeout)
        assert reply["ok"], f"{reply['error']}\n{reply.get('trace', '')}"
        return reply

    def _reply(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.driver.stdout], [], [], timeout)
        assert ready, f"the cluster driver gave no answer in {timeout} s (log: {self.temp}/driver.log)"
        line = self.driver.stdout.readline()
        assert line, f"the cluster driver exited (log: {self.temp}/driver.log)"
        return json.loads(line)

    def processes(self, marker: str | None = None) -> list[psutil.Process]:
        """This cluster's processes (or those whose command line also holds `marker`)."""
        found = []
        for p in psutil.process_iter(["cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            if (self.address in cmd or self.temp in cmd) and (marker is None or marker in cmd):
                found.append(p)
        return found

    def kill_worker_node(self) -> int:
        """SIGKILL node_b's raylet, as a machine that dies would; returns its PID."""
        raylets = [p for p in self.processes(f"--node_manager_port={self.node_manager_b}") if "raylet" in p.name()]
        assert len(raylets) == 1, raylets
        raylets[0].send_signal(signal.SIGKILL)
        return raylets[0].pid

    def stop(self) -> None:
        if self.driver and self.driver.poll() is None:
            self.driver.kill()
        deadline = time.monotonic() + 30
        while (procs := [p for p in self.processes() if p.pid != os.getpid()]) and time.monotonic() < deadline:
            for p in procs:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            time.sleep(0.5)
        shutil.rmtree(self.temp, ignore_errors=True)
