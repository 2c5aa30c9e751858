"""The one validation vocabulary for every scenario section (model, hardware, engine, cost_model,
workload, slo) and CLI option: each validator checks one value and raises a one-line ScenarioError
in one style, `<file>: <key.path>: <value> is not <what is allowed>`:

    _int, _num, _bool, _choice, _text   one value
    _check_keys, check_fields, _section  the keys of a mapping (unknown keys get a "did you mean")
    _existing_path                        a file the scenario names

Numbers: YAML 1.1 (PyYAML) reads an exponent without a dot (`24e9`, `9e-1`) as a string; where a
real number is expected such a string is read as the number it spells, and an integer must be
written as one (the message says so).
"""
from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from sim.config.errors import ScenarioError

Where = Callable[[str], str]  # key path -> "file.yaml: key.path" (or "--set key.path")


def _or(v: Any, default: Any) -> Any:
    """A key written with no value (YAML null) counts as absent, as in the workload section."""
    return default if v is None else v


def _show(v: Any) -> str:
    """A value as YAML spells it, for messages."""
    if v is None or isinstance(v, bool):
        return {None: "null", True: "true", False: "false"}[v]
    if isinstance(v, (dict, list)):
        return "a mapping" if isinstance(v, dict) else "a list"
    if isinstance(v, int) and abs(v) >= 10**30:  # no 5000-digit numbers in a one-line message
        return f"an integer of {len(str(abs(v))) if abs(v).bit_length() < 14000 else 'over 4000'} digits"
    text = repr(v)
    return text if len(text) <= 80 else text[:60] + f"... ({len(text)} characters)"


def _number_hint(v: Any) -> str:
    if isinstance(v, str):
        try:
            float(v)
        except ValueError:
            return ""
        return " (YAML 1.1 reads 1e3 as a string; write 1000 or 1.0e+3)"
    return ""


# Bounds: what is physically meaningful for one simulated deployment, and far inside what float64
# and int64 represent exactly, so no value reaching the simulator can overflow, hang or come out
# negative. README "Errors" lists them.
MAX_TOKENS = 10_000_000          # tokens in one request (prompt or output), one batch, one budget
MAX_REQUESTS = 100_000_000       # requests in one run
MAX_SECONDS = 1e9                # any time or time span (~31.7 years)
MIN_RATE = 1e-6                  # requests/s (one request per ~11.6 days)
MAX_RATE = 1e6                   # requests/s
MAX_COUNT = 1_000_000            # sequences, GPUs, layers, heads, users per run
# replicas of one scenario (as disaggregation's pools): each holds its own scheduler and KV cache,
# ~6 KB and ~70 us to build (1,000,000 took 70 s and 6 GB for 20 requests)
MAX_REPLICAS = 10_000
MAX_BLOCKS = 1_000_000_000       # KV blocks per GPU
MAX_BYTES = 1e15                 # bytes of GPU memory (a petabyte)
MAX_OFFLOAD_GIB = 1e6            # GiB of host memory for offloaded KV blocks (~1 PiB)
MAX_RATE_PHYSICAL = 1e18         # FLOP/s or bytes/s of one GPU
MAX_USD_PER_HOUR = 1e6
MAX_STEP_SECONDS = 3600.0        # any per-iteration or per-sequence time constant

MAX_YAML_DEPTH = 64              # nested mappings/lists in a YAML or JSON input
MAX_INPUT_BYTES = {              # largest input file read, by kind
    "scenario": 10 << 20, "profile": 64 << 20, "config": 10 << 20, "trace": 4 << 30,
    "summary": 64 << 20, "rate profile": 16 << 20,
}

_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")  # what YAML 1.1 leaves a string


def _int(v: Any, where: str, lo: int, hi: int | None = None, cap: int | None = None) -> int:
    """An integer in [lo, hi]; `cap`: a sanity bound (module constants above), said apart."""
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise ScenarioError(f"{where}: {_show(v)} is not an integer {allowed}{_number_hint(v)}")
    if cap is not None and v > cap:
        raise ScenarioError(f"{where}: {_show(v)} is more than {cap}, the most servesim accepts here")
    return v


def _num(v: Any, where: str, lo: float, hi: float | None = None, open_lo: bool = False,
         open_hi: bool = False, cap: float | None = None) -> float:
    """A finite number in the range; `cap`: a sanity bound (module constants above), said apart."""
    if isinstance(v, str) and _EXPONENT.fullmatch(v.strip()):
        v = float(v)
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if not ok or v < lo or (open_lo and v == lo) or (hi is not None and (v > hi or open_hi and v == hi)):
        allowed = (f"{'>' if open_lo else '>='} {lo}" if hi is None else
                   f"in {'(' if open_lo else '['}{lo}, {hi}{')' if open_hi else ']'}")
        raise ScenarioError(f"{where}: {_show(v)} is not a number {allowed}{_number_hint(v)}")
    if cap is not None and v > cap:
        raise ScenarioError(f"{where}: {_show(v)} is more than {cap:g}, the most servesim accepts here")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ScenarioError(f"{where}: {_show(v)} is not true or false")
    return v


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str) or not v:
        raise ScenarioError(f"{where}: {_show(v)} is not a non-empty string")
    return v


