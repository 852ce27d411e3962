"""Hostile parameters through a real ComfyUI 0.3.75 server (`main.py --cpu`), driven by its /object_info so
that every input of every Lantern* node has cases (a new input or combo option without them fails the
coverage test).

Beyond the limits (below min / above max, NaN, wrong types, links that are not links, unknown combo values,
hostile text) POST /prompt must answer 400 with `node_errors` naming the node and the input, or the run
must end in an `execution_error` raised as one of the pack's own exceptions (lantern_core.errors) whose
message names the parameter; never a bare TypeError / KeyError / RuntimeError from our code. At the limits
(exactly min and max, every combo option) a run succeeds or gives such a pack error. Afterwards the server
is alive, its prompt worker too, and a normal run succeeds.

`hostile_summary()` returns the figures of the session (cases, outcomes, errors by kind, seconds);
`pytest -s` prints them; `make soak` writes them to bench/results/hostile_inputs.json.
"""
from __future__ import annotations

import copy
import itertools
import json
import os
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from client import run_prompt
from lantern_core import errors as pack_errors
from workflow import ui_to_api

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "example_workflows"
GRAPHS = {"base": "lantern_embedded_model", "pp": "lantern_pp_embedded_model", "sjd": "lantern_sjd_embedded_model"}

# What ComfyUI reports as exception_type for our errors: "<module of the pack>.lantern_core.errors.<Class>"
PACK_ERRORS = sorted(name for name, obj in vars(pack_errors).items()
                     if isinstance(obj, type) and issubclass(obj, pack_errors.LanternError))
HOST_VALIDATION_EXCEPTIONS = ("exception_during_validation", "exception_during_inner_validation")
# ComfyUI 0.3.75's own validation raises on these (KeyError on the missing node, IndexError on the slot) and
# reports it as a node error; no code of ours runs. Anything else raised during validation fails the test.
HOST_RAISES_ON = ("dangling link", "link to a missing output")

HTML = '<img src=x onerror="window.__pwned=1"><script>window.__pwned=1</script><b>bold</b>'
MB = 1 << 20


def nested(depth: int) -> dict:
    value: dict = {"leaf": 1}
    for _ in range(depth):
        value = {"a": value}
    return value


# ------------------------------------------------------------------------------------------------ figures

FIGURES: dict = {"cases": Counter(), "outcomes": Counter(), "by_kind": {}, "seconds": {}, "slowest": []}


def record(group: str, label: str, outcome: "Outcome", kind: str) -> None:
    FIGURES["cases"][group] += 1
    FIGURES["outcomes"][outcome.status] += 1
    FIGURES["by_kind"].setdefault(group, Counter())[kind] += 1
    FIGURES["slowest"] = sorted(FIGURES["slowest"] + [(round(outcome.seconds, 2), label[:160])], reverse=True)[:5]


def hostile_summary() -> dict:
    """The figures so far, JSON-ready: cases by group ("beyond limits", "at limits"), outcomes (rejected = 400
    from POST /prompt, error, success), and per group the outcomes by kind: "validation:<ComfyUI error type>"
    for a 400, "execution:<exception class>" for a run's error, "success"; seconds per group; slowest cases."""
    kinds = {group: dict(sorted(counter.items())) for group, counter in FIGURES["by_kind"].items()}
    total = Counter()
    for counter in FIGURES["by_kind"].values():
        total.update(counter)
    return {"total_cases": sum(FIGURES["cases"].values()), "cases": dict(FIGURES["cases"]),
            "outcomes": dict(FIGURES["outcomes"]), "errors_by_kind": dict(sorted(total.items())),
            "errors_by_kind_per_group": kinds, "seconds": dict(FIGURES["seconds"]),
            "slowest_cases": [list(x) for x in FIGURES["slowest"]]}


