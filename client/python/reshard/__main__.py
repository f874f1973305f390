"""`python -m reshard run ...` (the launcher, reshard.launch), `python -m
reshard register ...` (a job registered from its training script's
describe(), reshard.launcher.register) and `python -m reshard dcp
import|export ...` (reshard.dcp)."""

import sys

from reshard.launcher.launch import main

if __name__ == "__main__":
    sys.exit(main())
