"""`python -m inference.bench ...`: the same as `inferdesk bench ...`."""

import sys

from inference.bench.command import main

sys.exit(main())
