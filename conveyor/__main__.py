"""`python -m conveyor`: the `conveyor` command, for environments without the console script on PATH."""

import sys

from conveyor.launcher.cli import main

sys.exit(main())
