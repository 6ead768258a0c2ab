"""One module per stage, plus what pretraining needs (data, augmentation, backbones, SSL methods)."""
