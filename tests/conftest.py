import os
import shutil
import tempfile

import pytest
import torch

from tests.tiny_run import TINY

# Tests run two at a time (pytest -n 2) on 2 cores: one thread each keeps them from fighting, in this process and in
# every command a test starts (they inherit os.environ). OpenMP threads spin at each barrier: a pretrain subprocess
# with two of them, beside the other worker on two cores, ran 4-5 times slower than with one.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")


@pytest.fixture
def tiny_overrides():
    return dict(TINY)


# The suite's tmp folders peak at ~1.2 GB (checkpoints of 128 MB, exports; measured with -n 2, each passed test's
# folder removed as it ends: pyproject's tmp_path_retention_policy). Below this much free space, tests would fail
# one by one deep inside torch.save ("unexpected pos"); one clear line up front says what is wrong instead.
NEEDS_FREE_GB = 1.5


def pytest_sessionstart(session):
    tmp = tempfile.gettempdir()
    free = shutil.disk_usage(tmp).free / 1e9
    if free < NEEDS_FREE_GB:
        pytest.exit(f"the tests need {NEEDS_FREE_GB} GB free in {tmp}; only {free:.1f} GB is: free some space or point "
                    "TMPDIR at a disk that has it", returncode=2)
