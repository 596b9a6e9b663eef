"""``python -m ckptgw.gateway.cli``: the command line (the daemon a mount starts runs it so)."""

import sys

from ckptgw.gateway.cli.main import main

sys.exit(main())
