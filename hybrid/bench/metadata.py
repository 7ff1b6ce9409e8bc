"""What every benchmark records beside its timings: the device's name, torch and its threads, the commit, the date."""

from __future__ import annotations

import datetime
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch


def device_name(device: torch.device) -> str:
    """The GPU's name, or the CPU's model with its architecture ("AMD EPYC 7B13 (x86_64)")."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:  # Linux names the CPU model here; platform.processor() is often empty
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({platform.machine()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """The commit this code was checked out at, or "unknown" outside a git checkout."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_metadata(device: torch.device) -> dict[str, Any]:
    """The facts that tell one benchmark run's numbers from another's: the device and its name, torch's
    version and thread count (as set for the run), the commit, and the UTC time, to the second."""
    return {"device": str(device), "device_name": device_name(device), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "git_commit": git_commit(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