def print_summary() -> None:
    """Print the figures; with LANTERN_HOSTILE_REPORT=<file.json> (make soak) also write them there."""
    s = hostile_summary()
    if os.environ.get("LANTERN_HOSTILE_REPORT"):
        Path(os.environ["LANTERN_HOSTILE_REPORT"]).write_text(json.dumps(s, indent=1))
    print(f"\nhostile inputs: {s['total_cases']} cases {s['cases']}, outcomes {s['outcomes']}, seconds {s['seconds']}")
    for group, kinds in s["errors_by_kind_per_group"].items():
        print(f"  {group}:")
        for kind, count in kinds.items():
            print(f"    {count:4d}  {kind}")
    print(f"  slowest: {s['slowest_cases']}")


# ------------------------------------------------------------------------------------------------ graphs


def node_id(prompt: dict, class_type: str) -> str:
    ids = [k for k, v in prompt.items() if v["class_type"] == class_type]
    assert len(ids) == 1, (class_type, ids)
    return ids[0]


def build_graphs(object_info: dict) -> dict:
    """API prompts by name: the three shipped embedded-model workflows, Lantern: Generate on its own, the
    model and conditioning previewed as text (cheap: no sampling), and the model loader alone."""
    graphs = {name: ui_to_api(json.loads((EXAMPLES / f"{stem}.json").read_text()), object_info)
              for name, stem in GRAPHS.items()}
    base = graphs["base"]
    loader, cond, config = (node_id(base, t) for t in ("LanternModelLoader", "LanternConditioning",
                                                       "LanternDecodingConfig"))
    sampler = base[node_id(base, "LanternSampler")]["inputs"]
    generate = {"model": [loader, 0], "class_name": "cat", "prompt": "", "decoding": [config, 0],
                **{k: v for k, v in sampler.items() if k not in ("model", "conditioning", "decoding")}}
    graphs["gen"] = {loader: base[loader], config: base[config],
                     "20": {"class_type": "LanternGenerate", "inputs": generate},
                     "21": {"class_type": "SaveImage", "inputs": {"images": ["20", 0], "filename_prefix": "hostile"}}}
    graphs["cond"] = {loader: base[loader], cond: base[cond], config: base[config],  # config: a wrong-type source
                      "30": {"class_type": "PreviewAny", "inputs": {"source": [cond, 0]}}}
    graphs["loader"] = {loader: base[loader], "31": {"class_type": "PreviewAny", "inputs": {"source": [loader, 0]}}}
    return graphs


_unique = itertools.count()


def make_prompt(graphs: dict, graph: str, settings: dict) -> dict:
    """A copy of `graph` with `settings` ({class_type: {input: value}}) applied. Every prompt gets a text of
    its own in an input the embedded (class-conditional) model ignores, so ComfyUI's cache never answers for
    a run: the conditioning's prompt, or Lantern: Generate's."""
    prompt = copy.deepcopy(graphs[graph])
    tag = f"hostile-inputs {next(_unique)} {time.time()}"
    for node in prompt.values():
        if node["class_type"] in ("LanternConditioning", "LanternGenerate"):
            node["inputs"]["prompt"] = tag
    for class_type, inputs in settings.items():
        node = prompt[node_id(prompt, class_type)]["inputs"]
        for name, value in inputs.items():
            if value is MISSING:
                node.pop(name, None)
            else:
                node[name] = value
    return prompt


# ------------------------------------------------------------------------------------------------ cases

MISSING = object()  # the input is left out of the prompt


@dataclass
class Case:
    node: str  # class_type
    input: str
    label: str
    value: object
    may_succeed: bool = False  # text the node ignores (a c2i model's prompt), an optional socket left empty


