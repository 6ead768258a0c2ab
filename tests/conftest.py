import os

import pytest
import torch

# Tests run two at a time (pytest -n 2) on 2 cores: one thread each keeps them from fighting.
torch.set_num_threads(1)
os.environ.setdefault("TQDM_DISABLE", "1")


# A pretraining config that runs a step in well under a second on one CPU core (benchmarks/pin_divergence.py
# measures the pinned losses of this same run).
TINY = dict(data="synthetic:48", backbone="resnet18", image_size=16, batch_size=8, epochs=2,
            proj_hidden_dim=32, proj_dim=16, pred_hidden_dim=32, device="cpu", num_workers=0,
            warmup_epochs=0.5, log_every=1, seed=0)


@pytest.fixture
def tiny_overrides():
    return dict(TINY)
