"""The sweep config: its schema (`schema`), Hydra composition (`compose`), value checks before any
compute (`validate`), what the machine must hold for its runs (`machine`) and the run identity
hashed from it (`identity`). The entry points are here; nothing in the package imports torch, Ray
or scipy.
"""

from isoflop_cli.config.compose import load, to_yaml, with_values
from isoflop_cli.config.machine import check_runnable, check_writable
from isoflop_cli.config.validate import check

__all__ = ["check", "check_runnable", "check_writable", "load", "to_yaml", "with_values"]
