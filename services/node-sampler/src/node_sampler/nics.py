"""InfiniBand and RoCE ports as the kernel shows them under /sys/class/infiniband (the stable ABI,
Documentation/ABI/stable/sysfs-class-infiniband): each device's `ports/<n>/` with `state`
("4: ACTIVE"), `phys_state` ("5: LinkUp"), `rate` ("400 Gb/sec (4X NDR)"), `link_layer`
("InfiniBand" or "Ethernet") and the PortCounters under `counters/`. A flapping or degraded port
hangs a multi-node job's collectives while every GPU looks fine; these readings show it.

A node without the directory has no ports (most nodes: nothing is read, nothing reported). Read
with each sample, so a read is a few small files per port; nothing here raises: a file that
cannot be read or parsed costs its field and a note in `errors`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from gpumedic_events import IbPort
from pydantic import ValidationError

SYS_CLASS_INFINIBAND = "/sys/class/infiniband"
MAX_PORTS = 32
COUNTERS = ("link_downed", "link_error_recovery", "symbol_error", "port_rcv_errors", "local_link_integrity_errors",
            "excessive_buffer_overrun_errors", "port_xmit_discards")
"""The PortCounters read: how often the link went down or recovered, and the error counts."""

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_STATE = re.compile(r"^\s*(\d+):\s*([A-Za-z_ ]{1,32}?)\s*$")
_RATE = re.compile(r"^\s*(\d+(?:\.5)?) Gb/sec\b")


@dataclass(frozen=True)
class NicReading:
    ports: tuple[IbPort, ...] = ()
    errors: tuple[str, ...] = ()


def parse_state(text: str) -> tuple[int, str] | None:
    """'4: ACTIVE' or '5: LinkUp' as (4, 'ACTIVE'); None when it is neither."""
    match = _STATE.match(text)
    return (int(match.group(1)), match.group(2)) if match else None


def parse_rate(text: str) -> float | None:
    """'400 Gb/sec (4X NDR)' or '2.5 Gb/sec (1X SDR)' as Gb/s; None when it is no rate."""
    match = _RATE.match(text)
    return float(match.group(1)) if match else None


class NicReader:
    """`NicReader().read()`: every port under /sys/class/infiniband now (`root` elsewhere in tests)."""

    def __init__(self, root: str | os.PathLike[str] = SYS_CLASS_INFINIBAND) -> None:
        self.root = os.fspath(root)

    def read(self) -> NicReading:
        try:
            devices = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return NicReading()  # no RDMA device: nothing to watch
        except OSError as exc:
            return NicReading(errors=(f"{self.root}: unreadable ({type(exc).__name__})",))
        ports: list[IbPort] = []
        errors: list[str] = []
        for device in devices:
            if not _NAME.fullmatch(device):
                errors.append(f"infiniband: device name {device[:64]!r} skipped")
                continue
            try:
                numbers = sorted(int(n) for n in os.listdir(f"{self.root}/{device}/ports") if n.isdigit())
            except OSError as exc:
                errors.append(f"infiniband {device}: no ports ({type(exc).__name__})")
                continue
            for number in numbers:
                if len(ports) >= MAX_PORTS:
                    errors.append(f"infiniband: more than {MAX_PORTS} ports; the rest not read")
                    return NicReading(tuple(ports), tuple(errors))
                port = self._port(device, number, errors)
                if port is not None:
                    ports.append(port)
        return NicReading(tuple(ports), tuple(errors))

    def _port(self, device: str, number: int, errors: list[str]) -> IbPort | None:
        base = f"{self.root}/{device}/ports/{number}"
        where = f"infiniband {device} port {number}"
        state = self._parsed(f"{base}/state", parse_state, where, errors)
        phys = self._parsed(f"{base}/phys_state", parse_state, where, errors)
        rate = self._parsed(f"{base}/rate", parse_rate, where, errors)
        layer = self._text(f"{base}/link_layer", where, errors)
        counters = {}
        for name in COUNTERS:
            text = self._text(f"{base}/counters/{name}", where, errors, missing_ok=True)
            if text is None:
                continue
            if text.strip().isdigit():
                counters[name] = int(text.strip())
            else:
                errors.append(f"{where}: counter {name} is {text.strip()[:40]!r}, no count")
        try:
            return IbPort(
                device=device, port=number, state=state[1] if state else None, phys_state=phys[1] if phys else None,
                rate_gbps=rate, link_layer=layer.strip() if layer and layer.strip() in ("InfiniBand", "Ethernet") else None,
                **counters,
            )
        except ValidationError as exc:
            errors.append(f"{where}: left out ({exc.errors()[0]['loc'][0]}: {exc.errors()[0]['msg']})")
            return None

    def _parsed(self, path: str, parse, where: str, errors: list[str]):
        text = self._text(path, where, errors)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            errors.append(f"{where}: {os.path.basename(path)} is {text.strip()[:60]!r}, not the kernel's form")
        return value

    @staticmethod
    def _text(path: str, where: str, errors: list[str], *, missing_ok: bool = False) -> str | None:
        try:
            with open(path, "rb", buffering=0) as f:
                return f.read(256).decode("ascii", errors="replace")
        except FileNotFoundError:
            if not missing_ok:
                errors.append(f"{where}: no {os.path.basename(path)}")
            return None
        except OSError as exc:
            errors.append(f"{where}: {os.path.basename(path)} unreadable ({type(exc).__name__})")
            return None
