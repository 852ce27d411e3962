"""`make demo`: start a real ComfyUI with the pack, run the fresh-install example workflow through the
HTTP API, save the PNG and print the run's statistics, then stop the server.

usage: python tests/host/demo.py [OUT_DIR]
"""
from __future__ import annotations

import json
import shutil
import socket
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from client import run_prompt  # noqa: E402
from comfy_server import REPO, ComfyServer  # noqa: E402
from workflow import ui_to_api  # noqa: E402

EXAMPLE = REPO / "example_workflows" / "lantern_embedded_model.json"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "outputs/demo").resolve()
    base = REPO / ".host" / "demo"
    with ComfyServer(base, free_port()) as server:
        print(f"ComfyUI 0.3.75 with the LANTERN pack at {server.url}; running {EXAMPLE.name} over HTTP")
        prompt = ui_to_api(json.loads(EXAMPLE.read_text()), server.get("/object_info", timeout=60))
        result = run_prompt(server.url, prompt)
        if result.status != "success":
            print(json.dumps(result.messages[-3:], indent=2)[:4000], file=sys.stderr)
            return 1
        out_dir.mkdir(parents=True, exist_ok=True)
        for output in result.history["outputs"].values():
            for image in output.get("images", []):
                if image["type"] == "output":
                    src = base / "output" / image["subfolder"] / image["filename"]
                    shutil.copy(src, out_dir / image["filename"])
                    print(f"wrote {out_dir / image['filename']}")
            for stats in output.get("lantern_stats", []):
                print(f"stats: {stats['mode']}, {stats['batch']}x{stats['image_tokens']} tokens for "
                      f"{', '.join(stats['conditions'])} in {stats['wall_time_s']:.2f} s "
                      f"({stats['tokens_per_s']:.1f} tok/s), {stats['forward_passes']} forward passes, "
                      f"mean accepted length {stats['mean_accepted_length']:.2f}")
        print(f"round trip (POST /prompt -> history complete): {result.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
