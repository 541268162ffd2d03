"""What this machine can offer the network: CPU, memory, disk, GPUs."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

from intellect_protocol.shared.schemas import GpuSpec, NodeSpecs

MIN_RAM_BYTES = 2 << 30
MIN_DISK_FREE_BYTES = 1 << 30


def _nvidia_smi_gpus() -> list[GpuSpec] | None:
    """GPUs as nvidia-smi reports them, or None when it is absent or fails."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        name, _, mib = line.rpartition(",")
        if name and mib.strip().isdigit():
            gpus.append(GpuSpec(name=name.strip()[:256], memory_bytes=int(mib) << 20))
    return gpus


def _torch_gpus() -> tuple[str | None, list[GpuSpec]]:
    try:
        import torch
    except ImportError:
        return None, []
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append(GpuSpec(name=props.name[:256], memory_bytes=props.total_memory))
    return torch.__version__, gpus


def probe(disk_path: Path) -> NodeSpecs:
    """Probe the hardware; ``disk_path`` is where weights and state will be written."""
    disk_path.mkdir(parents=True, exist_ok=True)
    torch_version, torch_gpus = _torch_gpus()
    smi_gpus = _nvidia_smi_gpus()
    return NodeSpecs(
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0,
        ram_bytes=os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        disk_free_bytes=shutil.disk_usage(disk_path).free,
        gpus=smi_gpus if smi_gpus else torch_gpus,
        platform=platform.platform()[:256],
        python=platform.python_version(),
        torch=torch_version,
    )


def problems(specs: NodeSpecs) -> list[str]:
    """What is missing for this machine to do useful work; empty when it can join."""
    found = []
    if specs.torch is None:
        found.append("PyTorch is not installed; reinstall with: pip install intellect-protocol")
    if specs.ram_bytes < MIN_RAM_BYTES:
        found.append(f"only {specs.ram_bytes / 2**30:.1f} GiB of RAM; at least {MIN_RAM_BYTES >> 30} GiB is needed")
    if specs.disk_free_bytes < MIN_DISK_FREE_BYTES:
        found.append(
            f"only {specs.disk_free_bytes / 2**30:.1f} GiB free on disk; at least {MIN_DISK_FREE_BYTES >> 30} GiB is needed"
        )
    return found
