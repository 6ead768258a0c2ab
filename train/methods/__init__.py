"""SSL methods, one file each. A method is an nn.Module holding `backbone` plus its own heads/momentum networks,
with `forward(x1, x2, precision) -> loss` and `after_step(progress)` for momentum updates; its file ends with its
MethodSpec (train/method_spec.py). The registry is a dict of the specs."""

from train.methods import byol, mocov3, simclr

METHODS = {spec.name: spec for spec in (simclr.SPEC, byol.SPEC, mocov3.SPEC)}
