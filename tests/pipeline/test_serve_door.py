"""A submission that could not succeed is refused when it is made, in under a second, with the reason, and leaves
nothing behind: each bad option (by the same declared bounds and choices `pipeline pretrain` checks), a device this
machine cannot use, and data too few or undecodable for the job's split, batch, linear-eval and validate. No answer
names a path on the server."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from core.errors import PipelineError  # noqa: E402
from pipeline.serve import checks  # noqa: E402
from pipeline.serve.options import describe  # noqa: E402
from tests.pipeline.serve_helpers import files_under, make_app, photos, token_of, zip_bytes  # noqa: E402

SMALL = {"batch_size": "8"}


@pytest.fixture(scope="module")
def described():
    # a CPU-only host whatever this one has: `device=cuda` must be refused here
    return dict(describe(), devices=["cpu"], auto_device="cpu")


@pytest.fixture
def client(tmp_path, described):
    root = tmp_path / "root"
    with TestClient(make_app(root, described, allow_data=("synthetic:48", "synthetic:8"))) as c:
        c.headers["Authorization"] = "Bearer " + token_of(root)
        c.root = root
        yield c


def refused(client, tmp_path, status, words, **post):
    """POST /jobs: `status` within a second, the detail holding every one of `words`, no server path, nothing kept."""
    before = files_under(tmp_path)
    took = []
    for _ in range(2):  # the faster of two: a refusal changes nothing, and a loaded machine may stall one call
        t0 = time.perf_counter()
        r = client.post("/jobs", **post)
        took.append(time.perf_counter() - t0)
    took = min(took)
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    for w in words:
        assert w in detail, detail
    assert str(tmp_path) not in detail and "/work" not in detail and "/tmp" not in detail, detail
    assert took < 1.0, f"{took:.2f} s"
    assert files_under(tmp_path) == before and client.get("/jobs").json() == []
    return detail


@pytest.mark.parametrize("fields, words", [
    ({"epochs": "0"}, ["`epochs` must be >= 1", "got 0"]),
    ({"epochs": "-1"}, ["`epochs` must be >= 1", "got -1"]),
    ({"batch_size": "0"}, ["`batch_size` must be >= 2", "got 0"]),
    ({"val_fraction": "1.5"}, ["`val_fraction` must be >= 0 and < 1", "got 1.5"]),
    ({"lr": "nan"}, ["`lr` must be a finite number", "nan"]),
    ({"lr": "inf"}, ["`lr` must be a finite number", "inf"]),
    ({"temperature": "0"}, ["`temperature` must be > 0"]),
    ({"num_workers": "100000"}, ["`num_workers` must be >= -1 and <= 64", "got 100000"]),
    ({"seed": "-1"}, ["`seed` must be >= 0"]),
    ({"momentum_base": "1.5"}, ["`momentum_base` must be >= 0 and <= 1"]),
    ({"image_size": "4"}, ["image size 4 is impossible for resnet18 with the small stem: use 8..1024"]),
    ({"image_size": "16", "small_stem": "off"}, ["image size 16 is impossible for resnet18 with the ImageNet stem", "32..1024"]),
    ({"image_size": "30", "backbone": "vit_t_16"}, ["not a multiple of vit_t_16's patch 4"]),
    ({"store_size": "16", "image_size": "32"}, ["`store_size` 16 is smaller than `image_size` 32"]),
    ({"queue_size": "16"}, ["`queue_size` is a MoCo v3 option"]),
    ({"device": "cuda"}, ["`device` cuda is not usable on this server", "usable: cpu"]),
    ({"device": "tpu"}, ["`device` must be one of"]),
    ({"cuda_graphs": "on"}, ["`cuda_graphs` on needs device cuda"]),
    ({"sync_bn": "true"}, ["`sync_bn` needs device cuda"]),
    ({"preprocess": "coreml"}, ["`preprocess` coreml needs Core ML"]),
    ({"max_steps": "3", "max-steps": "5"}, ["`max_steps` is given twice", "`max-steps`"]),
    ({"epochz": "3"}, ["unknown option `epochz`"]),
])
def test_each_bad_option_is_refused_with_its_reason(client, tmp_path, fields, words):
    refused(client, tmp_path, 422, words, data={"data": "synthetic:48", **SMALL, **fields})


@pytest.mark.parametrize("fields", [
    {"image_size": "16", "small_stem": "off"}, {"store_size": "16", "image_size": "32"}, {"queue_size": "16"},
    {"epochs": "0"}, {"lr": "nan"}, {"val_fraction": "1.5"}, {"num_workers": "100000"},
])
def test_what_the_door_refuses_pretraining_refuses_too(tmp_path, fields):
    """The checks across options (checks.check_options) say what train/runspec.py's validate says, from the facts
    the pipeline describes: a case the door refuses fails `pipeline pretrain`'s own check, before training."""
    from train.runspec import config_for_run

    with pytest.raises(PipelineError):
        config_for_run(None, {k.replace("-", "_"): v for k, v in fields.items()}, tmp_path / "run", resume=False)


