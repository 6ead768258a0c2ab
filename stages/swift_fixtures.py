"""swift-fixtures stage (`pipeline swift-fixtures`): golden files for swift_demo/'s `swift test`, made by the
pipeline's own code, so the Swift port of decode/crop, kNN and the parity gates is checked against the real thing
without torch on the Swift side.

Reads RUN/config.yaml (data spec, image size), RUN/split.json (which images are val), RUN/export/encoder.pt (the fp32
reference encoder), RUN/export/encoder.json (the sidecar) and the Core ML model it lists (its metadata). Writes into
swift_demo/Tests/EmbeddingKitTests/Fixtures/ (or --out), each file atomically:

  manifest.json     cases, roles, labels, offsets, and every expected value (kNN, majority, centroid, top-5, parity)
  raw.u8            each query's pixels as an app's decoder hands them over: stored orientation, its channel layout
  crops.u8          each query after the pipeline's decode_image (EXIF transpose, alpha on white, fit BICUBIC), S*S*3
  embeddings.f32    bank rows, then query rows: encoder.pt on the crops, float32 little-endian, N x D
  parity_fp16.f32   the query rows rounded through float16 (an fp16 artifact's typical error)
  parity_noisy.f32  the query rows with 3% relative noise (a broken fp16 artifact; a compressed one's typical error)
  parity_flipped.f32  the query rows with the first one negated (one image gone wrong, which every gate must catch)
  encoder.json      the run's sidecar, as is
  model_metadata.json  the Core ML model's user_defined_metadata (string -> string), as the app reads it

Raw buffers are bytes, not PNG/JPEG, because Foundation on Linux cannot decode images; tests/stages/
test_swift_fixtures.py re-derives the crops from them with the current decode_image and the expectations from the
committed embeddings, so a change on the pipeline side that the Swift side has not followed fails a test.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import PIL
import torch
from PIL import Image

from export import parity
from export.configs import ValidateConfig
from export.encoder import load_encoder
from core import __version__, rundir
from core.config import opt
from core.errors import PipelineError
from train.data import decode_image, load_data
from train.knn import MAJORITY_K, TEMPERATURE, WEIGHTED_K, knn_scores

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "swift_demo" / "Tests" / "EmbeddingKitTests" / "Fixtures"
FORMAT_VERSION = 2  # EmbeddingKit's FixtureSet refuses another version; 2 adds the compressed verdicts
TOP_N = 5  # neighbours listed per query for the search test
PARITY_TOP_K = 10  # validate's default --top-k
GATES = ValidateConfig().gates()  # validate's defaults; the kNN and probe drops need labels the golden crops lack
ORIENTATION_TAG = 0x0112  # EXIF Orientation

# One row per query image: (width, height, EXIF orientation, layout, alpha pattern). Odd sizes so the crop box is
# fractional; every orientation; upscaling (smaller than the model side), the identity size, extreme aspect ratios;
# every channel layout an iOS buffer comes in; straight (non-premultiplied) alpha, as PNG stores it.
CASES = [
    (23, 37, 1, "rgb", None), (37, 23, 2, "rgb", None), (41, 29, 3, "rgb", None), (29, 41, 4, "rgb", None),
    (31, 19, 5, "rgb", None), (19, 31, 6, "rgb", None), (45, 33, 7, "rgb", None), (33, 45, 8, "rgb", None),
    (27, 27, 1, "rgba", "ramp"), (35, 21, 6, "bgra", "ramp"), (21, 35, 1, "argb", "holes"), (40, 24, 3, "rgba", "holes"),
    (0, 0, 1, "rgb", None), (9, 13, 1, "rgb", None), (97, 61, 1, "bgra", None), (5, 40, 8, "argb", None),
    (64, 17, 1, "gray", None), (17, 18, 2, "gray", None), (0, 1, 1, "rgb", None), (1, 0, 5, "rgb", None),
    (51, 50, 1, "bgra", None), (13, 29, 6, "rgb", None), (60, 60, 1, "rgb", None), (3, 3, 7, "rgba", "ramp"),
]  # width/height 0 means "the model's side", 1 means "the model's side + 1"
LAYOUT_MODES = {"rgb": "RGB", "rgba": "RGBA", "bgra": "RGBA", "argb": "RGBA", "gray": "L"}
LAYOUT_ORDER = {"rgb": (0, 1, 2), "rgba": (0, 1, 2, 3), "bgra": (2, 1, 0, 3), "argb": (3, 0, 1, 2), "gray": (0,)}


@dataclass
class SwiftFixturesConfig:
    out: str = opt("", "folder to write; empty = swift_demo/Tests/EmbeddingKitTests/Fixtures, what `swift test` reads")
    bank_per_class: int = opt(10, "train images per class in the search/kNN bank: 100 rows on 10 classes, fewer than "
                                  "k = 200, so the cap at the bank size is exercised too")
    max_bytes: int = opt(1_000_000, "the fixtures are committed: refuse to write more unless raised (a 224 px model's "
                                    "24 crops alone are 3.6 MB)")


# ---------------------------------------------------------------- pixels: what an app's decoder hands over

def _side(v: int, size: int) -> int:
    return {0: size, 1: size + 1}.get(v, v)


def _photo(base: np.ndarray, w: int, h: int, alpha: str | None, index: int) -> np.ndarray:
    """A colour photo-like h x w image from one val image: resized, tinted so R, G and B differ (the digits are
    gray, and a channel-order bug must show), with an alpha pattern when asked."""
    im = np.asarray(Image.fromarray(base).resize((w, h), Image.Resampling.BILINEAR), dtype=np.float64)
    yy, xx = np.mgrid[0:h, 0:w]
    tint = np.stack([im[..., 0], 0.7 * im[..., 1] + 60 * xx / max(w - 1, 1), 255 - 0.8 * im[..., 2] - 40 * yy / max(h - 1, 1)], -1)
    rgb = np.clip(np.round(tint + (index * 37) % 50), 0, 255).astype(np.uint8)
    if alpha is None:
        return rgb
    a = (np.round(255 * (xx + yy) / max(w + h - 2, 1)) if alpha == "ramp" else np.where((xx // 3 + yy // 3) % 2, 255, 0))
    return np.concatenate([rgb, a.astype(np.uint8)[..., None]], -1)


def _png(pixels: np.ndarray, orientation: int, path: Path) -> None:
    """Pixels as stored (before rotation) + the EXIF orientation tag, losslessly, for decode_image."""
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = orientation
    Image.fromarray(np.ascontiguousarray(pixels)).save(path, exif=exif)  # L, RGB or RGBA from the array's shape


def to_layout(pixels: np.ndarray, layout: str) -> bytes:
    """Stored pixels (RGB, RGBA or L) as the bytes of one buffer in `layout` (bgra/argb: the order in memory)."""
    arr = pixels[..., None] if pixels.ndim == 2 else pixels
    return np.ascontiguousarray(arr[..., list(LAYOUT_ORDER[layout])]).tobytes()


def from_layout(raw: bytes, width: int, height: int, layout: str) -> np.ndarray:
    """The inverse of to_layout: back to PIL's RGB / RGBA / L array."""
    order = LAYOUT_ORDER[layout]
    arr = np.frombuffer(raw, dtype=np.uint8).reshape(height, width, len(order))
    back = np.empty_like(arr)
    back[..., list(order)] = arr
    return back[..., 0] if layout == "gray" else back


