"""The device augmentation against the CPU reference: same parameter rows -> same pixels (to interpolation and
float rounding); random draws -> the same statistics; draws a pure function of (seed, epoch, batch)."""

import dataclasses

import pytest
import numpy as np
import torch
import torchvision.transforms.v2.functional as TF

from train import augment, device_augment, training
from train.data import make_synthetic
from tests.tiny_run import pretrain_tiny


def _reference(images, p, out):
    return torch.stack([augment.apply_view(images[i], p, i, out) for i in range(images.shape[0])])


@pytest.mark.parametrize("method,src,out", [
    ("simclr", 40, 32),   # downscaled crops, no blur (<= 64 px)
    ("simclr", 96, 24),   # crops down to a quarter: filters 8 source pixels wide
    ("simclr", 100, 96),  # blur on half the views
    ("byol", 72, 96),     # upscaled crops, blur always on view 1, solarize on view 2
    ("mocov3", 64, 64),
])
def test_fixed_parameters_match_the_cpu_path(method, src, out):
    g = torch.Generator().manual_seed(src + out)
    images = torch.randint(0, 256, (12, 3, src, src), dtype=torch.uint8, generator=g)
    for recipe in augment.recipes_for(method, out):
        p = augment.sample_params(12, recipe, src, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
        torch.testing.assert_close(device_augment.apply_views(images, p, out), _reference(images, p, out),
                                   atol=2e-5, rtol=0)


def test_every_op_forced_on_matches():
    """Each op on every image (flip, jitter, grey, blur, solarize), tiny and full crops: nothing is left to chance."""
    g = torch.Generator().manual_seed(1)
    images = torch.randint(0, 256, (10, 3, 80, 80), dtype=torch.uint8, generator=g)
    for scale in ((0.01, 0.03), (1.0, 1.0)):
        recipe = augment.ViewRecipe(crop_scale=scale, flip_p=1.0, jitter_p=1.0, gray_p=1.0, blur_p=1.0, solarize_p=1.0)
        p = augment.sample_params(10, recipe, 80, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
        torch.testing.assert_close(device_augment.apply_views(images, p, 72), _reference(images, p, 72), atol=2e-5, rtol=0)


def test_all_24_jitter_orders_match():
    """Hue at each of the 4 positions, with every order of the blends around it (the device path splits each
    order at hue): one image per permutation, strong factors so a wrong order shows."""
    import itertools

    g = torch.Generator().manual_seed(4)
    images = torch.randint(0, 256, (24, 3, 20, 20), dtype=torch.uint8, generator=g)
    recipe = augment.ViewRecipe(crop_scale=(1, 1), crop_ratio=(1, 1), flip_p=0, jitter_p=1.0, gray_p=0,
                                brightness=0.6, contrast=0.9, saturation=0.9, hue=0.4)
    p = augment.sample_params(24, recipe, 20, np.random.default_rng(4))
    p["jitter_order"] = torch.tensor(list(itertools.permutations(range(4))))
    torch.testing.assert_close(device_augment.apply_views(images, p, 20), _reference(images, p, 20), atol=2e-5, rtol=0)


def test_fp16_work_dtype_stays_within_a_fraction_of_a_uint8_step():
    g = torch.Generator().manual_seed(2)
    images = torch.randint(0, 256, (8, 3, 100, 100), dtype=torch.uint8, generator=g)
    p = augment.sample_params(8, augment.recipes_for("simclr", 96)[0], 100, np.random.default_rng(int(torch.randint(1 << 31, (1,), generator=g))))
    half = device_augment.apply_views(images, p, 96, torch.float16)
    assert half.dtype == torch.float16
    assert (half.float() - device_augment.apply_views(images, p, 96)).abs().max() < 2 / 255


def test_hue_shift_matches_torchvision_including_grey_and_tied_pixels():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(6, 3, 9, 9, generator=g)
    x[0, :, :3] = 0.4  # grey
    x[1, 0], x[1, 1] = x[1, 2] + 0.3, x[1, 2] + 0.3  # red and green tie for largest
    x = x.clamp(0, 1)
    shift = torch.tensor([0.5, -0.5, 0.1, -0.2, 0.0, 0.33])
    want = torch.stack([TF.adjust_hue(x[i], float(shift[i])) for i in range(6)])
    torch.testing.assert_close(device_augment.shift_hue(x, shift), want, atol=5e-6, rtol=0)


def _stats(views: torch.Tensor) -> dict:
    """Distribution summaries of a batch of [0, 1] views: channel means/stds, mean per-image contrast, share of grey
    views, mean left-right asymmetry (flips and crops move it)."""
    per_image_std = views.flatten(1).std(1)
    grey = (views.amax(1) - views.amin(1)).flatten(1).amax(1) < 1e-3
    return {"mean": views.mean((0, 2, 3)), "std": views.std((0, 2, 3)), "contrast": per_image_std.mean(),
            "grey": grey.float().mean(), "left": (views[..., :8].mean() - views[..., -8:].mean())}


def test_random_draws_have_the_cpu_paths_statistics():
    """Different draws (per batch vs per image), same distribution: summaries over 2 x 256 views agree."""
    data = make_synthetic(256, 40, seed=0)
    recipes = augment.recipes_for("simclr", 32)
    ds = augment.ViewDataset(data.images, recipes, 32, seed=0, epoch=0)
    cpu = torch.cat([torch.stack([ds[i][v] for i in range(len(ds))]) for v in (0, 1)]).float() / 255
    p = device_augment.rows_of(device_augment.draw_params(256, recipes, 40, seed=5, epoch=0, batch=0), [0, 1], slice(0, 256))
    dev = device_augment.apply_views(torch.cat([data.images, data.images]), p, 32)  # both views, as a step makes them
    a, b = _stats(cpu), _stats(dev)
    torch.testing.assert_close(a["mean"], b["mean"], atol=0.02, rtol=0)
    torch.testing.assert_close(a["std"], b["std"], atol=0.02, rtol=0)
    assert abs(a["contrast"] - b["contrast"]) < 0.02
    assert abs(a["grey"] - b["grey"]) < 0.05 and 0.1 < b["grey"] < 0.3  # gray_p = 0.2
    assert abs(a["left"] - b["left"]) < 0.02


def test_draw_params_draws_each_view_from_its_own_recipe():
    """BYOL's asymmetric views: view 1 always blurred and never solarized, view 2 solarized at 0.2."""
    drawn = device_augment.draw_params(400, augment.recipes_for("byol", 96), 100, seed=0, epoch=0, batch=0)
    assert drawn["blur"][0].all() and not drawn["solarize"][0].any()
    assert 0.05 < drawn["blur"][1].mean() < 0.15 and 0.15 < drawn["solarize"][1].mean() < 0.25


def test_batches_are_a_pure_function_of_seed_epoch_batch_and_shards_add_up():
    images = make_synthetic(64, 20, seed=0).images
    recipes = augment.recipes_for("byol", 16)
    cpu = torch.device("cpu")

    def epoch(start=0, shard=(0, 1), seed=0):
        return list(device_augment.device_view_batches(images, recipes, 16, 16, seed, 3, start, cpu, shard))

    full = epoch()
    assert len(full) == 4 and full[0][0].shape == (16, 3, 16, 16)
    resumed = epoch(start=2)  # what a run resumed at batch 2 sees
    for (a1, a2), (b1, b2) in zip(full[2:], resumed):
        assert torch.equal(a1, b1) and torch.equal(a2, b2)
    assert not torch.equal(epoch(seed=1)[0][0], full[0][0])
    halves = [epoch(shard=(r, 2)) for r in range(2)]  # two processes: each its half of every global batch
    for b in range(4):
        for v in range(2):
            torch.testing.assert_close(torch.cat([halves[0][b][v], halves[1][b][v]]), full[b][v], atol=1e-6, rtol=0)


@pytest.mark.parametrize("path", ["cpu", "device"])
def test_local_views_come_at_their_side_and_leave_the_global_views_as_they_were(path):
    """A multi-crop method's views on either path: two at the run's size, then two local ones at half of it. Each
    arrives at its own side, in the declared order, and the global views are exactly those of the two-view method
    they extend (draws go view by view, and the views of each side are made apart); shards still add up."""
    images = make_synthetic(32, 20, seed=0).images
    two = augment.recipes_for("byol", 16)
    local = augment.ViewRecipe(crop_scale=(0.05, 0.4), size=0.5)
    four = (*two, local, dataclasses.replace(local, solarize_p=1.0))
    cpu = torch.device("cpu")

    def epoch(recipes, shard=(0, 1)):
        if path == "cpu":
            return list(augment.cpu_view_batches(images, recipes, 16, 8, 0, 1, 0, cpu, 0, shard))
        return list(device_augment.device_view_batches(images, recipes, 16, 8, 0, 1, 0, cpu, shard))

    many, pair = epoch(four), epoch(two)
    assert len(many) == len(pair) == 4
    for m, p in zip(many, pair):
        assert [tuple(v.shape) for v in m] == [(8, 3, 16, 16)] * 2 + [(8, 3, 8, 8)] * 2
        assert torch.equal(m[0], p[0]) and torch.equal(m[1], p[1])
        assert not torch.equal(m[2], m[3])
    halves = [epoch(four, (r, 2)) for r in range(2)]
    for b in range(4):
        for v in range(4):
            torch.testing.assert_close(torch.cat([halves[0][b][v], halves[1][b][v]]), many[b][v], atol=1e-6, rtol=0)


def test_mode_dispatch():
    assert training.augment_mode("auto", torch.device("cpu")) == "cpu"
    assert training.augment_mode("auto", torch.device("cuda")) == "device"
    assert training.augment_mode("cpu", torch.device("cuda")) == "cpu"


def test_pretrain_with_device_augment_resumes_exactly(tmp_path, tiny_overrides):
    base = {**tiny_overrides, "augment": "device", "epochs": 2, "data": "synthetic:40", "image_size": 8}

    def run(name, resume=False, **extra):
        return pretrain_tiny(tmp_path / name, resume, **(extra if resume else {**base, **extra}))

    run("full")
    run("part", max_steps=3)
    run("part", resume=True, max_steps=0)
    a = torch.load(tmp_path / "full/checkpoints/last.pt", weights_only=False)
    b = torch.load(tmp_path / "part/checkpoints/last.pt", weights_only=False)
    assert a["step"] == b["step"] == 8
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k


def test_ahead_yields_in_order_from_a_worker_and_the_first_here():
    import threading

    where = {}

    def produce(b):
        where[b] = threading.current_thread() is threading.main_thread()
        return b * b

    assert list(device_augment.ahead(produce, 2, 9)) == [b * b for b in range(2, 9)]
    assert where[2] and not any(where[b] for b in range(3, 9))
    assert list(device_augment.ahead(produce, 5, 5)) == []


def test_ahead_raises_the_workers_error_and_stops_when_closed_early():
    import threading
    import time

    def failing(b):
        if b == 3:
            raise ValueError("bad batch 3")
        return b

    got = []
    with pytest.raises(ValueError, match="bad batch 3"):
        for b in device_augment.ahead(failing, 0, 10):
            got.append(b)
    assert got == [0, 1, 2]

    made = []
    gen = device_augment.ahead(lambda b: made.append(b) or b, 0, 1000, depth=2)
    assert next(gen) == 0 and next(gen) == 1
    gen.close()  # joins the worker
    time.sleep(0.05)
    assert len(made) <= 5 and not any(t.name == "device-augment" for t in threading.enumerate())


@pytest.mark.parametrize("channels_last", [False, True])
def test_finish_solarizes_the_drawn_rows_then_standardises_in_the_asked_layout(channels_last):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2, 3, 5, 6, generator=g).half()
    got = device_augment.finish(x, torch.tensor([[1.0], [0.0]]), channels_last)
    mean, std = torch.tensor(augment.MEAN).view(1, 3, 1, 1), torch.tensor(augment.STD).view(1, 3, 1, 1)
    solarized = torch.cat([torch.where(x[:1] >= 0.5, 1 - x[:1], x[:1]), x[1:]])  # image 0 drew solarize
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got, (solarized.float() - mean) / std)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=layout)
    assert channels_last != got.is_contiguous()  # the other layout is not what came out


