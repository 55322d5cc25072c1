"""Alpha-beta cost of the collectives, per mesh axis.

A ring collective over p ranks of n bytes (the full tensor): all-gather and reduce-scatter take
(p-1)·alpha + (p-1)/p · n / beta; all-reduce is both, 2(p-1)·alpha + 2(p-1)/p · n / beta. beta is the
bus bandwidth NCCL's tests report. Presets are typical single-host figures; `python -m
colauto_backend.calibrate` measures alpha and beta on the real devices and writes a JSON file that
COLAUTO_COMM names.
"""
from __future__ import annotations

import dataclasses
import json
import os

from ..config import ConfigError


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    alpha_s: float          # latency per ring step
    bandwidth: float        # bus bandwidth, bytes/s

    def all_gather(self, nbytes: float, p: int) -> float:
        return 0.0 if p <= 1 else (p - 1) * self.alpha_s + (p - 1) / p * nbytes / self.bandwidth

    reduce_scatter = all_gather

    def all_reduce(self, nbytes: float, p: int) -> float:
        return 2 * self.all_gather(nbytes, p)


PRESETS = {
    "nvlink-h100": Link("nvlink-h100", 10e-6, 350e9),   # NVLink 4, NCCL busbw on one HGX host
    "nvlink-a100": Link("nvlink-a100", 10e-6, 230e9),
    "pcie": Link("pcie", 15e-6, 20e9),
    "gloo": Link("gloo", 50e-6, 2e9),                    # CPU processes on one machine
}
_FOR_DEVICE = {"h100": "nvlink-h100", "h200": "nvlink-h100", "a100": "nvlink-a100", "cpu": "gloo"}


def resolve(setting: str | None, device_name: str) -> Link:
    """COLAUTO_COMM: a preset name, a calibration JSON, or (unset) the preset for the device."""
    if setting is None:
        return PRESETS[_FOR_DEVICE.get(device_name.split(" ")[0], "nvlink-h100")]
    if setting in PRESETS:
        return PRESETS[setting]
    if setting.endswith(".json") and os.path.isfile(setting):
        with open(setting) as f:
            data = json.load(f)
        return Link(data.get("name", setting), float(data["alpha_s"]), float(data["bandwidth"]))
    raise ConfigError(f"COLAUTO_COMM={setting!r} is not valid: use a preset ({', '.join(PRESETS)}) or the "
                      "JSON file `python -m colauto_backend.calibrate` wrote")
