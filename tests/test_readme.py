"""The README's Python example runs as written (docs move with code)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_python_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks, "the README lost its Python example"
    for block in blocks:
        done = subprocess.run(
            [sys.executable, "-c", block], capture_output=True, text=True, timeout=60, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr


def test_readme_quick_start_names_real_files_and_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "aioelastic run --standalone --nproc-per-node 4 examples/store_sum.py" in text
    assert (ROOT / "examples" / "store_sum.py").is_file()
    assert "scripts/check" in text
    assert (ROOT / "scripts" / "check").is_file()
