"""The encoder an app ships (RUN/export/encoder.pt) applies the training's preprocessing itself: RGB pixels 0..255
-> (pixels / 255 - ImageNet mean) / std -> backbone -> L2. Compared with that formula written out here, on images
whose three channels differ, so a channel swap (RGB <-> BGR) or a lost normalisation changes the features.

validate proves each artifact equals encoder.pt and test_strip compares `encoder.backbone(x)`: neither looks at
what encoder.pt does to pixels before its backbone.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from export.encoder import Encoder, load_encoder
from core import rundir
from train import augment
from stages import strip
from train.backbones import build_backbone
from tests.tiny_run import pretrain_tiny

IMAGENET_MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
IMAGENET_STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


def _pixels(n=4, size=16) -> torch.Tensor:
    """uint8 RGB images with a different range per channel: red high, green middle, blue low."""
    g = torch.Generator().manual_seed(0)
    lo_hi = [(180, 256), (90, 160), (0, 60)]
    return torch.stack([torch.randint(lo, hi, (n, size, size), generator=g) for lo, hi in lo_hi], 1).to(torch.uint8)


def _by_hand(backbone, pixels, l2=True):
    with torch.no_grad():
        f = backbone((pixels.float() / 255 - IMAGENET_MEAN) / IMAGENET_STD)
    return F.normalize(f, dim=1) if l2 else f


def test_stripped_encoder_pt_normalises_rgb_pixels_itself(tmp_path, tiny_overrides):
    out = tmp_path / "run"
    pretrain_tiny(out, max_steps=1)
    strip.run(strip.StripConfig(), out, say=lambda *_: None)

    # the trained backbone, straight from the checkpoint (not through the stage's code)
    ckpt = torch.load(out / rundir.LAST_CHECKPOINT, weights_only=False)
    backbone, _ = build_backbone("resnet18", small_stem=True)
    backbone.load_state_dict({k[len("backbone."):]: v for k, v in ckpt["model"].items() if k.startswith("backbone.")})
    backbone.eval()

    encoder, state = load_encoder(rundir.encoder_path(out))
    pixels = _pixels()
    with torch.no_grad():
        got = encoder(pixels.float())
    expected = _by_hand(backbone, pixels)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)

    # the slips this would catch make a difference on these images
    bgr = _by_hand(backbone, pixels.flip(1))
    raw = F.normalize(backbone(pixels.float() / 255), dim=1).detach()
    for wrong in (bgr, raw):
        assert (wrong - expected).abs().max() > 1e-2


def test_encoder_without_l2_is_the_backbone_of_normalised_pixels():
    backbone, _ = build_backbone("resnet18", small_stem=True)
    backbone.eval()
    encoder = Encoder(backbone, augment.MEAN, augment.STD, l2_normalize=False).eval()
    pixels = _pixels()
    with torch.no_grad():
        torch.testing.assert_close(encoder(pixels.float()), _by_hand(backbone, pixels, l2=False), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(encoder(pixels), _by_hand(backbone, pixels, l2=False), rtol=1e-4, atol=1e-5)


def test_training_normalises_pixels_the_same_way():
    """The views pretraining and linear-eval feed the backbone: the same formula, so the shipped encoder sees
    pixels exactly as the backbone did when it learned."""
    pixels = _pixels()
    expected = (pixels.float() / 255 - IMAGENET_MEAN) / IMAGENET_STD
    torch.testing.assert_close(augment.normalize(pixels, torch.device("cpu")), expected, rtol=1e-5, atol=1e-6)


def test_encoder_pt_decides_l2_unless_the_caller_does():
    """`pipeline strip --no-l2-normalize` records l2_normalize False; an encoder.pt without the key (older) is
    L2-normalised; an explicit argument overrides the file either way."""
    from export.encoder import encoder_from_state

    backbone, _ = build_backbone("resnet18", small_stem=True)
    state = {"backbone": "resnet18", "small_stem": True, "state_dict": backbone.state_dict(), "mean": augment.MEAN,
             "std": augment.STD}
    backbone.eval()
    pixels = _pixels()
    raw, unit = _by_hand(backbone, pixels, l2=False), _by_hand(backbone, pixels)
    cases = [({"l2_normalize": False}, None, raw), ({}, None, unit), ({"l2_normalize": True}, None, unit),
             ({"l2_normalize": False}, True, unit), ({"l2_normalize": True}, False, raw)]
    for extra, override, expected in cases:
        with torch.no_grad():
            got = encoder_from_state({**state, **extra}, override)(pixels.float())
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, msg=f"{extra} {override}")


def test_encoder_defaults_to_l2_and_keeps_a_zero_feature_finite():
    class Zeros(torch.nn.Module):
        def forward(self, x):
            return torch.zeros(x.shape[0], 8)

    backbone, _ = build_backbone("resnet18", small_stem=True)
    backbone.eval()
    with torch.no_grad():
        out = Encoder(backbone, augment.MEAN, augment.STD)(_pixels().float())
        zero = Encoder(Zeros(), augment.MEAN, augment.STD)(_pixels().float())
    torch.testing.assert_close(out.norm(dim=1), torch.ones(len(out)))
    assert torch.equal(zero, torch.zeros_like(zero))  # the eps keeps 0 / |0| finite


def test_load_encoder_bad_files_are_one_line_errors(tmp_path):
    from core.errors import PipelineError

    with pytest.raises(PipelineError, match="no stripped encoder at .*nope.pt: run `pipeline strip` first"):
        load_encoder(tmp_path / "nope.pt")
    (tmp_path / "cut.pt").write_bytes(b"PK\x03\x04 truncated")
    with pytest.raises(PipelineError, match=r"cut.pt is unreadable or truncated \(\w+\): re-run `pipeline strip`") as e:
        load_encoder(tmp_path / "cut.pt")
    assert "(NoneType)" not in str(e.value)  # it names the loader's exception
    torch.save({"state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(PipelineError, match="other.pt is not an encoder written by `pipeline strip`"):
        load_encoder(tmp_path / "other.pt")
    torch.save({"backbone": "resnet18", "state_dict": {}, "extra": Path("/etc")}, tmp_path / "pickled.pt")
    with pytest.raises(PipelineError, match="pickled.pt holds Python objects other than tensors and plain values; "
                                            "refused, since loading them could run code"):
        load_encoder(tmp_path / "pickled.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(PipelineError, match="list.pt is not an encoder written by `pipeline strip`"):
        load_encoder(tmp_path / "list.pt")


def test_load_encoder_needs_both_keys_and_passes_the_l2_choice_on(tmp_path):
    from core.errors import PipelineError

    torch.save({"backbone": "resnet18"}, tmp_path / "half.pt")
    with pytest.raises(PipelineError, match="half.pt is not an encoder written by `pipeline strip`"):
        load_encoder(tmp_path / "half.pt")
    backbone, _ = build_backbone("resnet18", small_stem=True)
    torch.save({"backbone": "resnet18", "small_stem": True, "state_dict": backbone.state_dict(), "mean": augment.MEAN,
                "std": augment.STD, "l2_normalize": True}, tmp_path / "enc.pt")
    backbone.eval()
    raw, _ = load_encoder(tmp_path / "enc.pt", l2_normalize=False)
    with torch.no_grad():
        torch.testing.assert_close(raw(_pixels().float()), _by_hand(backbone, _pixels(), l2=False), rtol=1e-4, atol=1e-5)
