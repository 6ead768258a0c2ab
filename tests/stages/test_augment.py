import numpy as np
import torch

from stages import augment


def test_views_depend_only_on_seed_epoch_index():
    imgs = torch.randint(0, 255, (6, 3, 20, 20), dtype=torch.uint8)
    recipes = augment.recipes_for("byol", 96)
    a = augment.TwoViewDataset(imgs, recipes, 16, seed=1, epoch=2)
    b = augment.TwoViewDataset(imgs, recipes, 16, seed=1, epoch=2)
    c = augment.TwoViewDataset(imgs, recipes, 16, seed=1, epoch=3)
    for i in range(6):
        assert all(torch.equal(x, y) for x, y in zip(a[i], b[i]))
    assert not torch.equal(a[0][0], c[0][0])
    v1, v2 = a[0]
    assert v1.shape == (3, 16, 16) and v1.dtype == torch.uint8 and not torch.equal(v1, v2)


def test_crop_params_are_valid():
    g = torch.Generator().manual_seed(0)
    p = augment.sample_params(500, augment.ViewRecipe(), 40, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
    top, left, h, w = p["crop"].T
    assert (h >= 1).all() and (w >= 1).all() and (top + h <= 40).all() and (left + w <= 40).all()
    area = (h * w).float() / 1600
    assert area.min() >= 0.07 and area.max() <= 1.0
    assert 0.4 < p["flip"].float().mean() < 0.6
    assert sorted(p["jitter_order"][0].tolist()) == [0, 1, 2, 3]


def test_identity_params_give_the_image_back():
    img = torch.randint(0, 255, (3, 16, 16), dtype=torch.uint8)
    recipe = augment.ViewRecipe(crop_scale=(1, 1), crop_ratio=(1, 1), flip_p=0, jitter_p=0, gray_p=0)
    p = augment.sample_params(1, recipe, 16, np.random.default_rng(0))
    out = augment.apply_view(img, p, 0, 16)
    torch.testing.assert_close(out, img.float() / 255)


def test_epoch_batches_cover_once_and_drop_last():
    batches = augment.epoch_batches(10, 3, seed=0, epoch=0)
    flat = [i for b in batches for i in b]
    assert len(batches) == 3 and len(set(flat)) == 9
    assert augment.epoch_batches(10, 3, 0, 1) != batches


def test_blur_is_off_for_small_images_only():
    assert augment.recipes_for("simclr", 32)[0].blur_p == 0.0
    assert augment.recipes_for("simclr", 96)[0].blur_p == 0.5
    assert augment.blur_kernel_size(224) == 23