# Where each node's inputs are exercised: the graph, and the other settings of that node that make the input
# matter (a tree only counts in a tree mode, gsd_gap only with the gsd rule...).
CONTEXT = {
    "LanternModelLoader": ("base", {}),
    "LanternDrafterLoader": ("pp", {}),
    "LanternConditioning": ("cond", {}),
    "LanternSampler": ("base", {}),
    "LanternDecode": ("base", {}),
    "LanternGenerate": ("gen", {}),
    "LanternDecodingConfig": ("pp", {"mode": "lantern_pp"}),
}
CONFIG_CONTEXT = {
    "tree": ("pp", {"mode": "static_tree"}),
    "chain_length": ("pp", {"mode": "static_tree", "tree": "chain"}),
    "custom_tree": ("pp", {"mode": "static_tree", "tree": "custom"}),
    "delta": ("pp", {"mode": "lantern"}),
    "eagle_depth": ("pp", {"mode": "eagle2"}),
    "eagle_top_k": ("pp", {"mode": "eagle2"}),
    "eagle_nodes": ("pp", {"mode": "eagle2"}),
    "jacobi_window": ("sjd", {"mode": "sjd_relaxed"}),
    "jacobi_init": ("sjd", {"mode": "sjd_relaxed"}),
    "sjd_relaxation": ("sjd", {"mode": "sjd_relaxed"}),
    "gsd_gap": ("sjd", {"mode": "sjd_relaxed", "sjd_relaxation": "gsd"}),
    "jacobi_rows": ("sjd", {"mode": "sjd_coupled"}),
    "jacobi_row_window": ("sjd", {"mode": "sjd_coupled", "jacobi_rows": 2}),
    "jacobi_row_offset": ("sjd", {"mode": "sjd_coupled", "jacobi_rows": 2}),
    "jacobi_continuation": ("sjd", {"mode": "sjd"}),
    "jacobi_proactive": ("sjd", {"mode": "sjd_coupled"}),
    "compile": ("base", {"mode": "ar"}),
}
IGNORED_TEXT = {("LanternConditioning", "prompt"), ("LanternGenerate", "prompt")}  # c2i models ignore the prompt

