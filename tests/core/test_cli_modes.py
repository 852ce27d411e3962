"""The command line at parity with the nodes: every decoding mode, drafters, trees, relaxation and the Jacobi
settings, the prompted families from their folders, the node's stats with --json, and the same refusals
with the same messages (both call `decoding/modes.py`). Most runs call `cli.main` in this process (the same
parser, loading, decoding and --json report as `python -m lantern_core`, without a Python and torch start-up per
run); one run per test that has a subprocess goes through `python -m lantern_core` itself (the entry point, its
exit code and stdout)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lantern_core import cli
from lantern_core.decoding import auto_store

ROOT = Path(__file__).resolve().parents[2]
NODE_STATS = {"mode", "batch", "image_tokens", "forward_passes", "tokens_per_s", "mean_accepted_length", "heatmap",
              "heatmap_image", "speculative", "conditions", "steps"}
SPECULATIVE_STATS = {"tree", "drafter", "acceptance_by_depth", "accepted_histogram", "relaxed_tokens",
                     "mean_tvd_spent", "max_tvd_spent", "batch_forwards", "accepted_length_per_image",
                     "drafter_prefix_states"}
FAST = ["--tree", "mc_sim_7b_63", "--eagle-depth", "4", "--eagle-top-k", "4", "--eagle-nodes", "12", "--window", "8",
        "--k", "8"]


def run_cli(tmp_path: Path, *args: str, out: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))  # the auto store and neighbour tables
    return subprocess.run([sys.executable, "-m", "lantern_core", "generate", "--seed", "5", "--out",
                           str(tmp_path / out), "--json", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture
def cli_here(tmp_path, monkeypatch, capsys):
    """`run_cli` in this process: `cli.main` with the same arguments; its exit code, stdout and stderr."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def run(tmp: Path, *args: str, out: str) -> subprocess.CompletedProcess:
        argv = ["generate", "--seed", "5", "--out", str(tmp / out), "--json", *args]
        code = cli.main(argv)
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(argv, code, captured.out, captured.err)
    yield run
    auto_store.use_store(None)


def test_every_mode_from_the_command_line(tmp_path, cli_here):
    """Greedy exact modes give AR's image byte for byte; relaxed modes run and report the node's stats. AR and
    every run but the last through `cli.main` here (the images compared are made in one process); the last one
    (proactive coupled SJD) through `python -m lantern_core`."""
    ar = cli_here(tmp_path, "--cls", "cat", "--temperature", "0", out="ar")
    assert ar.returncode == 0, ar.stderr
    reference = (tmp_path / "ar" / "lantern_00005.png").read_bytes()
    for mode in ("eagle2", "static_tree", "sjd", "sjd_coupled"):
        done = cli_here(tmp_path, "--cls", "cat", "--temperature", "0", "--decoding", mode, *FAST, out=mode)
        assert done.returncode == 0, (mode, done.stderr[-2000:])
        assert (tmp_path / mode / "lantern_00005.png").read_bytes() == reference, mode
        stats = json.loads(done.stdout)["stats"]
        assert NODE_STATS | SPECULATIVE_STATS <= set(stats) and stats["mode"] == mode
        assert stats["forward_passes"] < 256
        assert stats["drafter"] == ("none (training-free)" if mode.startswith("sjd") else "drafter (embedded)")
        assert stats["drafter_prefix_states"] == ("" if mode.startswith("sjd") else "native")
    for mode, extra in (("lantern", ["--delta", "0.3"]), ("lantern_pp", ["--lambda", "4"]),
                        ("sjd_relaxed", ["--sjd-relaxation", "gsd", "--gsd-gap", "0.2", "--init", "repeat_above"])):
        done = cli_here(tmp_path, "--cls", "cat", "--cls", "rocket", "--decoding", mode, *FAST, *extra, out=mode)
        assert done.returncode == 0, (mode, done.stderr[-2000:])
        stats = json.loads(done.stdout)["stats"]
        assert stats["batch"] == 2 and len(stats["accepted_length_per_image"]) == 2 and stats["relaxed_tokens"] > 0
        assert stats["conditions"] == ["cat", "rocket"]
    gsd = json.loads(done.stdout)["stats"]
    assert "gsd group k8 gap 0.2" in gsd["tree"] and "repeat-above init" in gsd["tree"]
    done = cli_here(tmp_path, "--cls", "cat", "--decoding", "sjd_2d_relaxed", "--rows", "4", "--row-window", "3",
                    "--row-lead", "1", *FAST, out="rows")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)["stats"]
    assert "relaxed 2-D (lossy): 4 rows x w3 lead 1" in rows["tree"] and len(rows["row_commits"]) == 3
    assert 0 < rows["row_committed_share"] < 1 and "committed by lower rows" in done.stderr + done.stdout
    done = run_cli(tmp_path, "--cls", "cat", "--decoding", "sjd_coupled", "--proactive", "4", *FAST, out="proactive")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "proactive 4 x depth 3" in json.loads(done.stdout)["stats"]["tree"]


