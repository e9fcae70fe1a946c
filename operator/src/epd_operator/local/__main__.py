"""`python -m epd_operator.local`: see epd_operator.local.cli."""

import sys

from epd_operator.local.cli import main

sys.exit(main())