EXTRA = {  # input-specific hostile values, besides those of its kind
    "class_name": ["\u00b2", "--1", "-1", "8", "9" * 5000, "0," * (MB // 2), " , ,\t, ", "1e3", "cat\u0000"],
    "custom_tree": ["[" * 100_000, "[]", "{}", "[[1e400]]", "[[NaN]]", "[[0, 0]]", "[[0], [2]]", "[[-1]]",
                    '[[0], [0, "x"]]', json.dumps([[r] for r in range(513)]),
                    json.dumps([[0] * d for d in range(1, 66)]), "[[" + "0," * 200_000 + "0]]"],
}


def widget_kind(spec: list) -> str:
    kind = spec[0]
    if isinstance(kind, list):
        return "COMBO"
    return kind if kind in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO") else "SOCKET"


def spec_options(spec: list) -> dict:
    return spec[1] if len(spec) > 1 else {}


def combo_options(spec: list) -> list:
    return spec[0] if isinstance(spec[0], list) else spec_options(spec).get("options", [])


def all_inputs(object_info: dict) -> dict:
    """{(class_type, input): (spec, required)} for every Lantern* node."""
    out = {}
    for class_type, info in sorted(object_info.items()):
        if not class_type.startswith("Lantern"):
            continue
        for category in ("required", "optional"):
            for name, spec in info["input"].get(category, {}).items():
                out[(class_type, name)] = (spec, category == "required")
    return out


def beyond_cases(class_type: str, name: str, spec: list, required: bool, sources: dict) -> list[Case]:
    """Values beyond an input's limits and of wrong types, by its kind."""
    kind, opts = widget_kind(spec), spec_options(spec)
    wrong_source = sources["LANTERN_DECODING"] if spec[0] == "LANTERN_MODEL" else sources["LANTERN_MODEL"]
    # any text is fine there, as long as nothing breaks; the host turns any value of a BOOLEAN into bool(value)
    ignored = (class_type, name) in IGNORED_TEXT or kind == "BOOLEAN"
    links = [("3-item list", [sources["LANTERN_MODEL"][0], 0, 0]), ("dangling link", ["9999", 0]),
             ("link to a missing output", [sources["LANTERN_MODEL"][0], 7]), ("wrong-type link", wrong_source)]
    cases = [Case(class_type, name, label, value) for label, value in links]
    cases += [Case(class_type, name, label, value, may_succeed=ignored) for label, value in [
        ("wrapped list", {"__value__": [0, 1]}), ("dict", {"a": 1}), ("nested dict", nested(100))]]
    if required:
        cases.append(Case(class_type, name, "missing", MISSING))
    if kind in ("INT", "FLOAT"):
        step = opts.get("step", 1) if kind == "FLOAT" else 1
        cases += [Case(class_type, name, "below min", opts["min"] - step),
                  Case(class_type, name, "above max", opts["max"] + step),
                  Case(class_type, name, "non-numeric string", "abc"), Case(class_type, name, "null", None),
                  Case(class_type, name, "1 MB string", "7" * MB)]
        if kind == "INT":
            cases += [Case(class_type, name, "fraction string", "1.5"), Case(class_type, name, "NaN", float("nan")),
                      Case(class_type, name, "infinity", float("inf"))]
        else:
            cases += [Case(class_type, name, "NaN", float("nan")), Case(class_type, name, "'nan' string", "nan"),
                      Case(class_type, name, "infinity", float("inf")),
                      Case(class_type, name, "-infinity", float("-inf"))]
    elif kind == "STRING":
        cases += [Case(class_type, name, label, value, may_succeed=ignored) for label, value in [
            ("1 MB string", "x" * MB), ("html", HTML), ("NUL bytes", "a\u0000b\u0000"), ("null", None),
            ("bool", True), ("number", 12345)]]
        cases += [Case(class_type, name, f"extra {value[:12]!r}{'...' if len(value) > 12 else ''}", value,
                       may_succeed=ignored) for value in EXTRA.get(name, [])]
    elif kind == "COMBO":
        cases += [Case(class_type, name, label, value) for label, value in [
            ("unknown option", "no-such-option"), ("1 MB string", "x" * MB), ("html", HTML),
            ("NUL bytes", "a\u0000b"), ("empty", ""), ("parent path", "../../../../etc/passwd"),
            ("absolute path", "/etc/passwd"), ("number", 5), ("null", None), ("bool", True)]]
    elif kind == "BOOLEAN":  # the host turns any value into bool(value): whatever arrives must decode or refuse
        cases += [Case(class_type, name, label, value, may_succeed=True) for label, value in [
            ("string", "no"), ("number", 2), ("null", None), ("1 MB string", "x" * MB), ("list", [0])]]
    elif kind == "SOCKET":
        cases += [Case(class_type, name, "number", 5), Case(class_type, name, "string", "model"),
                  Case(class_type, name, "bool", True),
                  Case(class_type, name, "null", None, may_succeed=not required)]  # optional: unconnected
    else:
        raise AssertionError(f"{class_type}.{name}: no hostile cases for inputs of kind {kind}")
    return cases


# At the limits: runs of several independent settings each (all at a min, max or combo option), with the
# graph they run in. Every INT/FLOAT min and max and every combo option must be in some run (checked).
SAMPLER_MIN = dict(cfg=0.0, temperature=0.0, top_k=0, top_p=0.01, seed=0, batch_size=1)
SAMPLER_MAX = dict(cfg=30.0, temperature=5.0, top_k=1_000_000, top_p=1.0, seed=2 ** 64 - 1, batch_size=64)
CFG_OFF = {"LanternSampler": {"cfg": 1.0}}  # one row per image: halves the cost of the big speculative runs
LIMIT_RUNS = [
    ("base", {"LanternSampler": SAMPLER_MIN, "LanternDecodingConfig": {"mode": "ar", "compile": "off"}}),
    ("base", {"LanternSampler": SAMPLER_MAX, "LanternDecodingConfig": {"mode": "ar", "compile": "auto"}}),
    ("gen", {"LanternGenerate": {**SAMPLER_MIN, "class_name": "coffee"}}),
    ("gen", {"LanternGenerate": {**SAMPLER_MAX, "class_name": "7"}}),
    ("pp", {"LanternDecodingConfig": dict(mode="eagle2", eagle_depth=16, eagle_top_k=64, eagle_nodes=512), **CFG_OFF}),
    ("pp", {"LanternDecodingConfig": dict(mode="lantern", eagle_depth=1, eagle_top_k=1, eagle_nodes=1, lantern_k=1,
                                          delta=1.0)}),
    ("pp", {"LanternDecodingConfig": dict(mode="lantern_pp", tree="chain", chain_length=32, lam=100.0), **CFG_OFF}),
    ("pp", {"LanternDecodingConfig": dict(mode="static_tree", tree="chain", chain_length=1)}),
    ("pp", {"LanternDecodingConfig": dict(mode="lantern_pp", tree="naive_extend_57", lam=1.0)}),
    ("pp", {"LanternDecodingConfig": dict(mode="static_tree", tree="mc_sim_7b_63")}),
    ("pp", {"LanternDecodingConfig": dict(mode="static_tree", tree="custom")}),
    # custom trees at the node's caps (512 nodes, depth 64; one more is refused: EXTRA above)
    ("pp", {"LanternDecodingConfig": dict(mode="lantern_pp", tree="custom",
                                          custom_tree=json.dumps([[0] * d for d in range(1, 65)])), **CFG_OFF}),
    ("pp", {"LanternDecodingConfig": dict(mode="static_tree", tree="custom",
                                          custom_tree=json.dumps([[r] for r in range(512)])), **CFG_OFF}),
    ("pp", {"LanternDecodingConfig": dict(mode="lantern_pp", tree="auto")}),
    ("pp", {"LanternDecodingConfig": dict(mode="lantern_pp", lantern_k=65535)}),  # > codebook - 1: a pack error
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd", jacobi_window=256, jacobi_init="random", compile="graphs")}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_coupled", jacobi_window=0, jacobi_init="sample_left")}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_relaxed", sjd_relaxation="lantern", delta=0.0, lantern_k=1,
                                           jacobi_window=1, jacobi_init="repeat_above")}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_relaxed", sjd_relaxation="gsd", gsd_gap=0.0, lantern_k=10,
                                           jacobi_init="repeat_left")}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_relaxed", sjd_relaxation="gsd", gsd_gap=1.0, lantern_k=10)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_relaxed", sjd_relaxation="lantern_pp", lam=1.0, lantern_k=10)}),
    # 2-D Jacobi geometry at its limits: 8 rows 80 tokens apart (most windows past the image), a 64-wide lower
    # window below the frontier, and the most negative offset with one row (where it is not read)
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_coupled", jacobi_window=4, jacobi_rows=8, jacobi_row_window=1,
                                           jacobi_row_offset=64)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd", jacobi_window=4, jacobi_rows=2, jacobi_row_window=64,
                                           jacobi_row_offset=0)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_coupled", jacobi_rows=1, jacobi_row_offset=-64)}),
    # relaxed 2-D at its limits: the widest frontier (most lanes idle past its row) and 8 rows of 64-wide windows
    # on 16-token rows, then the smallest geometry; continuation on with its widest window
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_2d_relaxed", jacobi_window=256, jacobi_rows=8,
                                           jacobi_row_window=64)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_2d_relaxed", jacobi_window=1, jacobi_rows=2, jacobi_row_window=1)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd", jacobi_window=256, jacobi_continuation=True)}),
    # proactive drafting at its widest (8 candidates) with the widest window, and on a one-token window
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd", jacobi_window=256, jacobi_continuation=True,
                                           jacobi_proactive=8)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_coupled", jacobi_window=1, jacobi_rows=2, jacobi_proactive=8)}),
    ("sjd", {"LanternDecodingConfig": dict(mode="sjd_coupled", jacobi_rows=0, jacobi_proactive=1)}),  # auto geometry
]


