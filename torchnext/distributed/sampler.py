"""Old path of :mod:`torchnext.distributed.training.sampler`, kept so existing imports work.

This name is the new module itself (``sys.modules`` maps both paths to one object), so
its attributes, private ones and monkeypatching included, behave as before. New code
imports :mod:`torchnext.distributed.training.sampler`.
"""

import sys

from torchnext.distributed.training import sampler as moved
from torchnext.distributed.training.sampler import *  # noqa: F403 - the same public names, for type checkers

sys.modules[__name__] = moved
