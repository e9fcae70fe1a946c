"""`python -m epd_local`: see epd_local.cli."""

import sys

from epd_local.cli import main

sys.exit(main())
