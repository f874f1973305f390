"""Moved to reshard.launcher._launch_env; this old path is the same module, kept for one
release (docs/python.md, "Package layout")."""
import importlib
import runpy
import sys

if __name__ == "__main__":  # python -m reshard.<old path>
    runpy.run_module("reshard.launcher._launch_env", run_name="__main__", alter_sys=True)
else:
    sys.modules[__name__] = importlib.import_module("reshard.launcher._launch_env")
