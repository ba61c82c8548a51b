"""``python -m torchnext`` runs the ``torchnext`` command."""

import sys

from torchnext.cli import main

sys.exit(main())