@pytest.fixture
def in_process_cli(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    yield lambda *args: cli.main(["generate", "--out", str(tmp_path / "out"), *args])
    auto_store.use_store(None)


@pytest.mark.parametrize("args,fragment", [
    (["--decoding", "lantern_pp", "--tree", "custom", "--custom-tree", "[[0], [0, 0"], "custom_tree"),
    (["--decoding", "lantern_pp", "--tree", "custom", "--custom-tree", "[[0, 0]]"], "parent"),
    (["--decoding", "lantern", "--k", "5000"], "lantern_k"),
    (["--decoding", "sjd", "--init", "sideways"], "jacobi_init"),
    (["--decoding", "sjd_relaxed", "--sjd-relaxation", "loose"], "sjd_relaxation"),
    (["--decoding", "sjd_relaxed", "--sjd-relaxation", "gsd", "--gsd-gap", "2.0"], "group gap"),
    (["--decoding", "static_tree", "--tree", "wide"], "tree"),
    (["--decoding", "turbo"], "decoding"),
])
def test_the_command_line_refuses_what_the_node_refuses(in_process_cli, capsys, args, fragment):
    assert in_process_cli(*args) == 2
    err = capsys.readouterr().err
    assert fragment in err and "expected" in err and "Traceback" not in err


def test_a_drafter_mode_without_a_drafter_says_how_to_give_one(in_process_cli, capsys, tmp_path):
    from lantern_core.loading.embedded import EMBEDDED_GPT, EMBEDDED_VQ

    gpt = tmp_path / "gpt.safetensors"
    gpt.write_bytes(EMBEDDED_GPT.read_bytes())  # the same weights, not the embedded path: no default drafter
    assert in_process_cli("--gpt", str(gpt), "--vq", str(EMBEDDED_VQ), "--decoding", "eagle2") == 2
    assert "--drafter" in capsys.readouterr().err


def test_prompted_families_from_their_folders(tmp_path, cli_here):
    """Both families' AR and coupled SJD through `cli.main` here (the same images, byte for byte); a folder
    without --prompt through `python -m lantern_core` (its exit code 2 and message)."""
    from tests.tiny_families import save_chameleon_folder, save_chameleon_vqgan, save_janus_folder

    anole, janus = tmp_path / "anole", tmp_path / "janus"
    save_chameleon_folder(anole, seed=5)
    save_chameleon_vqgan(anole / "vqgan.ckpt")
    save_janus_folder(janus, seed=6, grid=4)
    prompts = ["--prompt", "a red cat", "--prompt", "a photo of the blue sky"]
    for name, folder, extra in (("anole", anole, ["--grid-size", "4"]), ("janus", janus, [])):
        ar = cli_here(tmp_path, "--model", str(folder), *prompts, *extra, "--temperature", "0", out=f"{name}_ar")
        sjd = cli_here(tmp_path, "--model", str(folder), *prompts, *extra, "--temperature", "0", "--decoding",
                       "sjd_coupled", "--window", "4", out=f"{name}_sjd")
        assert ar.returncode == 0 and sjd.returncode == 0, (name, ar.stderr[-2000:], sjd.stderr[-2000:])
        for i in (5, 6):
            assert (tmp_path / f"{name}_sjd" / f"lantern_{i:05d}.png").read_bytes() == \
                (tmp_path / f"{name}_ar" / f"lantern_{i:05d}.png").read_bytes(), name
        stats = json.loads(sjd.stdout)["stats"]
        assert stats["conditions"] == ["a red cat", "a photo of the blue sky"] and stats["mode"] == "sjd_coupled"
    missing = run_cli(tmp_path, "--model", str(janus), out="none")
    assert missing.returncode == 2 and "--prompt" in missing.stderr


def test_lumina_at_another_size_from_the_command_line(tmp_path, cli_here):
    """--size 96x64 on a Lumina-mGPT folder: an image 6 codes wide and 4 high (the tiny VQGAN's pixels per code);
    the same size on an Anole folder, or --size with a LlamaGen file, is a usage error naming --size (all
    through `cli.main` here)."""
    from PIL import Image

    from tests.tiny_families import save_chameleon_folder, save_chameleon_vqgan

    lumina, anole = tmp_path / "lumina", tmp_path / "anole"
    save_chameleon_folder(lumina, seed=7, lumina=True)
    save_chameleon_vqgan(lumina / "vqgan.ckpt")
    save_chameleon_folder(anole, seed=8)
    save_chameleon_vqgan(anole / "vqgan.ckpt")
    done = cli_here(tmp_path, "--model", str(lumina), "--prompt", "a red cat", "--size", "96x64", "--decoding",
                    "sjd_coupled", "--window", "4", out="wide")
    assert done.returncode == 0, done.stderr[-2000:]
    stats = json.loads(done.stdout)["stats"]
    assert stats["image_tokens"] == 4 * 7 and len(stats["heatmap"]) == 4
    width, height = Image.open(tmp_path / "wide" / "lantern_00005.png").size
    assert width * 4 == height * 6 and width > 0
    refused = cli_here(tmp_path, "--model", str(anole), "--prompt", "a cat", "--size", "96x64", out="anole")
    assert refused.returncode == 2 and "image_size" in refused.stderr and "Lumina-mGPT" in refused.stderr
    llamagen = cli_here(tmp_path, "--cls", "cat", "--size", "96x64", out="llamagen")
    assert llamagen.returncode == 2 and "--size" in llamagen.stderr
