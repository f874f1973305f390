"""`python -m reshard run ...` (the launcher, reshard.launch) and `python -m
reshard dcp import|export ...` (reshard.dcp)."""

import sys

from reshard.launcher.launch import main

if __name__ == "__main__":
    sys.exit(main())
