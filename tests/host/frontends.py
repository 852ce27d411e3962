"""The ComfyUI frontends the browser tests run against: 1.32.9 (what ComfyUI 0.3.75 ships) and today's, which
`make host` installs into .host/ and the test server serves with --front-end-root (keep NEW in step with
FRONTEND_NEW in the Makefile)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHIPPED = "1.32.9"
NEW = "1.58.1"
NEW_ROOT = REPO / ".host" / f"frontend-{NEW}" / "comfyui_frontend_package" / "static"
ALL = [SHIPPED, NEW]
