"""Where a measurement came from: GPU, driver, library versions, code version."""
from __future__ import annotations

import datetime as _dt
import os
import subprocess

# Shared with the runtime's tuned tables (ops.py); provenance.git_sha stays importable.
from ..util import git_sha


def _nvidia_smi(field: str, index: int) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader", "-i", str(index)],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def collect(device_index: int | None = None) -> dict:
    """Provenance fields stored on every row. Works without a GPU (fields say 'cpu')."""
    import torch
    import triton

    info = {
        "torch_version": torch.__version__,
        "triton_version": triton.__version__,
        "git_sha": git_sha(),
        "hostname": os.uname().nodename,
    }
    if device_index is None or not torch.cuda.is_available():
        info.update(gpu_name="cpu", gpu_uuid="cpu", sm_count=0, driver="none", l2_bytes=0, arch="cpu")
        return info
    props = torch.cuda.get_device_properties(device_index)
    uuid = str(getattr(props, "uuid", "")) or _nvidia_smi("uuid", device_index)
    if uuid and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid
    info.update(
        gpu_name=props.name,
        gpu_uuid=uuid,
        sm_count=props.multi_processor_count,
        driver=_nvidia_smi("driver_version", device_index),
        l2_bytes=int(getattr(props, "L2_cache_size", 50 * 1024 * 1024)),
        arch=f"sm{props.major}{props.minor}",
    )
    return info


def now() -> str:
    """UTC timestamp, ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
