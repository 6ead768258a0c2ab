"""The child `pipeline/serve/options.probe` starts (`python -m pipeline.serve.describe`): it prints what a job may ask
for as one JSON line. Its own module, run by name and imported by no one, because it reads the CLI's command list
and the CLI imports the server: inside options.py that would be an import loop."""

from __future__ import annotations

import json


def describe() -> dict:
    """Runs in the child: PretrainConfig's fields, the export formats, the device `auto` picks, the commands."""
    from export.formats import TO_CHOICES
    from pipeline.cli import main
    from core.config import _base_type, _fields
    from core.device import select_device
    from train.configs import PretrainConfig

    fields = []
    for name, f in _fields(PretrainConfig).items():
        tp = _base_type(f.type)
        fields.append({"name": name, "type": tp.__name__, "optional": tp is not f.type, "default": f.default,
                       "why": f.metadata.get("why", ""), "choices": list(f.metadata.get("choices") or []) or None})
    return {"fields": fields, "formats": list(TO_CHOICES), "auto_device": str(select_device("auto")).split(":")[0],
            "commands": sorted(main.commands)}


if __name__ == "__main__":
    print(json.dumps(describe()))
