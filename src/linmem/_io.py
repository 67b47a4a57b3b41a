"""Atomic file writes and provenance (commit, command) shared by the data, training and reports."""

from __future__ import annotations

import functools
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from linmem import __version__

__all__ = ["PROVENANCE_FIELDS", "atomic_write", "check_outputs", "command_line",
           "cpu_description", "git_commit", "machine", "made_by", "provenance", "read_json",
           "write_json"]


def check_outputs(outputs: dict[str, str | os.PathLike | None], force: bool = False) -> None:
    """Before anything is written: ``ValueError`` when two of ``outputs`` (a name, such as an
    option, per file; None: not written) are the same file, ``FileNotFoundError`` when one's
    folder does not exist (a mistyped path creates no folders anywhere on the disk), and
    ``FileExistsError`` when one exists already and ``force`` is not set (a result is never
    overwritten silently)."""
    seen: dict[Path, str] = {}
    for name, path in outputs.items():
        if path is None:
            continue
        resolved = Path(path).expanduser().resolve()
        if resolved in seen:
            raise ValueError(f"{seen[resolved]} and {name} name the same file ({path})")
        seen[resolved] = name
        if Path(path).is_dir():
            raise ValueError(f"{name} {path} is a folder, not a file")
        if not resolved.parent.is_dir():
            raise FileNotFoundError(f"{name} {path}: the folder {resolved.parent} does not "
                                    "exist (create it first)")
    if not force:
        existing = [f"{name} {path}" for name, path in outputs.items()
                    if path is not None and Path(path).exists()]
        if existing:
            raise FileExistsError(f"{', '.join(existing)}: already exists (pass --force to "
                                  "overwrite)")


class atomic_write:
    """``with atomic_write(path) as f``: write to a temporary file beside ``path``, then rename.

    On an exception the temporary file is removed and ``path`` is left as it was.
    """

    def __init__(self, path: str | os.PathLike, mode: str = "wb"):
        self.path = Path(path)
        self.mode = mode

    def __enter__(self):
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, self.tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.",
                                            suffix=".part")
        except OSError as err:  # read-only, no permission: name the file meant, not the temp
            if err.errno is None:
                raise
            raise type(err)(err.errno, err.strerror, str(self.path)) from None
        self.file = os.fdopen(fd, self.mode)
        return self.file

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None:
                self.file.flush()
                os.fsync(self.file.fileno())
                # mkstemp makes the file private (0600); a result is as readable as any new file
                os.fchmod(self.file.fileno(), 0o666 & ~_umask())
            self.file.close()
            if exc_type is None:
                os.replace(self.tmp, self.path)
        except BaseException as err:  # a full disk at the flush: no temporary file left either
            exc_type, exc = type(err), err
            raise self._named(err) from None
        finally:
            if exc_type is not None:
                if not self.file.closed:
                    try:
                        self.file.close()
                    except OSError:  # the data it could not write
                        pass
                Path(self.tmp).unlink(missing_ok=True)
        if exc is not None:
            named = self._named(exc)
            if named is not exc:
                raise named from None

    def _named(self, err: BaseException) -> BaseException:
        """An ``OSError`` of the write that names the file written (a write to the temporary
        file's descriptor names none, or a number), else ``err`` itself."""
        if isinstance(err, OSError) and err.errno is not None and (
                err.filename is None or isinstance(err.filename, int)):
            return type(err)(err.errno, err.strerror, str(self.path))
        return err


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    with atomic_write(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")


def read_json(path: str | os.PathLike) -> Any:
    """The JSON in ``path``; a malformed file is a ``ValueError`` that names it."""
    with open(path) as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None


def git_commit() -> str:
    """The commit of the linmem source tree (``-dirty`` if tracked files outside ``results/``
    have uncommitted changes)."""
    here = Path(__file__).resolve().parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        # results/ holds outputs (a re-run overwrites its own committed record): not code
        dirty = git("-C", git("rev-parse", "--show-toplevel"), "status", "--porcelain",
                    "--untracked-files=no", "--", ".", ":(exclude)results")
    except (OSError, subprocess.SubprocessError):
        return f"unknown (linmem {__version__}, not a git checkout)"
    return commit + ("-dirty" if dirty else "")


def command_line() -> str:
    """The command that started this process, quoted so that it can be pasted into a shell."""
    prog = Path(sys.argv[0]).name if sys.argv else "python"
    if prog == "__main__.py" and Path(sys.argv[0]).parent.name == "linmem":
        prog = "linmem"  # `python -m linmem` runs the same command line
    return shlex.join([prog, *sys.argv[1:]])


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The fields of ``/proc/cpuinfo``, each key's first value, in the order they first appear
    (empty where there is no such file)."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


def _first(prefixes: tuple[str, ...]) -> str:
    """The value of the first ``/proc/cpuinfo`` field whose name starts with one of
    ``prefixes`` ("" if none)."""
    return next((v for k, v in _cpuinfo().items() if k.startswith(prefixes)), "")


def cpu_description() -> str:
    """The CPU's model name and feature flags (what decides which variant is fastest)."""
    model, flags = _first(("model name", "Model", "CPU part")), _first(("flags", "Features"))
    return f"{model or platform.processor() or platform.machine()} [{flags}]"


def _cpu_generation() -> str:
    """`` (family F, model M)`` of an x86 CPU from ``/proc/cpuinfo`` (empty elsewhere): a model
    name such as "AMD EPYC" covers generations twice as fast as each other (Zen 1 is family 23
    model 1, Zen 3 family 25)."""
    info = _cpuinfo()
    if "cpu family" not in info or "model" not in info:
        return ""
    return f" (family {info['cpu family']}, model {info['model']})"


def machine(device: str | torch.device | None = None) -> dict[str, Any]:
    """Where a timing was taken (machines differ between sessions): the CPU's model name with
    its x86 family and model (:func:`_cpu_generation`), whether it has AVX-512 and AVX2 (which
    the LMN kernel's variants need), the CPUs this process may run on and torch's threads; on a
    CUDA ``device`` the GPU's name too."""
    name, _, flags = cpu_description().partition(" [")
    cpus = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count())
    flags = flags.rstrip("]").split()
    info: dict[str, Any] = {"cpu": name + _cpu_generation(), "avx512": "avx512f" in flags,
                            "avx2": "avx2" in flags, "cpus": cpus,
                            "threads": torch.get_num_threads()}
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


# the fields of a run's provenance that trace a figure to the run that made it
PROVENANCE_FIELDS = ("command", "commit", "seed", "data_sha256")


def provenance(command: str, commit: str, seed: int | None, data_sha256: str | dict | None,
               wall_time_s: float, device: str | torch.device | None = None) -> dict[str, Any]:
    """What every result file records (training runs, the pretraining analysis, the
    benchmarks): the command, the commit it ran at, the seed, the data's checksum, the wall time,
    the machine it was measured on (:func:`machine`) and the versions of linmem and torch."""
    return {"wall_time_s": wall_time_s, "seed": seed, "commit": commit, "command": command,
            "data_sha256": data_sha256, "machine": machine(device), "linmem": __version__,
            "torch": torch.__version__}


def made_by(command: str | None, at: str | None = None) -> list[str]:
    """A generated table's closing line: the command that made it, and when or at which commit
    (none without a command)."""
    return ["", f"Made by `{command}`" + (f" at {at}" if at else "") + "."] if command else []
