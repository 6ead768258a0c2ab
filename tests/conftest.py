import os

import pytest
import torch

from tests.tiny_run import TINY

# Tests run two at a time (pytest -n 2) on 2 cores: one thread each keeps them from fighting.
torch.set_num_threads(1)
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture
def tiny_overrides():
    return dict(TINY)
