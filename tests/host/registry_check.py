"""What the Comfy Registry would see of this pack: pack it as `comfy node pack` does (tracked files minus
`.comfyignore`, plus `[tool.comfy] includes`), run `comfy node validate` on the unpacked archive, parse its
pyproject with comfy-cli's own parser, and scan the shipped files for what the registry's standards forbid
(exec/eval, run-time installs, process spawning, network clients, obfuscation, unsafe unpickling).

Runs with the interpreter `make registry-check` sets up (`.host/registry`, from requirements-registry.txt:
comfy-cli and ruff), offline. Exit 1 when anything is wrong; `--allow-placeholders` lets the one expected
pre-publication problem (an `example.invalid` address in `[project.urls]`) pass, which `make test` uses.
Does not publish, upload or contact anything.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLACEHOLDER = "example.invalid"
# What a user's ComfyUI needs from the archive; and what stays out of it.
MUST_SHIP = ("__init__.py", "pyproject.toml", "README.md", "LICENSE", "requirements.txt", "nodes/__init__.py",
             "web/js/lantern_decoding_widgets.js", "example_workflows/lantern_embedded_model.json",
             "lantern_core/assets/default/gpt.safetensors")
MUST_NOT_SHIP = ("tests/", "bench/", ".ci/", "Makefile", "requirements-dev.txt", "requirements-host.txt")
FORBIDDEN = (  # (files, pattern, why): the registry's standards and what its scanner is reported to flag
    (".py .js", r"(?<![\w.])(eval|exec)\s*\(", "runs code from a string"),
    (".js", r"\bnew\s+Function\s*\(", "runs code from a string"),
    (".py", r"\b__import__\s*\(", "imports by computed name"),
    (".py", r"\bsubprocess\b|\bos\.(system|popen|exec\w*|spawn\w*)\s*\(", "starts processes"),
    (".py", r"\bpip\b[^\n]*\binstall\b|\bensurepip\b", "installs packages at run time"),
    (".py", r"\b(import|from)\s+(urllib|requests|httpx|http\.client|socket)\b|\bClientSession\b", "opens network "
                                                                                             "connections"),
    (".py .js", r"\b(base64|b64decode|atob|marshal)\b", "decodes hidden payloads"),
    (".py", r"\bpickle\.loads?\s*\(|\bdill\b|\bcloudpickle\b", "unpickles arbitrary objects"),
)
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,98}")  # the registry's node id rule (no leading digit or sign)
OS_VALUES = ("Microsoft", "POSIX", "MacOS", "OS Independent")


@dataclass
class Problem:
    where: str
    what: str
    placeholder: bool = False


@dataclass
class Report:
    shipped: list[str] = field(default_factory=list)
    validate_output: str = ""
    parser_output: str = ""
    problems: list[Problem] = field(default_factory=list)

    def blocking(self, allow_placeholders: bool) -> list[Problem]:
        return [p for p in self.problems if not (allow_placeholders and p.placeholder)]


def source_files(source: Path) -> list[str]:
    """The files git would commit in `source` (tracked or new, not ignored), as they are on disk."""
    out = subprocess.run(["git", "-C", str(source), "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
                         check=True, capture_output=True).stdout.decode()
    return sorted(p for p in out.split("\0") if p and (source / p).is_file())


def comfy(args: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([str(BIN / "comfy"), "--skip-prompt", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300, stdin=subprocess.DEVNULL)


def pack(source: Path, work: Path) -> Path:
    """The archive `comfy node pack` makes from a commit of `source`'s files, unpacked under work/package."""
    repo, home = work / "repo", work / "home"
    home.mkdir(parents=True)
    for rel in source_files(source):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / rel, repo / rel)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    done = comfy(["node", "pack"], repo, home)
    if done.returncode != 0 or not (repo / "node.zip").is_file():
        raise RuntimeError(f"`comfy node pack` failed ({done.returncode}): {done.stdout}{done.stderr}")
    package = work / "package"
    with zipfile.ZipFile(repo / "node.zip") as archive:
        archive.extractall(package)
    return package


