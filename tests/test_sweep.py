"""sweep.py, the orchestration the CLI calls, runs in the CLI's process: it never imports torch
(the runs are jobs, and every `isoflop` process would pay for it)."""

import subprocess
import sys


def test_the_sweep_and_the_cli_import_no_torch():
    code = (
        "import sys, isoflop_cli.cli, isoflop_cli.sweep, isoflop_cli.calibrate; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
