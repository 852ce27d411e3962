"""Start and stop a real ComfyUI server with this pack linked in, in a scratch base directory.

Used by the node tests (pytest fixtures), `make serve` and `make demo`. The server gets its own
--base-directory (models, custom_nodes, input, output, temp, user), so nothing is written into the
ComfyUI tree or the pack folder.

    python tests/host/comfy_server.py serve --port 8188            # for a person (make serve)
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_COMFY = REPO / ".host" / "ComfyUI"
PACK_NAME = "lantern"


class ServerError(RuntimeError):
    pass


class ComfyServer:
    def __init__(self, base_dir: Path, port: int, comfy_dir: Path = DEFAULT_COMFY, extra_args: tuple = (),
                 python: str = sys.executable, env: dict | None = None):
        self.base_dir, self.port, self.comfy_dir = Path(base_dir), port, Path(comfy_dir)
        self.extra_args, self.python = tuple(extra_args), python
        self.env = None if env is None else {**os.environ, **env}  # extra environment for the server
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = self.base_dir / "server.log"
        self.process: subprocess.Popen | None = None

    def prepare(self) -> None:
        for sub in ("custom_nodes", "models/lantern/checkpoints", "models/lantern/vq",
                    "models/lantern/text_encoders", "input", "output", "temp", "user/default"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        link = self.base_dir / "custom_nodes" / PACK_NAME
        if not link.exists():
            link.symlink_to(REPO, target_is_directory=True)
        settings = self.base_dir / "user" / "default" / "comfy.settings.json"
        if not settings.exists():  # a fresh user dir opens the Templates dialog over the canvas
            settings.write_text(json.dumps({"Comfy.TutorialCompleted": True,
                                            "Comfy.Notification.ShowVersionUpdates": False}))

    def start(self, timeout: float = 180.0) -> "ComfyServer":
        if not (self.comfy_dir / "main.py").is_file():
            raise ServerError(f"no ComfyUI at {self.comfy_dir}: run `make host` first")
        self.prepare()
        cmd = [self.python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(self.port),
               "--disable-auto-launch", "--base-directory", str(self.base_dir),
               "--database-url", f"sqlite:///{self.base_dir / 'comfyui.db'}", *self.extra_args]
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(cmd, cwd=self.comfy_dir, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServerError(f"ComfyUI exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                self.get("/system_stats")
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.25)
        else:
            self.stop()
            raise ServerError(f"ComfyUI did not answer within {timeout} s:\n{self.log_tail()}")
        if "(IMPORT FAILED)" in self.log_path.read_text(errors="replace"):
            self.stop()
            raise ServerError(f"the pack failed to import:\n{self.log_tail()}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def log_tail(self, lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.process.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise ServerError("no VmRSS")

    def request(self, method: str, path: str, payload: dict | None = None, timeout: float = 30.0):
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            body = resp.read()
        return json.loads(body) if body and resp.headers.get_content_type() == "application/json" else body

    def get(self, path: str, timeout: float = 30.0):
        return self.request("GET", path, timeout=timeout)

    def post(self, path: str, payload: dict, timeout: float = 30.0):
        return self.request("POST", path, payload, timeout=timeout)

    def __enter__(self) -> "ComfyServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="Run a real ComfyUI with the LANTERN pack linked in")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="start a server for a person and keep it running")
    serve.add_argument("--port", type=int, default=8188)
    serve.add_argument("--base-dir", type=Path, default=REPO / ".host" / "serve")
    args = parser.parse_args()
    server = ComfyServer(args.base_dir, args.port, extra_args=("--preview-method", "auto"))
    server.start()
    print(f"ComfyUI with the LANTERN pack: {server.url}  (models: {args.base_dir / 'models' / 'lantern'}; Ctrl-C stops)")
    try:
        server.process.wait()
    except KeyboardInterrupt:
        server.stop()


if __name__ == "__main__":
    main()
