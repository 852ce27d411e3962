"""Write audit for a ComfyUI server under test (put this folder on the server's PYTHONPATH and set
LANTERN_WRITE_AUDIT=<log file>, LANTERN_PACK_DIR=<pack folder>): every file opened for writing, folder
created, file renamed or removed while a frame of the pack's own code (`lantern_core/`, `nodes/`) is on
the stack is appended to the log as one JSON line {"event", "path"}. Used by the soak test to prove the
pack writes only under ComfyUI's models/user/output/temp folders. Nothing here runs in normal use."""
import json
import os
import sys

_LOG = os.environ.get("LANTERN_WRITE_AUDIT")
_PACK = os.environ.get("LANTERN_PACK_DIR")
if _LOG and _PACK:
    _ROOTS = tuple(os.path.join(os.path.realpath(_PACK), d) + os.sep for d in ("lantern_core", "nodes"))
    _out = open(_LOG, "a", buffering=1)
    _busy = []

    def _from_pack() -> bool:
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(_ROOTS) or os.path.realpath(name).startswith(_ROOTS):
                return True
            frame = frame.f_back
        return False

    def _writes(event: str, args: tuple) -> str | None:
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
            return path if writing and isinstance(path, (str, bytes, os.PathLike)) else None
        if event in ("os.mkdir", "os.remove", "os.rmdir", "os.truncate"):
            return args[0]
        if event == "os.rename":
            return args[1]
        return None

    def _hook(event: str, args: tuple) -> None:
        if _busy or event not in ("open", "os.mkdir", "os.remove", "os.rmdir", "os.rename", "os.truncate"):
            return
        _busy.append(1)
        try:
            path = _writes(event, args)
            if path is not None and _from_pack():
                _out.write(json.dumps({"event": event, "path": os.path.abspath(os.fsdecode(path))}) + "\n")
        finally:
            _busy.pop()

    sys.addaudithook(_hook)