def pipeline_crop(raw: bytes, width: int, height: int, layout: str, orientation: int, size: int) -> np.ndarray:
    """What the pipeline makes of these bytes: written as a PNG with the orientation tag, then decode_image."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "image.png"
        _png(from_layout(raw, width, height, layout), orientation, path)
        with Image.open(path) as im:
            if im.getexif().get(ORIENTATION_TAG) != orientation:
                raise PipelineError("this Pillow does not keep the EXIF orientation in a PNG; cannot make fixtures")
        return decode_image(path, size)


# ---------------------------------------------------------------- expectations: the pipeline's own code

def expectations(bank: np.ndarray, bank_labels: list[int], queries: np.ndarray, num_classes: int,
                 centroid_threshold: float | None = None) -> dict:
    """Every value the Swift classifiers and search must reproduce, for each query row."""
    b, q = torch.from_numpy(bank), torch.from_numpy(queries)
    labels = torch.as_tensor(bank_labels, dtype=torch.long)
    weighted = knn_scores(b, labels, q, num_classes, WEIGHTED_K, TEMPERATURE)
    majority = knn_scores(b, labels, q, num_classes, MAJORITY_K, None)
    unit = lambda a: a / np.linalg.norm(a, axis=1, keepdims=True)  # noqa: E731
    bn, qn = unit(bank.astype(np.float64)), unit(queries.astype(np.float64))
    cents = unit(np.stack([bn[np.asarray(bank_labels) == c].mean(0) for c in range(num_classes)]))
    cent_sim = qn @ cents.T
    best = cent_sim.max(1)
    if centroid_threshold is None:  # between the 8th and 9th weakest queries: some are "unknown", most are not
        s = np.sort(best)
        centroid_threshold = float((s[7] + s[8]) / 2) if len(s) > 8 else float(s.min() - 1e-3)
    sims = qn @ bn.T
    order = np.argsort(-sims, axis=1, kind="stable")[:, :TOP_N]
    rows = []
    for i in range(len(q)):
        c = int(cent_sim[i].argmax())
        rows.append({
            "knn_label": int(weighted[i].argmax()), "knn_scores": [float(v) for v in weighted[i]],
            "majority_label": int(majority[i].argmax()), "majority_votes": [int(v) for v in majority[i]],
            "centroid_label": c if best[i] >= centroid_threshold else None, "centroid_nearest": c,
            "centroid_cosine": float(best[i]),
            "top_ids": [int(j) for j in order[i]], "top_similarities": [float(sims[i, j]) for j in order[i]],
        })
    return {"weighted_k": WEIGHTED_K, "temperature": TEMPERATURE, "majority_k": MAJORITY_K,
            "centroid_threshold": centroid_threshold, "queries": rows}


def parity_expectations(ref: np.ndarray, variants: dict[str, np.ndarray]) -> dict:
    """validate's metrics and gate verdicts for each (artifact-like) variant of the reference rows."""
    out = {}
    for name, arr in variants.items():
        m = parity.compare(ref, arr, PARITY_TOP_K)
        out[name] = {
            **{k: m[k] for k in ("worst_cosine", "mean_cosine", "worst_rel_l2", "mean_rel_l2", "max_abs", "top_k",
                                 "topk_agreement")},
            **{f"fails_{p}": bool(parity.gate_failures(m, p, **GATES)) for p in parity.PRECISIONS},
        }
    return {"gates": GATES, "top_k": PARITY_TOP_K, "variants": out}


