"""Every data SPEC on generated files, every bad input, and correct colour conversion."""

import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from core.errors import PipelineError
from train.data import decode_image, load_data, make_split


def _save(path, arr, mode=None, **kw):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr, mode) if mode else Image.fromarray(arr)
    (Image.fromarray(arr, mode) if mode else Image.fromarray(arr)).save(path, **kw)


def test_digits_is_embedded():
    d = load_data("digits", 16)
    assert d.images.shape == (1797, 3, 16, 16) and d.images.dtype == torch.uint8
    assert d.labels is not None and set(d.labels.tolist()) == set(range(10))


def test_photos_are_embedded_with_a_held_out_split_that_shares_no_pixel():
    """`make all`'s default: 10 classes (one per photograph), the same set whatever the run's seed, its own val split
    (the patches of each picture's right quarter), and every val patch cut from columns no train patch touches."""
    from train import photos

    a, b = load_data("photos", 24, seed=0), load_data("photos", 24, seed=5)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.images.shape == (3000, 3, 24, 24) and a.classes == list(photos.photographs())
    assert a.classes[:3] == ["china", "flower", "grace_hopper"] and len(a.classes) == 10
    assert np.bincount(a.labels.numpy()).tolist() == [300] * 10 and a.fixed_val.sum() == 10 * photos.VAL_PER_CLASS
    split = make_split(a, 0.2, seed=0)
    assert sorted(split["val"]) == np.flatnonzero(a.fixed_val).tolist()
    assert len(split["train"]) == photos.train_count()
    boxes = {}  # (class, val) -> [(x0, x1)] in the picture's columns
    for src, label, val in zip(a.sources, a.labels.tolist(), a.fixed_val.tolist()):
        x, _, side = map(int, src.split("@")[1].split(","))
        boxes.setdefault((label, val), []).append((x, x + side))
    for c in range(10):
        assert max(e for _, e in boxes[(c, False)]) <= min(x for x, _ in boxes[(c, True)]), a.classes[c]


def test_photos_patches_are_the_photographs_pixels():
    """A patch is a crop of its picture where its source says: at its own side, the picture's pixels exactly."""
    from train import photos

    images, labels, _, classes, sources = photos.build(64)
    pics = photos.photographs()
    same_side = [i for i, s in enumerate(sources) if s.endswith(",64")]
    assert len(same_side) > 10
    for i in same_side[::50]:
        name, box = sources[i].split("@")
        x, y, side = map(int, box.split(","))
        assert np.array_equal(images[i], pics[name][y:y + side, x:x + side])
        assert classes[labels[i]] == name


def test_synthetic_is_deterministic_and_labelled():
    a, b = load_data("synthetic:20", 12, seed=3), load_data("synthetic:20", 12, seed=3)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)
    assert a.images.shape == (20, 3, 12, 12) and len(a.classes) == 4


def test_folder_with_classes_skips_and_lists_bad_files(tmp_path):
    rng = np.random.default_rng(0)
    for c in ("cat", "dog"):
        for i in range(3):
            _save(tmp_path / c / f"{i}.png", rng.integers(0, 255, (20, 30, 3), dtype=np.uint8))
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    good = tmp_path / "dog" / "big.jpg"
    _save(good, rng.integers(0, 255, (64, 64, 3), dtype=np.uint8), quality=95)
    (tmp_path / "dog" / "truncated.jpg").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    (tmp_path / "dog" / "empty.png").write_bytes(b"")
    d = load_data(f"folder:{tmp_path}", 16)
    assert d.classes == ["cat", "dog"]
    assert len(d) == 7 and d.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    skipped = {p.split("/")[-1] for p, _ in d.skipped}
    assert skipped == {"notes.txt", "truncated.jpg", "empty.png"}


def test_flat_folder_is_unlabelled(tmp_path):
    for i in range(4):
        _save(tmp_path / f"{i}.png", np.full((10, 10, 3), i * 40, dtype=np.uint8))
    d = load_data(f"folder:{tmp_path}", 8)
    assert d.labels is None and len(d) == 4


def _write_cifar(root, kind):
    rng = np.random.default_rng(1)
    root.mkdir(parents=True)
    if kind == "cifar10":
        names, key = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"], b"labels"
        meta = ("batches.meta", {b"label_names": [f"c{i}".encode() for i in range(10)]})
    else:
        names, key = ["train", "test"], b"fine_labels"
        meta = ("meta", {b"fine_label_names": [f"f{i}".encode() for i in range(100)]})
    for name in names:
        with open(root / name, "wb") as f:
            pickle.dump({b"data": rng.integers(0, 255, (4, 3072), dtype=np.uint8), key: [0, 1, 2, 3]}, f)
    with open(root / meta[0], "wb") as f:
        pickle.dump(meta[1], f)