def test_the_limits_on_the_bounds_are_accepted(client):
    r = client.post("/jobs", data={"data": "synthetic:48", "batch_size": "2", "epochs": "1", "val_fraction": "0",
                                   "num_workers": "64", "image_size": "8", "lr": "100"})
    # val_fraction 0 holds out nothing: validate would have no image, so the data check refuses it
    assert r.status_code == 422 and "0 held-out image(s)" in r.json()["detail"]
    r = client.post("/jobs", data={"data": "synthetic:48", "batch_size": "2", "epochs": "1", "val_fraction": "0.05",
                                   "num_workers": "64", "image_size": "8", "lr": "100", "method": "mocov3",
                                   "queue_size": "16"})
    assert r.status_code == 201, r.text
    assert client.post("/jobs", data={"data": "synthetic:48", **SMALL, "image_size": "1024"}).status_code == 201


def test_a_zip_without_images_is_refused_on_upload(client, tmp_path):
    body = zip_bytes({"noimages/a.txt": b"hello", "noimages/b.png": b"not a png at all", "noimages/c.csv": b"1,2"})
    refused(client, tmp_path, 422, ["none of the 3 file(s) is an image that can be decoded", "e.g. 'a.txt'"],
            files={"file": ("noimages.zip", body)}, data=SMALL)


def test_eight_images_are_refused_for_validate_and_the_batch_unless_the_options_fit(client, tmp_path):
    """Eight images made every load-test job fail at validate ("only 1 image(s)"): at val_fraction 0.1 one image is
    held out; the default batch of 128 is more than the seven left to train on."""
    body = zip_bytes(photos({"": 8}))
    refused(client, tmp_path, 422, ["7 training image(s)", "batch_size 128 needs at least 128"],
            files={"file": ("eight.zip", body)})
    refused(client, tmp_path, 422, ["1 held-out image(s) of 8", "needs at least 2", "raise val_fraction"],
            files={"file": ("eight.zip", body)}, data={"batch_size": "4"})
    r = client.post("/jobs", files={"file": ("eight.zip", body)}, data={"batch_size": "4", "val_fraction": "0.25"})
    assert r.status_code == 201, r.text  # 2 held out, 6 to train on in batches of 4


def test_undecodable_files_do_not_count(client, tmp_path):
    entries = photos({"": 10})
    entries.update({f"photos/broken{i}.png": b"\x89PNG\r\n\x1a\n truncated" for i in range(20)})
    refused(client, tmp_path, 422, ["9 training image(s) after holding out 1 of 10", "batch_size 16"],
            files={"file": ("mixed.zip", zip_bytes(entries))}, data={"batch_size": "16"})


