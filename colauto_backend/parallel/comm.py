"""Alpha-beta cost of the collectives, per mesh axis.

A ring collective over p ranks of n bytes (the full tensor): all-gather and reduce-scatter take
(p-1)·alpha + (p-1)/p · n / beta; all-reduce is both, 2(p-1)·alpha + 2(p-1)/p · n / beta. beta is the
bus bandwidth NCCL's tests report. The NVLink presets hold one host of 8 devices: a collective whose
ranks span hosts (`Link.over`) runs at the network's alpha and beta instead. Presets are typical single-host figures; `python -m
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
    host_size: int = 0      # devices per host on this link (0: every device); beyond it, `between_hosts`
    between_hosts: "Link | None" = None

    def all_gather(self, nbytes: float, p: int) -> float:
        return 0.0 if p <= 1 else (p - 1) * self.alpha_s + (p - 1) / p * nbytes / self.bandwidth

    reduce_scatter = all_gather

    def all_reduce(self, nbytes: float, p: int) -> float:
        return 2 * self.all_gather(nbytes, p)

    def over(self, axes: tuple, roles: set[str]) -> "Link":
        """The link a collective over the mesh axes with these roles runs on. Ranks are laid out
        outermost axis first (the innermost axis on neighbouring ranks, as init_device_mesh does), so
        an axis stays on one host when it and the axes inside it fit a host; otherwise the collective
        crosses hosts and runs at the network's rate (`between_hosts`)."""
        if not self.host_size or self.between_hosts is None:
            return self
        inner = 1
        for role, size in reversed(axes):
            span = inner * size
            if role in roles and size > 1 and (span > self.host_size or self.host_size % span):
                return self.between_hosts
            inner = span
        return self


# Between hosts: 400 Gb/s InfiniBand/RoCE per GPU (HGX H100 clusters, e.g. torchtitan's Grand Teton
# hosts), about 40 GB/s of NCCL bus bandwidth across hosts, with a higher per-step latency.
IB_400G = Link("ib-400g", 20e-6, 40e9)
IB_200G = Link("ib-200g", 20e-6, 20e9)
PRESETS = {
    # NVLink 4, NCCL busbw on one HGX host of 8; collectives whose ranks span hosts run on IB_400G
    "nvlink-h100": Link("nvlink-h100", 10e-6, 350e9, 8, IB_400G),
    "nvlink-a100": Link("nvlink-a100", 10e-6, 230e9, 8, IB_200G),
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
