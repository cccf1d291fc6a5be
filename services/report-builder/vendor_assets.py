"""Fetch the console's third-party assets from the npm registry, check them against the pinned
integrity, and put the files the console serves under static/vendor/ (kept out of git; `make
install` runs this, and the images' wheels carry the files).

uPlot (MIT, https://github.com/leeoniya/uPlot) draws the console's time series: small, fast, no
dependencies, and what Grafana draws its panels with. Bumping it: set VERSION and INTEGRITY from
`npm view uplot@X dist.integrity`.
"""

from __future__ import annotations

import base64
import hashlib
import io
import sys
import tarfile
import urllib.request
from pathlib import Path

PACKAGE = "uplot"
VERSION = "1.6.32"
INTEGRITY = "sha512-KIMVnG68zvu5XXUbC4LQEPnhwOxBuLyW1AHtpm6IKTXImkbLgkMy+jabjLgSLMasNuGGzQm/ep3tOkyTxpiQIw=="
FILES = {"package/dist/uPlot.iife.min.js": "uPlot.iife.min.js", "package/dist/uPlot.min.css": "uPlot.min.css", "package/LICENSE": "uPlot.LICENSE"}
REGISTRY = "https://registry.npmjs.org"
TARGET = Path(__file__).parent / "src" / "report_builder" / "console" / "static" / "vendor"


def main() -> int:
    stamp = TARGET / f".{PACKAGE}-{VERSION}"
    if stamp.exists() and all((TARGET / name).exists() for name in FILES.values()):
        return 0
    url = f"{REGISTRY}/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            tarball = response.read()
    except OSError as exc:
        print(f"vendor_assets: cannot fetch {url}: {exc}", file=sys.stderr)
        return 1
    algorithm, _, expected = INTEGRITY.partition("-")
    got = base64.b64encode(hashlib.new(algorithm, tarball).digest()).decode()
    if got != expected:
        print(f"vendor_assets: {url} does not match its pinned integrity ({algorithm}-{got})", file=sys.stderr)
        return 1
    TARGET.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tarball)) as archive:
        for member, name in FILES.items():
            data = archive.extractfile(member)
            if data is None:
                print(f"vendor_assets: {member} is not in {url}", file=sys.stderr)
                return 1
            (TARGET / name).write_bytes(data.read())
    for old in TARGET.glob(f".{PACKAGE}-*"):
        old.unlink()
    stamp.touch()
    print(f"vendor_assets: {PACKAGE} {VERSION} in {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
