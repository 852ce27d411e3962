"""lantern_core must stay host-free: no module may import ComfyUI packages."""
import ast
from pathlib import Path

CORE = Path(__file__).resolve().parents[2] / "lantern_core"
FORBIDDEN = {"comfy", "comfy_api", "comfy_execution", "comfy_extras", "folder_paths", "nodes", "server",
             "execution", "model_management"}


def imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_core_never_imports_comfyui():
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10
    offenders = {str(f.relative_to(CORE)): sorted(imported_roots(ast.parse(f.read_text())) & FORBIDDEN)
                 for f in files}
    assert {k: v for k, v in offenders.items() if v} == {}


def test_checker_catches_a_forbidden_import():
    tree = ast.parse("import os\nfrom comfy.model_management import get_torch_device\nimport folder_paths")
    assert imported_roots(tree) & FORBIDDEN == {"comfy", "folder_paths"}


def test_core_never_seeds_globally_or_prints():
    for f in sorted(CORE.rglob("*.py")):
        text = f.read_text()
        assert "torch.manual_seed(" not in text, f
        assert "np.random.seed(" not in text, f
        if f.name not in ("cli.py",):
            assert "print(" not in text, f
