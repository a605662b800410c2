"""Start and stop a server for the sweep: `serve run CONFIG` in a subprocess, ready when every model answers."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import requests


def wait_ready(url: str, models: list[str], timeout_s: float) -> None:
    """Until each model completes a one-token request (the replicas are up, not just the proxy)."""
    deadline = time.monotonic() + timeout_s
    pending = list(models)
    while pending:
        try:
            r = requests.post(f"{url}/v1/completions", timeout=120,
                              json={"model": pending[0], "prompt": "Hi", "max_tokens": 1, "temperature": 0})
            if r.status_code == 200:
                pending.pop(0)
                continue
            if r.status_code == 404 and r.headers.get("content-type", "").startswith("application/json") \
                    and (r.json().get("error") or {}).get("param") == "model":  # ours, not the proxy's "no route yet"
                raise RuntimeError(f"the server does not serve model {pending[0]!r}: {r.text[:200]}")
        except (requests.ConnectionError, requests.Timeout):  # still starting (replicas load and measure)
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"server at {url} not ready for {pending} after {timeout_s:.0f} s")
        time.sleep(1.0)


class ServeProcess:
    """`serve run CONFIG` as a child process; its log goes to `log_path`."""

    def __init__(self, config: str, log_path: Path) -> None:
        self.config = config
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "ServeProcess":
        serve = Path(sys.executable).with_name("serve")
        cmd = [str(serve) if serve.exists() else "serve", "run", self.config]
        self._log = open(self.log_path, "w", encoding="utf-8")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # serve run shuts Serve and its Ray down on Ctrl-C
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._log.close()

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"`serve run {self.config}` exited ({self.proc.returncode}); see {self.log_path}")
