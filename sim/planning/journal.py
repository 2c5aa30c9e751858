"""A plan's journal: every simulation it ran, kept in its folder as each finishes, so that an
interrupted plan (Ctrl-C, a kill, a full disk) resumes where it stopped.

    journal = Journal.open(out_dir, fingerprint)   # reads back what an earlier run of the same plan kept
    journal.get(key) -> dict | None; journal.put(key, result); journal.close()

`DIR/simulations.jsonl`: a header line (the fingerprint: what every result depends on beyond its
own key: the scenario file and the files it names, the SLO, the warm-up and early-stop rules, the
simulator's source), then one line per simulation {"key": ..., "result": ...}, appended and
flushed as it finishes (a torn last line, from a kill mid-write, is skipped on reading). The same
command run again reads the results back instead of simulating them: the plan's steps are
deterministic, so it takes the same path and reaches the same answer, simulating only what was
missing. A header that differs (another scenario, an edited file, another servesim) starts the
journal afresh, and the plan says so. The file is locked while a plan writes it: a second plan
into the same folder is refused, not mixed in.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from sim.config.errors import ScenarioError

FILE = "simulations.jsonl"
FORMAT = "servesim-plan-journal/1"


def source_digest() -> str:
    """sha256 over the simulator's own Python sources (sim/): a result simulated by other code is
    not read back."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def file_digest(path: str | Path) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


class Journal:
    """Opened before a plan runs; nothing is written until its first result (a plan refused for bad
    input leaves its folder as it was). `note` hears, at that first write, that an earlier journal
    of other inputs is being replaced."""

    def __init__(self, folder: str | Path, fingerprint: dict, note: Any = None):
        self.folder, self.path = Path(folder), Path(folder) / FILE
        self.header = {"format": FORMAT, **fingerprint}
        self.note = note
        self._fd = -1
        self._lock = threading.Lock()
        self.read_back = 0          # results served from the journal in this run
        self._kept: dict[str, dict] = {}
        self.restarted = False      # an earlier journal of other inputs is replaced at the first write
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            raise ScenarioError(f"--out {self.folder}: {FILE} there is not a regular file (a link, a folder, a "
                                "device); remove it or use another --out")
        try:
            with open(self.path, "rb") as f:  # (read only: nothing is changed before a result comes)
                data = f.read()
        except OSError:
            data = b""
        if data:
            self._kept, self.restarted = _read(data.split(b"\n"), self.header)

    @classmethod
    def open(cls, folder: str | Path, fingerprint: dict, note: Any = None) -> Journal:
        return cls(folder, fingerprint, note)

    @property
    def kept(self) -> int:
        """Results an earlier run left here (read back as the plan asks for them)."""
        return len(self._kept)

    def get(self, key: str, usable: Any = None) -> dict | None:
        """The result kept for `key`, if `usable(result)` (a hand-edited or damaged one is simulated
        again, never read back half)."""
        hit = self._kept.get(key)
        if hit is not None and usable is not None and not usable(hit):
            return None
        if hit is not None:
            self.read_back += 1
        return hit

    def put(self, key: str, result: dict) -> None:
        line = json.dumps({"key": key, "result": result}, separators=(",", ":")) + "\n"
        with self._lock:
            if self._fd < 0:
                self._start()
            os.write(self._fd, line.encode())  # (O_APPEND: one write per line, whole)

    def _start(self) -> None:
        """Open (and lock) the file at the first result: a journal of these inputs is appended to,
        any other replaced."""
        self.folder.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o666)
        except OSError as e:
            raise ScenarioError(f"--out {self.folder}: cannot open {FILE} ({e.strerror or e}; a link there is "
                                "refused)") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ScenarioError(f"--out {self.folder}: another plan is writing to it; wait for it to finish or use "
                                "another --out") from None
        except OSError:  # (a file system without flock: unguarded)
            pass
        if not self._kept:  # fresh, or of other inputs: start afresh
            if self.restarted and self.note is not None:
                self.note(f"{self.path} was another plan's (other inputs, or another servesim): starting afresh")
            os.ftruncate(fd, 0)
            os.write(fd, (json.dumps(self.header, sort_keys=True) + "\n").encode())
        self._fd = fd

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read(lines: list[bytes], header: dict) -> tuple[dict[str, dict], bool]:
    """The results of a journal whose header is `header` (else none, and True: it is another's)."""
    try:
        same = json.loads(lines[0]) == json.loads(json.dumps(header))
    except ValueError:
        same = False
    if not same:
        return {}, True
    out: dict[str, Any] = {}
    for raw in lines[1:]:
        try:
            row = json.loads(raw)
        except ValueError:  # a torn last line (killed mid-write), or damage: that result is simulated again
            continue
        result = row.get("result") if isinstance(row, dict) else None
        if isinstance(row.get("key"), str) and isinstance(result, dict) and isinstance(result.get("met"), bool) \
                and isinstance(result.get("wall_s"), (int, float)):
            out[row["key"]] = result
    return out, False
