"""Every shell command of the README's Install, Quickstart, Commands, Bring-your-own-model and Tests
sections works as written, in a fresh copy of the repository: in order (each exits 0), then in
reverse in another fresh copy (each succeeds, or refuses in one line with exit 2, never a traceback).

What is not executed: `pip install` (checked instead: the target folder is a project and its extras
exist) and the test command itself. BENCH_QUICK=2 turns every sweep and trial into a smoke run (tiny
preset, two trials, ~1 s of measuring each, no compile), which keeps this test near a minute on a quiet
2-core box.
Blocks fenced ```sh need what a CI box lacks (GPUs, a database host, Slurm): they are shown, not run
here; tests/test_postgres.py runs the PostgreSQL path against a real server.
"""
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import NOISE_REFUSAL, ROOT

SECTIONS = ("Install", "Quickstart", "Commands", "Bring your own model", "Tests")
COPIED = ("harness", "sweeps", "examples", "pyproject.toml", "README.md", "results/README.md")


def readme_commands() -> list[str]:
    """The lines of every ```bash block in SECTIONS, in README order."""
    text = (ROOT / "README.md").read_text()
    commands = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        title, _, body = section.partition("\n")
        if title.strip() not in SECTIONS:
            continue
        for block in re.findall(r"^```bash\n(.*?)^```", body, flags=re.M | re.S):
            commands += [line.strip() for line in block.splitlines() if line.strip()]
    return commands


def runnable(command: str) -> str | None:
    """The part of a README line this test runs: pip installs are checked, the test command skipped."""
    parts = [p.strip() for p in command.split("&&")]
    kept = []
    for part in parts:
        words = shlex.split(part, comments=True)
        if words[:2] == ["pip", "install"]:
            check_pip_install(words[2:])
        elif words[:3] == ["python", "-m", "pytest"]:
            continue
        else:
            kept.append(part)
    return " && ".join(kept) or None


def check_pip_install(args: list[str]) -> None:
    targets = [a for a in args if not a.startswith("-")]
    assert targets, f"pip install without a target: {args}"
    for target in targets:
        folder, _, extras = target.partition("[")
        assert folder == "." and (ROOT / "pyproject.toml").exists(), f"README installs {target!r}; expected this repository"
        for extra in filter(None, extras.rstrip("]").split(",")):
            assert extra in declared_extras(), f"pip install {target}: pyproject.toml has no extra {extra!r}"


def declared_extras() -> set[str]:
    """The keys of [project.optional-dependencies] (tomllib is Python 3.11+; bench supports 3.10)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*=", section, flags=re.M))


def fresh_copy(dest: Path) -> Path:
    """What a clone holds (without studies, backups or caches), whatever the working tree ran before."""
    junk = shutil.ignore_patterns("__pycache__", "results", "*.bench-backup-*", "*.egg-info")
    for name in COPIED:
        src, dst = ROOT / name, dest / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=junk)
        else:
            shutil.copy(src, dst)
    if (ROOT / ".git").exists():  # a quickstart in the working tree rewrote examples: take the committed ones
        tracked = subprocess.run(["git", "-C", str(ROOT), "ls-files", "examples"], capture_output=True, text=True)
        for path in tracked.stdout.split():
            shown = subprocess.run(["git", "-C", str(ROOT), "show", f"HEAD:{path}"], capture_output=True)
            if shown.returncode == 0:
                (dest / path).write_bytes(shown.stdout)
    return dest


def environment(copy: Path) -> dict:
    """`bench` runs this interpreter on the copy's harness, installed or not."""
    bin_dir = copy / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "bench"
    shim.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -c 'from harness.cli import main; main()' \"$@\"\n")
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BENCH_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", PYTHONPATH=str(copy), BENCH_QUICK="2", COLUMNS="100")
    return env


def run(command: str, copy: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=copy, env=env, capture_output=True, text=True, timeout=600)


def test_readme_has_the_commands_it_promises():
    commands = readme_commands()
    assert "bench sweep sweeps/emberformer.yaml" in " ".join(commands)
    assert "cd examples/custom && bench sweep sweep.yaml && bench apply best" in commands
    assert any("python -m pytest" in c for c in commands)


def test_pip_install_lines_are_checked_not_trusted():
    assert runnable('pip install -e ".[test]" && python -m pytest -q') is None
    assert runnable("pip install -e . && bench doctor") == "bench doctor"
    with pytest.raises(AssertionError, match="no extra 'gpu'"):
        runnable('pip install -e ".[gpu]"')


@pytest.fixture(scope="module")
def commands():
    return [(c, runnable(c)) for c in readme_commands()]


def test_every_readme_command_in_order(commands, tmp_path):
    copy = fresh_copy(tmp_path / "clone")
    env = environment(copy)
    target = copy / "examples" / "emberformer" / "config.yaml"
    before, outputs = target.read_text(), {}
    for line, command in commands:
        if command is None:
            continue
        result = run(command, copy, env)
        # a busy machine: bench will not apply noise, and says so (also where a line sweeps, then applies)
        if result.returncode == 2 and "bench apply best" in command and NOISE_REFUSAL in result.stderr:
            outputs[command.split("#")[0].strip()] = None
            continue
        assert result.returncode == 0, f"README command `{line}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        assert "Traceback" not in result.stderr, line
        outputs[command.split("#")[0].strip()] = result.stdout
    assert (copy / "results" / "emberformer" / "report.html").stat().st_size > 0
    assert (copy / "results" / "emberformer.csv").read_text().startswith("number,")
    if outputs["bench apply best"] is None or "nothing to change" in outputs["bench apply best"]:
        assert target.read_text() == before  # refused as noise, or the baseline was best: the file is as it was
    else:
        assert "# bench apply:" in target.read_text() and "wrote" in outputs["bench apply best"]
    custom = copy / "examples" / "custom"
    assert (custom / "results" / ".gitignore").read_text().splitlines()[-1] == "*"


def test_every_readme_command_in_reverse(commands, tmp_path):
    """Run before what they need, commands refuse in one line and write nothing; the rest still work."""
    copy = fresh_copy(tmp_path / "clone")
    env = environment(copy)
    refused = []
    for line, command in reversed(commands):
        if command is None:
            continue
        result = run(command, copy, env)
        assert result.returncode in (0, 2), f"`{line}` exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        if result.returncode == 2:
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("error:"), f"`{line}`:\n{result.stderr}"
            refused.append(command.split("#")[0].strip())
    assert "bench apply best" in refused and "bench report" in refused  # nothing swept yet when they ran
    assert not any(p.name.startswith("config.yaml.bench-backup") for p in (copy / "examples" / "emberformer").iterdir())
