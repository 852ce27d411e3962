"""Turn a UI-format workflow (what example_workflows/ holds and the editor saves) into the API format that
`POST /prompt` accepts, using the server's /object_info for the widget order. Covers what our example
workflows use: linked sockets, widgets, and the extra control_after_generate value after a seed widget.
"""
from __future__ import annotations

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


def _is_widget(spec) -> bool:
    kind = spec[0]
    return isinstance(kind, list) or kind in WIDGET_TYPES


def ui_to_api(workflow: dict, object_info: dict) -> dict:
    links = {link[0]: link for link in workflow["links"]}  # id -> [id, from, from_slot, to, to_slot, type]
    prompt = {}
    for node in workflow["nodes"]:
        if node.get("mode", 0) != 0:
            continue
        info = object_info[node["type"]]
        linked = {inp["name"]: inp["link"] for inp in node.get("inputs", []) if inp.get("link") is not None}
        values = list(node.get("widgets_values", []))
        inputs = {}
        order = info.get("input_order", {})
        specs = {**info["input"].get("required", {}), **info["input"].get("optional", {})}
        for name in order.get("required", []) + order.get("optional", []):
            spec = specs[name]
            if name in linked:
                link = links[linked[name]]
                inputs[name] = [str(link[1]), link[2]]
                if _is_widget(spec) and values:  # a widget turned into a socket still keeps its value
                    values.pop(0)
            elif _is_widget(spec):
                inputs[name] = values.pop(0)
                options = spec[1] if len(spec) > 1 else {}
                if options.get("control_after_generate") or name in ("seed", "noise_seed"):
                    values.pop(0)  # "fixed" / "randomize" ...: frontend-only
        prompt[str(node["id"])] = {"class_type": node["type"], "inputs": inputs}
    return prompt
