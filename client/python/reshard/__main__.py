"""`python -m reshard run ...`: the launcher (reshard.launch)."""

import sys

from reshard.launch import main

if __name__ == "__main__":
    sys.exit(main())