def test_labelled_data_needs_two_classes_and_two_training_images_in_each(client, tmp_path):
    refused(client, tmp_path, 422, ["1 class folder(s) hold images", "at least 2"],
            files={"file": ("one.zip", zip_bytes(photos({"cat": 30})))}, data=SMALL)
    refused(client, tmp_path, 422, ["a class has 1 training image(s)", "at least 2 per class"],
            files={"file": ("thin.zip", zip_bytes(photos({"cat": 30, "dog": 1})))}, data=SMALL)
    r = client.post("/jobs", files={"file": ("two.zip", zip_bytes(photos({"cat": 15, "dog": 15})))}, data=SMALL)
    assert r.status_code == 201, r.text


def test_an_allowed_spec_is_counted_too(client, tmp_path):
    refused(client, tmp_path, 422, ["8 training image(s) after holding out 0 of 8", "batch_size 16"],
            data={"data": "synthetic:8", "batch_size": "16"})
    refused(client, tmp_path, 422, ["0 held-out image(s) of 8"], data={"data": "synthetic:8", **SMALL})


def test_the_counts_of_named_sets_are_the_libraries(described):
    """checks.py's facts about the bundled sets equal what train/data.py loads, and synthetic:N's classes."""
    import numpy as np
    from sklearn.datasets import load_digits

    from train.data import count_train_images, make_synthetic

    assert tuple(np.bincount(load_digits().target)) == checks.DIGITS_PER_CLASS
    for n in (8, 48, 50):
        got = checks.spec_images(f"synthetic:{n}")
        assert got.per_class == np.bincount(make_synthetic(n, 8).labels.numpy(), minlength=4).tolist()
        assert sum(got.split(0.1)[0]) == count_train_images(f"synthetic:{n}", 0.1)
    assert sum(checks.spec_images("digits").split(0.1)[0]) == count_train_images("digits", 0.1)
    assert sum(checks.spec_images("cifar10:/x").split(0.5)[0]) == count_train_images("cifar10:/x", 0.5) == 50_000


def test_the_count_of_a_folder_is_the_loaders_split(tmp_path):
    """An upload's (train, val) per class, counted before any job runs, is what make_split holds out of the loaded
    folder: the same classes, the same undecodable file left out, the same rounding of each class's share."""
    import numpy as np

    from train.data import load_data, make_split

    # 3 and 5 images at val_fraction 0.5 are halves: flooring, ceiling or rounding half up each holds out another
    # count than round()'s half-to-even in one of them, so a rounding of its own on either side fails here
    entries = photos({"a": 3, "b": 5, "c": 2}, top="")
    entries["b/broken.png"] = b"\x89PNG\r\n\x1a\n truncated"
    for name, body in entries.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(body)
    counted = checks.folder_images(tmp_path)
    assert counted.per_class == [3, 5, 2] and counted.labelled
    data = load_data(f"folder:{tmp_path}", 8)
    for val_fraction in (0.5, 0.3):
        split = make_split(data, val_fraction, seed=0)
        loaded = tuple(np.bincount(data.labels.numpy()[split[half]], minlength=3).tolist() for half in ("train", "val"))
        assert counted.split(val_fraction) == checks.spec_images(f"folder:{tmp_path}").split(val_fraction) == loaded


def test_a_failed_stage_names_no_server_path(tmp_path):
    """A stage's error line reaches the client without the job's folder, the root, the code or the interpreter."""
    import sys

    from pipeline.serve.options import PROJECT
    from pipeline.serve.runner import error_line, hide_paths

    job = tmp_path / "root" / "0123456789abcdef"
    log = tmp_path / "pretrain.log"
    log.write_text(f"$ {sys.executable} -m pipeline pretrain --data folder:{job}/data/photos --out {job}/run\n"
                   f"error: folder does not exist: {job}/data/photos (see {PROJECT}/configs/x.yaml)\n")
    line = hide_paths(error_line(log, 2), job, tmp_path / "root")
    assert line == "folder does not exist: data/photos (see configs/x.yaml)"
    assert hide_paths(log.read_text(), job, tmp_path / "root").startswith(
        "$ python -m pipeline pretrain --data folder:data/photos --out run")