def parity_variants(ref: np.ndarray) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    noisy = ref + 0.03 * np.abs(ref).mean() * rng.standard_normal(ref.shape)
    flipped = ref.copy()
    flipped[0] = -flipped[0]
    return {"fp16": ref.astype(np.float16).astype(np.float32), "noisy": noisy.astype(np.float32),
            "flipped": flipped.astype(np.float32)}


# ---------------------------------------------------------------- the run

def _model_metadata(export_dir: Path, sidecar: dict) -> dict:
    """user_defined_metadata of the Core ML model the sidecar lists (.mlmodel first: one file), read back from it."""
    entries = {a.get("format"): a for a in sidecar.get("artifacts", [])  # the uncompressed file of each format
               if a.get("compression", rundir.UNCOMPRESSED) == rundir.UNCOMPRESSED}
    for fmt in ("mlmodel", "mlpackage"):
        entry = entries.get(fmt)
        if entry and (export_dir / entry["file"]).exists():
            import coremltools as ct

            spec = ct.utils.load_spec(str(export_dir / entry["file"]))
            return {"file": entry["file"], "user_defined_metadata": dict(spec.description.metadata.userDefined),
                    "input_names": [i.name for i in spec.description.input],
                    "output_names": [o.name for o in spec.description.output]}
    raise PipelineError(f"{export_dir} has no Core ML model listed in encoder.json: run `pipeline export --to coreml`")


def _pick(labels: np.ndarray, candidates: list[int], per_class: int, num_classes: int) -> list[int]:
    """Up to per_class indices of each class, in order, round-robin over classes (so any prefix mixes classes)."""
    by_class = [[i for i in candidates if labels[i] == c][:per_class] for c in range(num_classes)]
    return [col[r] for r in range(per_class) for col in by_class if r < len(col)]


def checked_export(run_dir: Path) -> tuple[dict, str]:
    """(export/encoder.json, export/encoder.pt's sha256): the sidecar must come from the encoder beside it."""
    sidecar_path, enc = run_dir / rundir.EXPORT / rundir.SIDECAR, rundir.encoder_path(run_dir)
    if not (sidecar_path.is_file() and enc.is_file()):  # `pipeline export` makes both (it runs strip itself)
        raise PipelineError(f"nothing exported yet (no {sidecar_path if enc.is_file() else enc}): run "
                            f"`pipeline export --run {run_dir} --to coreml` first")
    sidecar = rundir.load_json(sidecar_path, "export sidecar")
    encoder_sha = rundir.file_sha256(enc)
    if sidecar.get("encoder_sha256") != encoder_sha:
        raise PipelineError(f"{sidecar_path} was made from another encoder.pt: run `pipeline export` again")
    return sidecar, encoder_sha


