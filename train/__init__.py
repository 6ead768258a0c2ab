"""Training and evaluating an encoder: data, augmentation, methods, backbones, the step, recipes, a run's config
(runspec), features and kNN. Stands on core/ only."""