def _choice(v: Any, where: str, allowed: Iterable[str]) -> str:
    if not isinstance(v, str) or v not in allowed:
        raise ScenarioError(f"{where}: {_show(v)} is not one of {', '.join(allowed)}")
    return v


def _check_keys(m: dict, prefix: str, w: Where, allowed: Iterable[str]) -> None:
    for key in m:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            path = f"{prefix}.{key}" if prefix else str(key)
            raise ScenarioError(f"{w(path)}: unknown key{hint}; allowed: {', '.join(allowed)}")


def _section(v: Any, key: str, w: Where, allowed: tuple[str, ...]) -> dict:
    if v is None:
        return {}
    if not isinstance(v, dict):
        raise ScenarioError(f"{w(key)}: {_show(v)} is not a mapping; allowed keys: {', '.join(allowed)}")
    _check_keys(v, key, w, allowed)
    return v


def _existing_path(v: Any, key: str, w: Where, base_dir: Path, what: str) -> Path:
    if not isinstance(v, str) or not v:
        raise ScenarioError(f"{w(key)}: {_show(v)} is not {what}")
    path = (base_dir / Path(v).expanduser()).absolute()
    if not path.exists():
        raise ScenarioError(f"{w(key)}: no such file {v!r} (looked in {base_dir})")
    return path


def check_fields(fields: Any, where: str, allowed: tuple[str, ...], required: tuple[str, ...]) -> None:
    """A mapping of dataclass fields at `where` ("file.yaml: model"): no unknown keys, none of the
    required ones missing."""
    at = f"{where}: " if where else ""
    if not isinstance(fields, dict):
        raise ScenarioError(f"{at}{_show(fields)} is not a mapping; allowed keys: {', '.join(allowed)}")
    _check_keys(fields, "", lambda key: f"{where}.{key}" if where else key, allowed)
    missing = [k for k in required if k not in fields]
    if missing:
        path = f"{where}.{missing[0]}" if where else missing[0]
        raise ScenarioError(f"{path}: missing; required: {', '.join(required)}")


def check_out_dir(out_dir: Path, flag: str = "--out") -> None:
    """Refuse an output folder (`flag`'s) that is a file, or lies under one, before any simulation runs."""
    existing = next(p for p in (out_dir, *out_dir.parents) if p.exists())
    if not existing.is_dir():
        where = "" if existing == out_dir else f"{existing} "
        raise ScenarioError(f"{flag} {out_dir}: {where}exists and is not a directory")


# ---------------------------------------------------------------- safe input

