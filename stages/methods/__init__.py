"""SSL methods, one file each. A method is an nn.Module holding `backbone` plus its own heads/momentum networks,
with `forward(x1, x2, precision) -> loss` and `after_step(progress)` for momentum updates. The registry is a dict."""

from stages.methods.byol import BYOL
from stages.methods.mocov3 import MoCoV3
from stages.methods.simclr import SimCLR

METHODS = {"simclr": SimCLR, "byol": BYOL, "mocov3": MoCoV3}