def _device_work(images, p, out, blur_rows=None) -> list[tuple]:
    """Every aten op the views of `p` run, with its tensors' shapes and dtypes, in order."""
    from torch.utils._python_dispatch import TorchDispatchMode

    ops = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            flat = torch.utils._pytree.tree_leaves((args, kwargs or {}))
            ops.append((str(func), tuple((tuple(t.shape), t.dtype) for t in flat if isinstance(t, torch.Tensor))))
            return func(*args, **(kwargs or {}))

    with Log():
        device_augment.jittered_and_blurred(images, p, out, blur_rows=blur_rows)
    return ops


def test_the_device_work_is_the_same_whatever_was_drawn():
    """Each batch runs the same kernels on the same shapes (identities where an op is not drawn): what lets one
    CUDA graph replay the views of every batch. A branch on the draws (skip the blur when no image drew it, say)
    would make a graph replay stale work."""
    images = torch.randint(0, 256, (6, 3, 40, 40), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    on = augment.ViewRecipe(crop_scale=(0.2, 1), flip_p=1.0, jitter_p=1.0, gray_p=1.0, blur_p=1.0, solarize_p=1.0)
    off = augment.ViewRecipe(crop_scale=(1, 1), flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0, solarize_p=0.0)
    drawn = [augment.sample_params(6, r, 40, np.random.default_rng(1)) for r in (on, off)]
    _device_work(images, drawn[0], 32)  # once before: a first call also builds the blur's cached reflect index
    work = [_device_work(images, p, 32) for p in drawn]
    assert work[0] == work[1] and any("bmm" in op for op, _ in work[0])
    # a recipe that never blurs skips the blur's products altogether (known before any draw)
    assert len(_device_work(images, drawn[1], 32, blur_rows=0)) < len(work[1])


@pytest.mark.parametrize("blur_rows", [0, 2, 4], ids=["no blur", "first 2 of 4 blurred", "all blurred"])
def test_views_come_out_in_the_resize_layout_and_the_blur_reads_them_without_a_copy(blur_rows):
    images = torch.randint(0, 256, (4, 3, 30, 30), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    p = augment.sample_params(4, augment.recipes_for("byol", 96)[0], 30, np.random.default_rng(0))
    x, _ = device_augment.jittered_and_blurred(images, p, 24, blur_rows=blur_rows)
    assert x.shape == (4, 3, 24, 24) and x.permute(0, 2, 1, 3).is_contiguous()
    work = _device_work(images, p, 24, blur_rows)
    ops = [op for op, _ in work]
    assert sum(op.startswith("aten.bmm") for op in ops) == (4 if blur_rows else 2)  # resize; blur where drawn
    if blur_rows:
        after = len(ops) - ops[::-1].index("aten.scatter_add_.default")  # after the blur's matrices
        blur_products = [(op, shapes) for op, shapes in work[after:] if op.startswith("aten.bmm")]
        assert all(shapes[0][0][0] == blur_rows for _, shapes in blur_products)  # only the first blur_rows images
        assert not any("clone" in op or "copy" in op for op in ops[after:])


def test_blurred_first_puts_the_images_that_drew_the_blur_first_and_back_undoes_it():
    recipe = dataclasses.replace(augment.recipes_for("simclr", 96)[0], blur_p=0.5)
    p = augment.sample_params(150, recipe, 100, np.random.default_rng(0))
    idx = torch.arange(1000, 1150)
    drew = np.asarray(p["blur"], bool)
    assert 30 < drew.sum() < 120
    idx2, p2, count, back = device_augment.blurred_first(idx, p)
    assert count == drew.sum()
    assert np.asarray(p2["blur"], bool)[:count].all() and not np.asarray(p2["blur"], bool)[count:].any()
    assert torch.equal(idx2[torch.from_numpy(back)], idx)  # back puts every row where it was
    for k in p:  # each image keeps its own parameters
        np.testing.assert_array_equal(np.asarray(p2[k])[back], np.asarray(p[k]))
    # every image blurred, or none
    assert device_augment.blurred_first(idx, {**p, "blur": np.ones(150, bool)})[2] == 150
    assert device_augment.blurred_first(idx, {**p, "blur": np.zeros(150, bool)})[2] == 0


@pytest.mark.parametrize("channels_last", [False, True])
def test_views_blurred_first_are_the_views_blurred_in_full(channels_last):
    """side_views blurs only the images that drew the blur, made in that order and put back: the same views, bit
    for bit, as every image through the products in the order given."""
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (100, 3, 40, 40), dtype=torch.uint8, generator=g)
    recipe = dataclasses.replace(augment.recipes_for("byol", 96)[1], blur_p=0.4)  # solarize too: rows read back
    p = augment.sample_params(160, recipe, 40, np.random.default_rng(1))
    idx = torch.randint(0, 100, (160,), generator=g)
    assert device_augment.blurred_first(idx, p)[2] < 160  # images left out of the products
    got = device_augment.side_views(images, idx, p, 40, 120, torch.float32, channels_last, torch.device("cpu"))
    full = device_augment.finish(*device_augment.jittered_and_blurred(images[idx], p, 40), channels_last)
    assert torch.equal(got, full)
    layout = torch.channels_last if channels_last else torch.contiguous_format
    assert got.is_contiguous(memory_format=layout)
    unblurred = device_augment.finish(*device_augment.jittered_and_blurred(images[idx], p, 40, blur_rows=0),
                                      channels_last)
    assert not torch.equal(got, unblurred)  # the blur was drawn and done


def test_blur_rows_past_those_that_drew_it_leave_the_views_as_they_were():
    """A ViewGraph blurs a fixed number of rows (blur_cover), more than drew the blur in most batches: the rows
    past the count carry the identity kernel and come out bit for bit as without the products."""
    g = torch.Generator().manual_seed(2)
    images = torch.randint(0, 256, (48, 3, 40, 40), dtype=torch.uint8, generator=g)
    recipe = dataclasses.replace(augment.recipes_for("simclr", 32)[0], blur_p=0.5)
    idx, p, drew, _ = device_augment.blurred_first(torch.arange(48),
                                                   augment.sample_params(48, recipe, 40, np.random.default_rng(3)))
    assert 5 < drew < 40
    exact = device_augment.jittered_and_blurred(images[idx], p, 32, blur_rows=drew)
    for rows in (drew + 1, 40, 48):
        covered = device_augment.jittered_and_blurred(images[idx], p, 32, blur_rows=rows)
        assert torch.equal(covered[0], exact[0]) and torch.equal(covered[1], exact[1])


def test_blur_cover_is_the_count_mean_and_five_deviations():
    """The rows a side's graph blurs: 0 where nothing can blur, every row where every view must, and for SimCLR's
    two views of 256 images at 0.5 the mean 256 + 5 x 11.3; counts drawn from those odds stay under it."""
    assert device_augment.blur_cover([0.0, 0.0], 256) == 0
    assert device_augment.blur_cover([1.0], 300) == 300
    simclr = [0.5, 0.5]  # two views
    assert device_augment.blur_cover(simclr, 256) == int(np.ceil(256 + 5 * np.sqrt(128)))  # 313
    byol = [1.0, 0.1]  # BYOL's first view always blurs, its second at 0.1
    assert device_augment.blur_cover(byol, 256) == int(np.ceil(256 + 25.6 + 5 * np.sqrt(256 * 0.09)))
    assert device_augment.blur_cover([0.5], 8) == 8  # never more rows than the side has
    counts = (np.random.default_rng(0).random((20_000, 512)) < 0.5).sum(1)
    assert counts.max() <= device_augment.blur_cover(simclr, 256)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
@pytest.mark.parametrize("on_side_stream", [False, True], ids=["default-stream", "side-stream"])
def test_graphed_views_are_the_eager_views_on_cuda(on_side_stream):
    """Captured and replayed from the default stream (a probe's) or a side stream (training's): the graph captures
    on a stream of its own, since torch refuses a capture on the default stream, and replays on the caller's."""
    device_augment.forget_graphs()  # captured here, from this stream, not taken from an earlier test's cache
    dev = torch.device("cuda")
    images = torch.randint(0, 256, (40, 3, 72, 72), dtype=torch.uint8, device=dev)
    idx = torch.arange(16, device=dev).repeat(2)
    stream = torch.cuda.current_stream(dev)
    if on_side_stream:
        stream = torch.cuda.Stream(dev)
        stream.wait_stream(torch.cuda.current_stream(dev))  # the images were made on the default stream
    for method in ("simclr", "byol"):
        recipes = augment.recipes_for(method, 96)
        for batch in range(3):  # a replay per batch: each must see its own draws
            p = device_augment.rows_of(device_augment.draw_params(16, recipes, 72, 0, 0, batch), [0, 1], slice(0, 16))
            with torch.cuda.stream(stream):
                eager = device_augment.jittered_and_blurred(images.index_select(0, idx), p, 96, torch.float16)
                graphed = device_augment.graphed_views(lambda buf: torch.index_select(images, 0, idx, out=buf), p,
                                                       96, torch.float16, 32, (32, 3, 72, 72), dev)
                assert torch.equal(eager[0], graphed[0]) and torch.equal(eager[1], graphed[1])


def blurred_first_steps(dev: torch.device):
    """The blurred-first CUDA test's input: (uint8 images, idx: 80 images' two views, then (method, count, p) per
    step), with 10, 70, 150 and 70 of the 160 views blurred. Also read by
    benchmarks/results/h100-views-blurred-first/diag_views.py (in the tree that folder's README names)."""
    images = torch.randint(0, 256, (100, 3, 72, 72), dtype=torch.uint8, device=dev)
    idx = torch.arange(80).repeat(2)
    rng = np.random.default_rng(0)

    def steps():
        for method in ("simclr", "byol"):
            recipes = augment.recipes_for(method, 96)
            for batch, count in enumerate((10, 70, 150, 70)):
                p = device_augment.rows_of(device_augment.draw_params(80, recipes, 72, 0, 0, batch), [0, 1],
                                           slice(0, 80))
                p["blur"] = np.isin(np.arange(160), rng.choice(160, count, replace=False))
                yield method, count, p

    return images, idx, steps()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_graphed_side_views_blurred_first_are_the_eager_ones_on_cuda():
    """The training path: side_views with the images that drew the blur first, eager and through the one ViewGraph
    whose blur covers 120 rows: counts of 10, 70 and 150 (past the cover: made eager, no capture), each equal to
    the eager views; one graph captured in all."""
    device_augment.forget_graphs()
    dev = torch.device("cuda")
    images, idx, steps = blurred_first_steps(dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    for method, count, p in steps:
        assert device_augment.blurred_first(idx, p)[2] == count
        with torch.cuda.stream(stream):  # compared on the stream that made them, after them
            made = [device_augment.side_views(images, idx, p, 96, 120, torch.float16, True, dev, graphs=graphs)
                    for graphs in (False, True)]
            assert torch.equal(*made), (method, count)
    assert [key[-1] for key in device_augment._graphs] == [120]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")
def test_no_view_graph_is_captured_after_the_first_batch_on_cuda():
    """A capture on the views' worker thread beside a training step that draws random numbers fails that step
    (ViewGraph says why), so every ViewGraph is captured at the first batch, on the calling thread: over an epoch
    of SimCLR's and BYOL's views at 96 px, whose blurred counts vary, the graphs after the first batch are the
    graphs at the end; and a graph replayed on this thread with dropout inside runs beside them throughout."""
    dev = torch.device("cuda")
    images = torch.randint(0, 256, (1024, 3, 112, 112), dtype=torch.uint8, device=dev)
    layer = torch.nn.Dropout(0.5)
    x = torch.ones(1024, device=dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        layer(x)  # warm-up before the capture, as torch asks
    stream.synchronize()
    drops = torch.cuda.CUDAGraph()
    with torch.cuda.graph(drops):
        dropped = layer(x)
    for method in ("simclr", "byol"):
        device_augment.forget_graphs()
        recipes = augment.recipes_for(method, 96)
        counts = {int(np.asarray(device_augment.draw_params(256, recipes, 112, 0, 0, b)["blur"], bool).sum())
                  for b in range(4)}
        assert len(counts) == 4  # SimCLR's 258, 276, 248, 265: a graph per count drawn would capture mid-epoch
        batches = device_augment.device_view_batches(images, recipes, 96, 256, 0, 0, 0, dev, channels_last=True,
                                                     graphs=True)
        next(batches)
        first = list(device_augment._graphs)
        assert len(first) == 1  # one side (both views), one graph
        for _ in batches:
            drops.replay()  # a training step's random draws, replayed while the worker makes the next views
        torch.cuda.synchronize()
        assert list(device_augment._graphs) == first, method
        assert 0 < dropped.count_nonzero() < 1024


def test_colour_clamps_its_input_before_any_blend():
    """The resize before jitter overshoots [0, 1] by float rounding (and a caller could pass more): colour() clamps
    first, so a blend that scales or averages pixels never carries the overshoot into the view."""
    x = torch.rand(2, 3, 4, 4)
    x[0, 0, 0, 0], x[1, 2, 1, 1] = 1.5, -0.5
    ones, zeros = torch.ones(2, 6), torch.zeros(2, 6)
    a, con = ones.clone(), zeros.clone()
    a[:, 0], con[:, 0] = 0.5, 0.5  # slot 0 darkens and pulls towards the mean: both see an out-of-range pixel
    args = (a, zeros, con, torch.zeros(2, 1), torch.zeros(2, 1), torch.zeros(2, 1))
    torch.testing.assert_close(device_augment.colour(x, *args), device_augment.colour(x.clamp(0, 1), *args))