def limit_runs(object_info: dict) -> list[tuple[str, dict]]:
    """LIMIT_RUNS plus, for the file lists (whatever the server lists) and dtype, one model-loader-only run
    per option; each weight format in a whole generation; the drafter list's options each run in the
    LANTERN++ graph."""
    info = object_info["LanternModelLoader"]["input"]["required"]
    runs = [("loader", {"LanternModelLoader": {"dtype": dtype}}) for dtype in combo_options(info["dtype"])]
    for name in ("checkpoint", "vq_tokenizer", "text_encoder"):
        runs += [("loader", {"LanternModelLoader": {name: option, "dtype": "fp32"}})
                 for option in combo_options(info[name])]
    # every weight format through a whole generation (the embedded model quantized at load)
    runs += [("base", {"LanternModelLoader": {"weights": option}}) for option in combo_options(info["weights"])]
    runs += [("base", {"LanternModelLoader": {"kv_cache": option}}) for option in combo_options(info["kv_cache"])]
    drafters = combo_options(object_info["LanternDrafterLoader"]["input"]["required"]["drafter"])
    runs += [("pp", {"LanternDrafterLoader": {"drafter": option}}) for option in drafters]
    # every image size on the embedded model: auto runs, every Lumina-mGPT size is refused (a pack error)
    sizes = combo_options(object_info["LanternConditioning"]["input"]["required"]["image_size"])
    runs += [("base", {"LanternConditioning": {"image_size": option}}) for option in sizes]
    return runs + LIMIT_RUNS