def query_cases(images: np.ndarray, query_idx: list[int], size: int, data, labels: np.ndarray):
    """(cases, raw pixel blob, the pipeline's crops): each val image as an app would hand it over in one of CASES'
    sizes, layouts, orientations and alpha modes."""
    cases, raw_blob, crops = [], bytearray(), []
    for n, (i, (w, h, orient, layout, alpha)) in enumerate(zip(query_idx, CASES)):
        w, h = _side(w, size), _side(h, size)
        pixels = _photo(images[i], w, h, alpha, n)
        if layout == "gray":
            pixels = pixels[..., 0]
        elif LAYOUT_MODES[layout] == "RGBA" and pixels.shape[-1] == 3:  # a 32-bit buffer of an opaque image
            pixels = np.concatenate([pixels, np.full((h, w, 1), 255, np.uint8)], -1)
        raw = to_layout(pixels, layout)
        crops.append(pipeline_crop(raw, w, h, layout, orient, size))
        cases.append({"id": n, "source": data.sources[i], "label": int(labels[i]), "width": w, "height": h,
                      "layout": layout, "orientation": orient, "alpha": alpha, "raw_offset": len(raw_blob),
                      "raw_bytes": len(raw)})
        raw_blob += raw
    return cases, raw_blob, crops


def write_files(files: dict[str, bytes], out_dir: Path, max_bytes: int) -> int:
    """Every file atomically, within max_bytes in all (they are committed); the total written."""
    total = sum(len(b) for b in files.values())
    if total > max_bytes:
        parts = ", ".join(f"{name} {len(blob):,}" for name, blob in sorted(files.items(), key=lambda kv: -len(kv[1]))[:3])
        raise PipelineError(f"the fixtures would take {total:,} bytes ({parts}) > --max-bytes {max_bytes:,}: lower "
                            f"--bank-per-class, or raise --max-bytes (large models at large image sizes need more)")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, blob in files.items():  # manifest.json last: it names the others
        with rundir.atomic_path(out_dir / name) as tmp:
            tmp.write_bytes(blob)
    return total


def run(cfg: SwiftFixturesConfig, run_dir: Path, say=print) -> Path:
    out_dir = Path(cfg.out) if cfg.out else FIXTURES_DIR
    if cfg.bank_per_class < 1:
        raise PipelineError(f"--bank-per-class must be >= 1, got {cfg.bank_per_class}")
    sidecar, encoder_sha = checked_export(run_dir)
    encoder, state = load_encoder(rundir.encoder_path(run_dir))
    model_meta = _model_metadata(run_dir / rundir.EXPORT, sidecar)
    size = int(state["image_size"])
    spec = rundir.load_json(run_dir / rundir.SPLIT, "split")
    data = load_data(spec["spec"], size, int(spec.get("seed", 0)))
    if data.labels is None:
        raise PipelineError(f"{spec['spec']} has no labels: the kNN fixtures need a labelled run")
    labels, classes = data.labels.numpy(), list(data.classes)
    bank_idx = _pick(labels, list(spec["train"]), cfg.bank_per_class, len(classes))
    query_idx = _pick(labels, list(spec["val"]), len(CASES), len(classes))[: len(CASES)]
    if len(query_idx) < len(CASES):
        raise PipelineError(f"the run has {len(query_idx)} val images; the fixtures need {len(CASES)}")

    images = data.images.permute(0, 2, 3, 1).numpy()  # N x S x S x 3 uint8
    bank_crops = [pipeline_crop(to_layout(images[i], "rgb"), size, size, "rgb", 1, size) for i in bank_idx]
    cases, raw_blob, crops = query_cases(images, query_idx, size, data, labels)
    with torch.no_grad():
        embed = lambda arr: encoder(torch.from_numpy(np.stack(arr)).permute(0, 3, 1, 2).float()).numpy()  # noqa: E731
        bank, queries = embed(bank_crops).astype("<f4"), embed(crops).astype("<f4")

    variants = parity_variants(queries)
    manifest = {
        "format_version": FORMAT_VERSION, "generator": f"pipeline swift-fixtures {__version__}",
        "run_id": sidecar.get("run_id"), "image_size": size, "embedding_dim": int(bank.shape[1]),
        "encoder_sha256": encoder_sha, "classes": classes, "crop": "ImageOps.fit BICUBIC (train/data.py decode_image)",
        "pillow_version": PIL.__version__,  # Pillow 13 changed the resample's pass order for tall images
        "bank": [{"id": j, "source": data.sources[i], "label": int(labels[i])} for j, i in enumerate(bank_idx)],
        "queries": cases,
        "expected": expectations(bank, [int(labels[i]) for i in bank_idx], queries, len(classes)),
        "parity": parity_expectations(queries, variants),
    }
    files = {
        "raw.u8": bytes(raw_blob), "crops.u8": np.stack(crops).tobytes(),
        "embeddings.f32": np.concatenate([bank, queries]).tobytes(),
        **{f"parity_{name}.f32": v.astype("<f4").tobytes() for name, v in variants.items()},
        "encoder.json": (json.dumps(sidecar, indent=2) + "\n").encode(),
        "model_metadata.json": (json.dumps(model_meta, indent=2, sort_keys=True) + "\n").encode(),
        "manifest.json": (json.dumps(manifest, indent=1) + "\n").encode(),
    }
    total = write_files(files, out_dir, cfg.max_bytes)
    say(f"wrote {len(files)} files ({total / 1e3:.0f} kB) to {out_dir}: {len(bank_idx)} bank rows, {len(cases)} queries, "
        f"{size}px, {bank.shape[1]}-d, encoder {encoder_sha[:12]}")
    return out_dir