def check_input_file(path: Path, kind: str, label: str | None = None) -> int:
    """A regular file no larger than MAX_INPUT_BYTES[kind] (not /dev/zero, a FIFO or a folder);
    returns its size. `label` names it in messages (default: the path)."""
    label = label or str(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ScenarioError(f"{label}: no such file") from None
    except OSError as e:
        raise ScenarioError(f"{label}: cannot read: {e.strerror}") from None
    if stat.S_ISDIR(st.st_mode):
        raise ScenarioError(f"{label}: is a directory, not a {kind} file")
    if not stat.S_ISREG(st.st_mode):
        raise ScenarioError(f"{label}: not a regular file (a device, pipe or socket); expected a {kind} file")
    limit = MAX_INPUT_BYTES[kind]
    if st.st_size > limit:
        raise ScenarioError(f"{label}: {st.st_size} bytes, more than the {limit >> 20} MiB servesim "
                            f"reads as a {kind} file")
    return st.st_size


def read_text(path: Path, kind: str, label: str | None = None) -> str:
    """The file as UTF-8 text (a leading BOM dropped), after check_input_file."""
    label = label or str(path)
    check_input_file(path, kind, label)
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ScenarioError(f"{label}: cannot read: {e.strerror}") from None
    if b"\x00" in data[:65536]:
        raise ScenarioError(f"{label}: binary data, not a text {kind} file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{label}: not UTF-8 text (byte {e.start})") from None


def parsed_once(path: Path, parse: Callable[[Path], Any]) -> Any:
    """parse(path), parsed once per process while the file is unchanged: the memo is keyed by the
    file's identity (resolved path, inode, size, modification time in ns), so an edited file is
    read again. A planner validates hundreds of copies of one scenario, each naming the same
    23 KB step profile: pure-Python YAML took ~50 ms a copy (as long as the simulation). The
    value is shared: callers must not change it (scenario_from_dict deep-copies its mapping)."""
    try:
        st = os.stat(path)
    except OSError:  # (the parser's own checks name the problem)
        return parse(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns, parse)
    hit = _PARSED.get(key)
    if hit is None:
        hit = _PARSED[key] = (parse(path),)
        if len(_PARSED) > 256:  # (a long-lived notebook reading many files: keep the newest)
            del _PARSED[next(iter(_PARSED))]
    return hit[0]


_PARSED: dict[tuple, tuple] = {}  # parsed_once's memo (errors are never kept: they raise before)


def parsed_text(text: str, label: str) -> Any:
    """load_yaml(text), memoised by the text alone (a --set value: one of a few dozen distinct
    texts across a plan's thousands of points); a container comes back as a fresh copy."""
    hit = _TEXTS.get(text)
    if hit is None:
        hit = load_yaml(text, label)
        if len(_TEXTS) < 4096:
            _TEXTS[text] = hit
    return copy.deepcopy(hit) if isinstance(hit, (dict, list)) else hit


_TEXTS: dict[str, Any] = {}


def load_yaml(text: str, label: str):
    """Parse YAML text with the rules above; errors are one-line ScenarioErrors naming `label`."""
    import yaml

    try:
        return yaml.load(text, Loader=_yaml_loader())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ScenarioError(f"{label}:{line} invalid YAML: {problem}") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise ScenarioError(f"{label}: invalid value: {str(e).splitlines()[0][:120]}") from None
    except RecursionError:
        raise ScenarioError(f"{label}: nested too deeply (more than {MAX_YAML_DEPTH} levels)") from None


_LOADER = None


def _yaml_loader():
    global _LOADER  # built once, on first use (yaml is imported lazily)
    if _LOADER is None:
        import yaml

        class Loader(yaml.SafeLoader):
            def __init__(self, stream):
                super().__init__(stream)
                self._depth = 0

            def compose_node(self, parent, index):
                if self.check_event(yaml.events.AliasEvent):
                    event = self.peek_event()
                    raise yaml.composer.ComposerError(
                        None, None, "aliases (*name) are not supported", event.start_mark)
                self._depth += 1
                try:
                    if self._depth > MAX_YAML_DEPTH:
                        raise yaml.composer.ComposerError(
                            None, None, f"nested more than {MAX_YAML_DEPTH} levels deep",
                            self.peek_event().start_mark)
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1

            def construct_mapping(self, node, deep=False):
                seen = set()
                for key_node, _ in node.value:
                    if isinstance(key_node, yaml.ScalarNode):
                        if key_node.value in seen:
                            raise yaml.constructor.ConstructorError(
                                None, None, f"duplicate key {key_node.value[:80]!r}", key_node.start_mark)
                        seen.add(key_node.value)
                return super().construct_mapping(node, deep=deep)

        _LOADER = Loader
    return _LOADER


# ---------------------------------------------------------------- output files

_UMASK = os.umask(0o022)  # read once (os.umask can only be read by setting it), then restored
os.umask(_UMASK)


def like_open(fd: int) -> None:
    """Give a temporary file (tempfile.mkstemp makes them 0600) the mode open() would give a new
    file, so every output servesim writes is readable as the user's umask says."""
    os.fchmod(fd, 0o666 & ~_UMASK)


def read_json_object(path: Path, what: str, expected: str = "a JSON object", strict: bool = False) -> dict:
    """The JSON object in the file `path` (json_object's checks; an unreadable file is one error)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or type(e).__name__
        raise ScenarioError(f"{path}: cannot read {what} ({why})") from None
    return json_object(text, str(path), what, expected, strict)


def json_object(text: str, where: str, what: str, expected: str = "a JSON object", strict: bool = False) -> dict:
    """`text` parsed as one JSON object; errors name `where` (a file, or file:line) and `what`
    (e.g. "a config.json"). `strict`: NaN and Infinity refused (JSON that servesim wrote has null)."""
    def constant(name: str) -> float:
        raise ScenarioError(f"{where}: {name} is not JSON servesim writes (a missing value is null)")
    try:
        value = json.loads(text, parse_constant=constant if strict else None)
    except ScenarioError:
        raise
    except ValueError as e:
        raise ScenarioError(f"{where}: not valid JSON ({getattr(e, 'msg', str(e))[:120]})") from None
    except RecursionError:
        raise ScenarioError(f"{where}: nested too deeply to be {what}") from None
    if not isinstance(value, dict):
        raise ScenarioError(f"{where}: expected {expected}")
    return value
