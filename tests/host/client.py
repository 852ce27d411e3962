"""A small client for a running ComfyUI: queue an API-format prompt, follow the websocket until the
prompt ends, and return what happened (messages, history entry). Used by the server tests and
`make demo`."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import aiohttp


@dataclass
class RunResult:
    prompt_id: str
    status: str  # "success", "error", "interrupted"
    messages: list = field(default_factory=list)  # (type, data) of every JSON websocket message
    previews: int = 0  # binary preview frames received
    history: dict = field(default_factory=dict)
    seconds: float = 0.0

    def of_type(self, kind: str) -> list:
        return [data for t, data in self.messages if t == kind]


async def run_prompt_async(base: str, prompt: dict, on_message=None, timeout: float = 600.0) -> RunResult:
    client_id = uuid.uuid4().hex
    ws_url = base.replace("http", "ws", 1) + f"/ws?clientId={client_id}"
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=0) as ws:
        start = time.perf_counter()
        async with session.post(f"{base}/prompt", json={"prompt": prompt, "client_id": client_id}) as resp:
            body = await resp.json()
            if resp.status != 200:  # the failing nodes' types first: the body can be long (paths, download hints)
                failing = sorted({str(e.get("class_type")) for e in (body.get("node_errors") or {}).values()
                                  if isinstance(e, dict)}) if isinstance(body, dict) else []
                raise ValueError(f"POST /prompt -> {resp.status}: node_errors in {failing}: "
                                 f"{json.dumps(body)[:3000]}")
        prompt_id = body["prompt_id"]
        result = RunResult(prompt_id, "running")
        deadline = time.monotonic() + timeout
        while result.status == "running":
            msg = await ws.receive(timeout=max(1.0, deadline - time.monotonic()))
            if msg.type == aiohttp.WSMsgType.BINARY:
                result.previews += 1
                continue
            if msg.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"websocket closed: {msg}")
            data = json.loads(msg.data)
            kind, payload = data["type"], data.get("data", {})
            if payload.get("prompt_id") not in (None, prompt_id):
                continue
            result.messages.append((kind, payload))
            if on_message is not None:
                await on_message(kind, payload, session)
            if kind == "execution_success":
                result.status = "success"
            elif kind == "execution_error":
                result.status = "error"
            elif kind == "execution_interrupted":
                result.status = "interrupted"
        for _ in range(400):
            async with session.get(f"{base}/history/{prompt_id}") as resp:
                history = await resp.json()
            if prompt_id in history and history[prompt_id].get("status", {}).get("completed") is not None:
                result.history = history[prompt_id]
                break
            await asyncio.sleep(0.05)
        result.seconds = time.perf_counter() - start
        return result


def run_prompt(base: str, prompt: dict, on_message=None, timeout: float = 600.0) -> RunResult:
    return asyncio.run(run_prompt_async(base, prompt, on_message, timeout))
