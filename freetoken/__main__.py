"""``python -m freetoken`` runs the command line."""

import sys

from freetoken.cli import main

sys.exit(main())
