"""Entry point `make bench` looks for (bench/*/run.py): runs every benchmark script beside it, one at a time.

Each script stays runnable on its own; this only sequences them, so a new benchmark needs no registration.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    here = Path(__file__).resolve().parent
    failed = []
    for script in sorted(p for p in here.glob("*.py") if p.name != "run.py"):
        print(f"== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script)], check=False).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