def limit_coverage(object_info: dict) -> set:
    """(class_type, input, value) set at a limit by some run."""
    return {(class_type, name, json.dumps(value)) for _, settings in limit_runs(object_info)
            for class_type, inputs in settings.items() for name, value in inputs.items()}


# ------------------------------------------------------------------------------------------------ running


@dataclass
class Outcome:
    status: str  # "rejected" (POST /prompt refused it), "success", "error", "timeout"
    body: dict = field(default_factory=dict)  # the 400 answer, or the execution_error message
    seconds: float = 0.0


def submit(server, prompt: dict, timeout: float = 600.0) -> Outcome:
    """POST the prompt; on 200 follow /history until the prompt completes."""
    start = time.perf_counter()
    request = urllib.request.Request(server.url + "/prompt", data=json.dumps({"prompt": prompt}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            prompt_id = json.loads(resp.read())["prompt_id"]
    except urllib.error.HTTPError as err:
        body = err.read()
        return Outcome("rejected", {"http": err.code, **json.loads(body or b"{}")}, time.perf_counter() - start)
    deadline = time.monotonic() + timeout
    while True:
        entry = server.get(f"/history/{prompt_id}").get(prompt_id)
        if entry and entry.get("status", {}).get("completed") is not None:
            break
        if time.monotonic() > deadline:
            server.post("/interrupt", {})
            return Outcome("timeout", {"prompt_id": prompt_id}, time.perf_counter() - start)
        time.sleep(0.02)
    status = entry["status"]
    errors = [data for kind, data in status.get("messages", []) if kind in ("execution_error", "execution_interrupted")]
    return Outcome("success" if status["status_str"] == "success" else "error", errors[0] if errors else {},
                   time.perf_counter() - start)


def names_of(object_info: dict, class_type: str, name: str) -> list[str]:
    spec, _ = all_inputs(object_info)[(class_type, name)]
    return [n.lower() for n in (name, spec_options(spec).get("display_name")) if n]


def pack_exception(exception_type: str) -> str | None:
    """'<pack module>.lantern_core.errors.ConfigError' -> 'ConfigError'; None for anything else."""
    return next((n for n in PACK_ERRORS if exception_type.endswith(f".lantern_core.errors.{n}")), None)


def judge(outcome: Outcome, prompt: dict, class_type: str, names: list[str], may_succeed: bool,
          host_may_raise: bool = False) -> tuple[str, str]:
    """-> (kind, problem); problem is "" when the outcome is one the contract allows."""
    if outcome.status == "success":
        return "success", "" if may_succeed else "ran successfully; expected a validation or pack error"
    if outcome.status == "timeout":
        return "timeout", f"no end within the time limit: {outcome.body}"
    here = node_id(prompt, class_type)
    if outcome.status == "rejected":
        node_errors = outcome.body.get("node_errors") or {}
        errors = (node_errors.get(here) or {}).get("errors", [])
        if not errors:
            return f"validation:{outcome.body.get('error', {}).get('type')}", \
                f"400 without node_errors for node {here} ({class_type}): {json.dumps(outcome.body)[:600]}"
        for e in errors:
            info = e.get("extra_info") or {}
            if e["type"] in HOST_VALIDATION_EXCEPTIONS:
                trace = "".join(info.get("traceback", []))
                kind = f"validation:{e['type']}:{info.get('exception_type')}"
                if "custom_nodes/lantern/" in trace or str(REPO) + "/nodes" in trace or "lantern_core" in trace:
                    return kind, f"our code raised during validation: {e['details'][:300]}"
                if not host_may_raise:
                    return kind, f"raised during validation: {e['details'][:300]}"
                return f"{kind} (host)", ""
            if info.get("input_name") in names or any(n in str(e.get("details", "")).lower() for n in names):
                return f"validation:{e['type']}", ""
        return f"validation:{errors[0]['type']}", f"node_errors do not name the input {names}: {errors}"[:800]
    error = outcome.body
    exception_type = error.get("exception_type", "")
    kind = f"execution:{pack_exception(exception_type) or exception_type or 'interrupted'}"
    if pack_exception(exception_type) is None:
        return kind, f"{exception_type}: {error.get('exception_message', '')[:300]}"
    if error.get("node_id") != here:
        return kind, f"raised by node {error.get('node_id')} ({error.get('node_type')}), not {here} ({class_type})"
    message = error.get("exception_message", "").lower()
    if not any(n in message for n in names):
        return kind, f"the message does not name {names}: {error.get('exception_message', '')[:300]}"
    return kind, ""


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture(scope="module")
def object_info(server):
    return server.get("/object_info", timeout=60)


@pytest.fixture(scope="module")
def graphs(object_info):
    return build_graphs(object_info)


def sources_in(graph: dict) -> dict:
    """A node of each wire type in the graph, as a link: for wrong-type links."""
    by_type = {"LanternModelLoader": "LANTERN_MODEL", "LanternDecodingConfig": "LANTERN_DECODING"}
    return {wire: [k, 0] for k, v in graph.items() for cls, wire in by_type.items() if v["class_type"] == cls}


def all_cases(object_info: dict, graphs: dict) -> list[tuple[str, dict, Case]]:
    """(graph, context settings, case) for every input of every Lantern* node."""
    out = []
    for (class_type, name), (spec, required) in all_inputs(object_info).items():
        if class_type not in CONTEXT:
            raise AssertionError(f"node {class_type} has no graph to test it in: add it to CONTEXT")
        graph, extra = CONFIG_CONTEXT.get(name, CONTEXT[class_type]) if class_type == "LanternDecodingConfig" \
            else CONTEXT[class_type]
        for case in beyond_cases(class_type, name, spec, required, sources_in(graphs[graph])):
            out.append((graph, extra, case))
    return out


def test_every_input_of_every_lantern_node_has_cases(object_info, graphs):
    inputs = all_inputs(object_info)
    assert {c for c, _ in inputs} == {"LanternModelLoader", "LanternDrafterLoader", "LanternConditioning",
                                      "LanternDecodingConfig", "LanternSampler", "LanternDecode", "LanternGenerate"}
    cases = all_cases(object_info, graphs)
    per_input = Counter((case.node, case.input) for _, _, case in cases)
    assert set(per_input) == set(inputs) and min(per_input.values()) >= 8, per_input
    covered = limit_coverage(object_info)
    missing = []
    for (class_type, name), (spec, _) in inputs.items():
        kind, opts = widget_kind(spec), spec_options(spec)
        wanted = [opts["min"], opts["max"]] if kind in ("INT", "FLOAT") else \
            combo_options(spec) if kind == "COMBO" else []
        missing += [(class_type, name, v) for v in wanted if (class_type, name, json.dumps(v)) not in covered]
    assert not missing, f"inputs with a limit or option that no at-limit run covers: {missing}"


# Chunks of each case list (cases[i::k]): independent tests, so that pytest-xdist's workers share them (each
# worker has its own server); every chunk ends by checking that its server survived and runs a normal prompt.
BEYOND_CHUNKS = 2
LIMIT_CHUNKS = 4


def chunk_of(items: list, chunk: int, chunks: int) -> list:
    return items[chunk::chunks]


def check_server_survives(server, graphs, seed: int) -> None:
    """The server process and its prompt worker are alive and a normal run (a seed of its own: never served
    from ComfyUI's cache) succeeds."""
    assert server.process.poll() is None, server.log_tail()
    log = server.log_path.read_text(errors="replace")
    assert "Exception in thread" not in log, "a server thread died (the prompt worker?):\n" + server.log_tail(80)
    assert server.get("/system_stats")["system"]
    result = run_prompt(server.url, make_prompt(graphs, "base", {"LanternSampler": {"seed": seed}}))
    assert result.status == "success", result.messages[-3:]


def add_seconds(group: str, seconds: float) -> None:
    FIGURES["seconds"][group] = round(FIGURES["seconds"].get(group, 0.0) + seconds, 1)


def test_every_case_is_in_exactly_one_chunk(object_info, graphs):
    cases = all_cases(object_info, graphs)
    chunked = [c for i in range(BEYOND_CHUNKS) for c in chunk_of(cases, i, BEYOND_CHUNKS)]
    assert len(chunked) == len(cases) and all(any(c is d for d in chunked) for c in cases)
    runs = limit_runs(object_info)
    chunked = [r for i in range(LIMIT_CHUNKS) for r in chunk_of(runs, i, LIMIT_CHUNKS)]
    assert sorted(map(repr, chunked)) == sorted(map(repr, runs)) and all(
        chunk_of(runs, i, LIMIT_CHUNKS) for i in range(LIMIT_CHUNKS))


@pytest.mark.parametrize("chunk", range(BEYOND_CHUNKS))
def test_beyond_limits_are_validation_errors_or_pack_errors(server, object_info, graphs, chunk):
    start = time.perf_counter()
    problems = []
    for graph, extra, case in chunk_of(all_cases(object_info, graphs), chunk, BEYOND_CHUNKS):
        prompt = make_prompt(graphs, graph, {case.node: {**extra, case.input: case.value}})
        outcome = submit(server, prompt)
        kind, problem = judge(outcome, prompt, case.node, names_of(object_info, case.node, case.input),
                              case.may_succeed, host_may_raise=case.label in HOST_RAISES_ON)
        label = f"{case.node}.{case.input} <- {case.label}"
        record("beyond limits", label, outcome, kind)
        if problem:
            problems.append(f"{label}: {problem}")
    add_seconds("beyond limits", time.perf_counter() - start)
    assert not problems, f"{len(problems)} hostile values were not refused cleanly:\n" + "\n".join(problems)
    check_server_survives(server, graphs, seed=424200 + chunk)


@pytest.mark.parametrize("chunk", range(LIMIT_CHUNKS))
def test_at_the_limits_runs_succeed_or_give_pack_errors(server, object_info, graphs, chunk):
    start = time.perf_counter()
    problems = []
    for graph, settings in chunk_of(limit_runs(object_info), chunk, LIMIT_CHUNKS):
        prompt = make_prompt(graphs, graph, settings)
        outcome = submit(server, prompt)
        label = f"{graph}: " + "; ".join(f"{c} {s}" for c, s in settings.items())
        class_type = next(iter(settings))  # an error must come from the node set at its limits
        names = [n for c, inputs in settings.items() for name in inputs for n in names_of(object_info, c, name)]
        kind, problem = judge(outcome, prompt, class_type, names, may_succeed=True)
        record("at limits", label, outcome, kind)
        print(f"  {outcome.seconds:6.2f} s  {kind:40s} {label[:150]}")  # pytest -s: what each run costs
        if problem:
            problems.append(f"{label}: {problem}")
    add_seconds("at limits", time.perf_counter() - start)
    assert not problems, "\n".join(problems)
    check_server_survives(server, graphs, seed=424300 + chunk)


def test_the_server_survives_and_a_normal_run_succeeds(server, graphs):
    """Also checked at the end of every chunk above (on the worker's own server); here once more after
    whatever ran before on this server, with the session's figures printed (complete in one process)."""
    check_server_survives(server, graphs, seed=424242)
    print_summary()
