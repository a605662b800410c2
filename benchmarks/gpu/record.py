"""How the GPU check keeps what it measured when a run is cut short.

A GPU run is short and rare, so a section must never lose what it finished:
- `SectionRecord` rewrites the section's JSON after every item (a level, a
  set, a context), atomically (a reader sees the last whole file, never half
  of one); a SIGTERM (an outer `timeout`, a test) writes it once more, marked
  `killed`, and exits.
- `Deadline` is checked *inside* a section's loops, between engine steps and
  between prompts, not only between items, so an item past its cap stops and
  reports what finished.
- `run_isolated` runs a section in a child process, so what kills a process
  (a CUDA error that poisons the context, a segfault) costs that section
  alone, and its JSON says how it died.
- `RunBudget` turns one budget for the whole run (`--budget-s`) into each
  section's cap: its share of the budget, and never past the point where the
  sections after it would lose theirs, so one section that overran (a model
  load cannot be interrupted) squeezes the later ones instead of the run.
"""

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Deadline:
    end: float  # time.monotonic()

    @classmethod
    def after(cls, seconds: float) -> "Deadline":
        return cls(time.monotonic() + seconds)

    @property
    def passed(self) -> bool:
        return time.monotonic() >= self.end

    @property
    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def share(self, fraction: float) -> "Deadline":
        """An earlier deadline: `fraction` of the time left to this one, from now."""
        return Deadline(time.monotonic() + fraction * self.left)


class RunBudget:
    """Each section's cap from one budget for the run: the base caps (seconds, sized for the default budget)
    scaled to fit `budget_s` less `startup_s` (the process's imports), each capped so the sections still to
    run keep their scaled caps."""

    def __init__(self, base_caps: dict[str, float], budget_s: float, startup_s: float, order: str) -> None:
        missing = set(order) - set(base_caps)
        if missing:
            raise ValueError(f"no such section: {''.join(sorted(missing))} (sections: {''.join(base_caps)})")
        room = budget_s - startup_s
        if room <= 0:
            raise ValueError(f"--budget-s {budget_s:g} leaves nothing after {startup_s:g} s of start-up")
        self.order = order
        self.scale = room / sum(base_caps[s] for s in order)
        self.caps = {s: base_caps[s] * self.scale for s in order}
        self.end = time.monotonic() + room

    def deadline(self, section: str) -> Deadline:
        later = self.order[self.order.index(section) + 1:]
        latest = self.end - sum(self.caps[s] for s in later)
        return Deadline(min(time.monotonic() + self.caps[section], max(latest, time.monotonic())))


@dataclass
class SectionRecord:
    """One section's JSON file, rewritten whole after every item: {section, status, seconds, cap_s, machine,
    result, error}. status: running -> done | truncated (its cap stopped it) | failed | killed: SIGTERM."""

    path: Path
    section: str
    deadline: Deadline  # the section's cap
    machine: dict
    result: dict = field(default_factory=dict)
    status: str = "running"
    error: str | None = None
    deadline_hit: bool = False  # some work was skipped or cut short at a deadline
    _t0: float = field(default_factory=time.monotonic)
    _writes: int = 0

    def __post_init__(self) -> None:
        self.cap_s = self.deadline.end - self._t0

    def over(self, deadline: Deadline | None = None) -> bool:
        """Has `deadline` (the section's own by default) passed? If so, the section is marked truncated."""
        passed = (deadline or self.deadline).passed
        self.deadline_hit |= passed
        return passed

    def stop_when(self, deadline: Deadline | None = None):
        """`over` as a callable, for bench_engine.run_level's stop_when."""
        return lambda: self.over(deadline)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def save(self) -> None:
        record = {"section": self.section, "status": self.status, "seconds": round(self.elapsed, 3),
                  "cap_s": round(self.cap_s, 1), "machine": self.machine, "result": self.result, "error": self.error}
        self._writes += 1
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{self._writes}")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, self.path)

    def put(self, path: tuple, value) -> None:
        """result[path[0]][path[1]]... = value (the dicts on the way made as needed), then save."""
        node = self.result
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
        self.save()

    def finish(self, error: str | None = None) -> None:
        self.error = error
        self.status = "failed" if error else "truncated" if self.deadline_hit else "done"
        self.save()


class Throttle:
    """Calls `fn` at most once every `seconds` (a section that saves while it steps an engine)."""

    def __init__(self, fn: Callable[[], None], seconds: float = 1.0) -> None:
        self.fn, self.seconds, self._last = fn, seconds, None

    def __call__(self) -> None:
        now = time.monotonic()
        if self._last is None or now - self._last >= self.seconds:
            self._last = now
            self.fn()


class KilledRecords:
    """On SIGTERM, the section in progress is saved as `killed: SIGTERM` before the process exits (143)."""

    def __init__(self) -> None:
        self.current: SectionRecord | None = None
        self.child = None  # subprocess.Popen of a section run isolated (run_isolated): it gets the SIGTERM too
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum, frame) -> None:
        if self.child is not None:  # it saves its own record as killed
            self.child.terminate()
            try:
                self.child.wait(timeout=10)
            except Exception:  # noqa: BLE001 - exiting anyway
                pass
        if self.current is not None:
            self.current.status = f"killed: {signal.Signals(signum).name}"
            self.current.save()
        sys.stdout.flush()
        os._exit(128 + signum)


def run_isolated(argv: list[str], path: Path, section: str, timeout_s: float,
                 killed: KilledRecords | None = None) -> str:
    """Run one section as the child process `argv` (which writes its JSON at `path`), so that what kills its
    process (a CUDA error that poisons the context for every later kernel, a segfault in a first GPU run of a
    kernel) costs that section alone: the sections after it run in a clean process. Returns the section's
    status. A child that died without finishing its JSON leaves it `failed` with the exit status and whatever
    items it wrote; one past `timeout_s` gets SIGTERM (it saves itself as killed), then SIGKILL."""
    import subprocess

    proc = subprocess.Popen(argv)
    if killed is not None:  # a SIGTERM to this process reaches the child too
        killed.child = proc
    try:
        rc = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            rc = proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    finally:
        if killed is not None:
            killed.child = None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {"section": section, "seconds": None, "cap_s": None, "machine": {}, "result": {}, "error": None,
                  "status": "running"}
    if record["status"] == "running":  # it died mid-section: what it wrote stays, marked with how it ended
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        record.update(status="failed", error=f"the section's process died ({how}) before it finished")
        tmp = path.with_name(f".{path.name}.{os.getpid()}.isolated")
        tmp.write_text(json.dumps(record, indent=1, default=str))
        os.replace(tmp, path)
    return record["status"]
