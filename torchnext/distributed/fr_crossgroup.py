"""Old path of :mod:`torchnext.distributed.flight_recorder.crossgroup`, kept so existing imports work.

This name is the new module itself (``sys.modules`` maps both paths to one object), so
its attributes, private ones and monkeypatching included, behave as before. New code
imports :mod:`torchnext.distributed.flight_recorder.crossgroup`.
"""

import sys

from torchnext.distributed.flight_recorder import crossgroup as moved
from torchnext.distributed.flight_recorder.crossgroup import *  # noqa: F403 - the same public names, for type checkers

sys.modules[__name__] = moved
