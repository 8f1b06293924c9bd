"""``python -m tinyformer.cli``: the ``tinyformer`` command."""

import sys

from . import main

sys.exit(main())
