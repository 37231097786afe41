"""The tiny C adapter the scenarios' servers run (``tinyadapter.c``; its modes are in
its header comment): built into ``bench/.build`` on first use."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from bench import BenchError

BENCH = Path(__file__).resolve().parent
BUILD = BENCH / ".build"
ADAPTER_SRC = BENCH / "tinyadapter.c"
ADAPTER = BUILD / "tinyadapter"


def build_adapter() -> Path:
    """Compile ``tinyadapter.c`` into ``bench/.build`` unless the binary is fresh."""
    BUILD.mkdir(exist_ok=True)
    if ADAPTER.exists() and ADAPTER.stat().st_mtime >= ADAPTER_SRC.stat().st_mtime:
        return ADAPTER
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        raise BenchError("gcc not found: it is needed to build bench/.build/tinyadapter")
    cmd = [gcc, "-O2", "-Wall", "-Wextra", "-o", str(ADAPTER), str(ADAPTER_SRC)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise BenchError(f"building the adapter failed: {done.stderr.strip()}")
    return ADAPTER


def adapter_command(*args: str) -> str:
    return shlex.join([str(ADAPTER), *args])
