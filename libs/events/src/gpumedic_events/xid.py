"""The XIDs an operator meets most, from NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors):
what each means, and the catalogue's resolution bucket (its immediate action).

Reference data for the `xid` field of GpuXidReported: node-sampler takes the meaning from it,
the node-incident detector the bucket and severity. A code that is not here is unknown, never
dropped: the detector records it for a person.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

XidBucket = Literal["application", "noise", "reset_gpu", "reboot", "drain"]
"""application: the job's fault (restart the job), unless it repeats on one GPU across jobs;
noise: a consequence of another error; reset_gpu: reset the GPU once nothing holds it;
reboot: the node must restart (the GPU is off the bus); drain: take the GPU out of service and
look (an RMA candidate)."""


@dataclass(frozen=True)
class XidInfo:
    code: int
    meaning: str
    bucket: XidBucket
    severity: Literal["info", "warning", "critical"]


def _table(*rows: tuple[int, str, XidBucket, str]) -> Mapping[int, XidInfo]:
    return MappingProxyType({code: XidInfo(code, meaning, bucket, severity) for code, meaning, bucket, severity in rows})  # type: ignore[arg-type]


XID_CATALOGUE: Mapping[int, XidInfo] = _table(
    (8, "GPU stopped processing (channel idle timeout)", "application", "warning"),
    (13, "Graphics engine exception (often an application fault)", "application", "warning"),
    (31, "GPU memory page fault (often an application fault)", "application", "warning"),
    (32, "Invalid or corrupted push buffer stream", "application", "warning"),
    (38, "Driver firmware error", "reset_gpu", "critical"),
    (43, "GPU stopped processing (reset channel)", "application", "info"),
    (45, "Preemptive cleanup after a previous fault", "noise", "info"),
    (48, "Double-bit ECC error", "reset_gpu", "critical"),
    (61, "Internal micro-controller breakpoint/warning", "reset_gpu", "warning"),
    (62, "Internal micro-controller halt", "reset_gpu", "critical"),
    (63, "ECC page retirement or row remap recorded", "reset_gpu", "warning"),
    (64, "ECC page retirement or row remap failed", "drain", "critical"),
    (68, "Video decoder (NVDEC) exception", "application", "warning"),
    (69, "Graphics engine class error", "reset_gpu", "critical"),
    (74, "NVLink error", "reset_gpu", "critical"),
    (79, "GPU has fallen off the bus", "reboot", "critical"),
    (92, "High single-bit ECC error rate", "drain", "warning"),
    (94, "Contained ECC error", "reset_gpu", "warning"),
    (95, "Uncontained ECC error", "reset_gpu", "critical"),
    (109, "Context switch timeout", "application", "warning"),
    (119, "GSP RPC timeout", "reset_gpu", "critical"),
    (120, "GSP error", "reset_gpu", "critical"),
    (140, "Unrecovered ECC error", "reset_gpu", "critical"),
    (154, "GPU recovery action changed (a reset or reboot is required)", "reboot", "critical"),
)

MAX_KNOWN_XID = 1000
"""Codes run to the low hundreds; one far above is a malformed report more likely than a new XID."""
