"""``python -m ckptgw``: the command line, as the ``ckptgw`` script."""

import sys

from ckptgw.gateway.cli.main import main

sys.exit(main())
