"""The faces: the Click CLI (`pipeline`) and the job service (`pipeline serve`). They stand on every floor below."""