# ---------------------------------------------------------------- are committed fixtures current?

def _close(a, b, rtol: float = 1e-5, atol: float = 1e-9) -> bool:
    """Equal structure, equal ints and labels, floats within rtol: the tolerance `swift test` holds Swift to, and
    room for another BLAS's summation order (exp(sim / 0.1) turns 1e-7 in a cosine into 1e-6 in a score)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rtol, atol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rtol, atol) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(a - b) <= atol + rtol * abs(b)
    return a == b


def stale_reasons(folder: Path = FIXTURES_DIR) -> list[str]:
    """Why fixtures written earlier no longer match what the pipeline's current code makes of their own inputs (the
    raw buffers, the committed embeddings): one line each; empty when they are current. Needs no run and no model."""
    m = json.loads((folder / "manifest.json").read_text())
    if m.get("format_version") != FORMAT_VERSION:
        return [f"format_version {m.get('format_version')} != {FORMAT_VERSION}"]
    reasons, size, dim = [], m["image_size"], m["embedding_dim"]
    raw, crops = (folder / "raw.u8").read_bytes(), (folder / "crops.u8").read_bytes()
    for i, q in enumerate(m["queries"]):
        crop = pipeline_crop(raw[q["raw_offset"]: q["raw_offset"] + q["raw_bytes"]], q["width"], q["height"], q["layout"],
                             q["orientation"], size)
        if crop.tobytes() != crops[i * size * size * 3: (i + 1) * size * size * 3]:
            reasons.append(f"query {i}: decode_image now makes another crop of its raw pixels")
    rows = np.frombuffer((folder / "embeddings.f32").read_bytes(), dtype="<f4").reshape(-1, dim)
    bank, queries = rows[: len(m["bank"])].copy(), rows[len(m["bank"]):].copy()
    exp = expectations(bank, [b["label"] for b in m["bank"]], queries, len(m["classes"]), m["expected"]["centroid_threshold"])
    for key in ("weighted_k", "temperature", "majority_k"):
        if exp[key] != m["expected"][key]:
            reasons.append(f"{key}: train/knn.py now uses {exp[key]}, the fixtures {m['expected'][key]}")
    for i, (got, want) in enumerate(zip(exp["queries"], m["expected"]["queries"])):
        if not _close(got, want):
            reasons.append(f"query {i}: kNN / majority / centroid / top-{TOP_N} expectations changed")
    variants = {name: np.frombuffer((folder / f"parity_{name}.f32").read_bytes(), dtype="<f4").reshape(-1, dim)
                for name in m["parity"]["variants"]}
    if not _close(parity_expectations(queries, variants), m["parity"]):
        reasons.append("parity metrics or gates (export/parity.py, validate's defaults) changed")
    sidecar = json.loads((folder / "encoder.json").read_text())
    model = json.loads((folder / "model_metadata.json").read_text())["user_defined_metadata"]
    if not sidecar.get("encoder_sha256") == model.get("encoder_sha256") == m["encoder_sha256"]:
        reasons.append("encoder.json, model_metadata.json and manifest.json name different encoders")
    return reasons
