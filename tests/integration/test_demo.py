"""`make run`'s demo (`python -m scripts.demo`) end to end: its own embedded cluster on a free port, five
vehicles and a late one served, exit 0 with `demo passed` (the README's first command must keep working)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_delivers_to_every_vehicle_and_exits_cleanly(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "scripts.demo", "--port", "0", "--exit-after-demo",
                        "--data-dir", str(tmp_path / "var")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    assert "fanout ready mqtt://127.0.0.1:" in r.stdout
    assert "demo passed" in r.stdout