def check_config(package: Path) -> list[Problem]:
    """pyproject.toml as comfy-cli parses it, against the registry's specification."""
    from comfy_cli.registry.config_parser import extract_node_configuration

    config = extract_node_configuration(str(package / "pyproject.toml"))
    if config is None:
        return [Problem("pyproject.toml", "comfy-cli could not parse it")]
    project, comfy_cfg, problems = config.project, config.tool_comfy, []
    where = "pyproject.toml"
    if not NAME.fullmatch(project.name):
        problems.append(Problem(where, f"[project] name {project.name!r} breaks the registry's name rule"))
    if not re.fullmatch(r"\d+\.\d+\.\d+", project.version):
        problems.append(Problem(where, f"[project] version {project.version!r} is not X.Y.Z"))
    if not 0 < len(project.description) <= 1000:
        problems.append(Problem(where, "[project] description must hold 1-1000 characters"))
    if not project.license.file or not (package / project.license.file).is_file():
        problems.append(Problem(where, f"license file {project.license.file!r} is not in the archive"))
    if not project.supported_os or not all(v.split(" :: ")[0] in OS_VALUES for v in project.supported_os):
        problems.append(Problem(where, f"Operating System classifiers missing or dropped: {project.supported_os}"))
    if not project.supported_accelerators:
        problems.append(Problem(where, "no Environment (accelerator) classifier comfy-cli accepts"))
    if not re.fullmatch(r"[<>=!~]=?\d+\.\d+\.\d+.*", project.supported_comfyui_version or ""):
        problems.append(Problem(where, f"requires-comfyui {project.supported_comfyui_version!r} was dropped"))
    if not comfy_cfg.publisher_id or not comfy_cfg.display_name:
        problems.append(Problem(where, "[tool.comfy] needs PublisherId and DisplayName"))
    if "Icon" in (package / "pyproject.toml").read_text() and not comfy_cfg.icon.startswith("https://"):
        problems.append(Problem(where, f"[tool.comfy] Icon {comfy_cfg.icon!r} is not an https address: "
                                       "give the square icon's URL or remove the key"))
    for key, url in (("Repository", project.urls.repository), ("Homepage", project.urls.homepage),
                     ("Documentation", project.urls.documentation), ("BugTracker", project.urls.issues)):
        if key == "Repository" and not url:
            problems.append(Problem(where, "[project.urls] Repository is required"))
        elif url and PLACEHOLDER in url:
            problems.append(Problem(where, f"[project.urls] {key} is the placeholder {url}: fill in the real "
                                           "address before publishing", placeholder=True))
        elif url and not url.startswith("https://"):
            problems.append(Problem(where, f"[project.urls] {key} {url!r} is not an https address"))
    return problems


def check_files(package: Path, shipped: list[str]) -> list[Problem]:
    problems = [Problem(rel, "missing from the archive: ComfyUI needs it") for rel in MUST_SHIP if rel not in shipped]
    problems += [Problem(rel, "ships, but is for development only: list it in .comfyignore") for rel in shipped
                 if any(rel == p or rel.startswith(p) for p in MUST_NOT_SHIP)]
    for rel in shipped:
        suffix = Path(rel).suffix
        if suffix not in (".py", ".js"):
            continue
        text = (package / rel).read_text(encoding="utf-8", errors="replace")
        for kinds, pattern, why in FORBIDDEN:
            if suffix not in kinds.split():
                continue
            for match in re.finditer(pattern, text):
                problems.append(Problem(f"{rel}:{line_of(text, match.start())}", f"{match.group(0)!r} {why}"))
        for match in re.finditer(r"\btorch\.load\s*\(", text):
            if not re.search(r"weights_only\s*=\s*True", call_arguments(text, match.end())):
                problems.append(Problem(f"{rel}:{line_of(text, match.start())}",
                                        "torch.load without weights_only=True unpickles arbitrary objects"))
    return problems


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def call_arguments(text: str, start: int) -> str:
    """The argument text of the call whose opening parenthesis ends at `start` (balanced parentheses)."""
    depth = 1
    for end in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        if depth == 0:
            return text[start:end]
    return text[start:]


def check(source: Path, work: Path) -> Report:
    package = pack(source, work)
    shipped = sorted(p.relative_to(package).as_posix() for p in package.rglob("*") if p.is_file())
    report = Report(shipped=shipped)
    done = comfy(["node", "validate"], package, work / "home")
    report.validate_output = done.stdout + done.stderr
    if done.returncode != 0 or "All validation checks passed" not in report.validate_output:
        report.problems.append(Problem("comfy node validate", f"failed ({done.returncode}): {report.validate_output}"))
    previous, said = Path.cwd(), io.StringIO()
    os.chdir(package)  # comfy-cli's parser reports relative to the working directory
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):  # its warnings, kept
            report.problems += check_config(package)
    finally:
        os.chdir(previous)
    report.parser_output = said.getvalue()
    report.problems += check_files(package, shipped)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", type=Path, default=ROOT, help="the pack's git checkout (default: this one)")
    parser.add_argument("--allow-placeholders", action="store_true",
                        help="pass while [project.urls] still holds example.invalid addresses (before publication)")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="lantern-registry-") as tmp:
        report = check(args.source.resolve(), Path(tmp))
    blocking = report.blocking(args.allow_placeholders)
    if args.json:
        print(json.dumps(asdict(report), indent=1))
    else:
        print(f"{len(report.shipped)} files would ship; comfy node validate: "
              f"{report.validate_output.strip().splitlines()[-1] if report.validate_output.strip() else '?'}")
        for problem in report.problems:
            print(f"{'placeholder' if problem.placeholder else 'problem'}: {problem.where}: {problem.what}")
        print("registry check: " + ("passed" if not blocking else f"{len(blocking)} problem(s)"))
    return 1 if blocking else 0


if __name__ == "__main__":
    sys.exit(main())