@pytest.mark.parametrize("kind,inner,n", [("cifar10", "cifar-10-batches-py", 24), ("cifar100", "cifar-100-python", 8)])
def test_cifar_pickles(tmp_path, kind, inner, n):
    _write_cifar(tmp_path / inner, kind)
    d = load_data(f"{kind}:{tmp_path}", 32)
    assert len(d) == n and d.images.shape[1:] == (3, 32, 32)
    split = make_split(d, 0.1, 0)
    assert len(split["val"]) == 4  # the dataset's own test batch


def test_cifar_pixel_layout(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    _write_cifar(root, "cifar10")
    raw = pickle.load(open(root / "data_batch_1", "rb"), encoding="bytes")[b"data"][0]
    d = load_data(f"cifar10:{tmp_path}", 32)
    assert torch.equal(d.images[0], torch.from_numpy(raw.reshape(3, 32, 32)))


@pytest.mark.parametrize("spec,msg", [
    ("imagenet:/x", "unknown data SPEC"),
    ("folder:/does/not/exist", "folder does not exist"),
    ("cifar10:/does/not/exist", "path does not exist"),
    ("synthetic:abc", "integer N"),
    ("synthetic:0", "N > 0"),
    ("folder", "needs an argument"),
    ("digits:3", "takes no argument"),
    ("photos:x", "takes no argument"),
])
def test_bad_specs(spec, msg):
    with pytest.raises(PipelineError, match=msg):
        load_data(spec, 16)


def test_empty_folder_is_an_error(tmp_path):
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(PipelineError, match="no usable images"):
        load_data(f"folder:{tmp_path}", 16)


def test_cifar_folder_missing_batches(tmp_path):
    (tmp_path / "cifar-10-batches-py").mkdir()
    with pytest.raises(PipelineError, match="missing data_batch_1"):
        load_data(f"cifar10:{tmp_path}", 32)


# --- colour conversion: each decoded to the RGB a viewer shows


def test_grayscale_and_16bit(tmp_path):
    _save(tmp_path / "g.png", np.full((8, 8), 100, dtype=np.uint8))
    assert (decode_image(tmp_path / "g.png", 8) == 100).all()
    Image.fromarray(np.full((8, 8), 65535 // 2, dtype=np.uint16)).save(tmp_path / "g16.png")
    out = decode_image(tmp_path / "g16.png", 8)
    assert np.abs(out.astype(int) - 127).max() <= 1  # scaled by value, not clipped to 255


def test_rgba_composited_on_white(tmp_path):
    arr = np.zeros((8, 8, 4), dtype=np.uint8)
    arr[..., 0] = 255  # red, fully transparent on the left half
    arr[:, 4:, 3] = 255
    _save(tmp_path / "a.png", arr, "RGBA")
    out = decode_image(tmp_path / "a.png", 8)
    assert (out[:, :4] == 255).all()  # transparent -> white
    assert (out[:, 5:] == [255, 0, 0]).all()


def test_cmyk(tmp_path):
    Image.new("CMYK", (8, 8), (0, 255, 255, 0)).save(tmp_path / "c.jpg", quality=100)  # pure red in CMYK
    out = decode_image(tmp_path / "c.jpg", 8).astype(int)
    assert out[..., 0].mean() > 200 and out[..., 1].mean() < 60 and out[..., 2].mean() < 60


def test_exif_rotation_applied(tmp_path):
    arr = np.zeros((10, 20, 3), dtype=np.uint8)  # wide, left half white
    arr[:, :10] = 255
    im = Image.fromarray(arr)
    exif = im.getexif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    im.save(tmp_path / "r.jpg", exif=exif, quality=100)
    with Image.open(tmp_path / "r.jpg") as raw:
        assert raw.size == (20, 10)
    # decoded upright: displayed image is tall, white on top; after the square center-crop the top is white
    out = decode_image(tmp_path / "r.jpg", 10).astype(int)
    assert out[:3].mean() > 200 and out[-3:].mean() < 50


def test_split_is_deterministic_disjoint_and_stratified():
    d = load_data("synthetic:40", 8)
    a, b = make_split(d, 0.25, 7), make_split(d, 0.25, 7)
    assert a == b
    assert not set(a["train"]) & set(a["val"]) and len(a["train"]) + len(a["val"]) == 40
    assert set(d.labels[a["val"]].tolist()) == {0, 1, 2, 3}
    assert make_split(d, 0.25, 8)["val"] != a["val"]
