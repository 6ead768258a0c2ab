"""What a data SPEC names, checked without decoding its images or importing torch.

Torch-free on purpose: a missing, empty or image-less folder is the most common bad input, and torch alone takes
seconds to import, so the CLI calls `check_spec` before any stage (and torch) loads and the error comes at once,
before a run folder exists. train/data.py reads the same files through `folder_files` and decodes them, and holds
out each class's share by `split_counts`: the job service counts an upload with both.
"""

from __future__ import annotations

from pathlib import Path

from core.errors import PipelineError

SPEC_KINDS = ("digits", "photos", "folder", "cifar10", "cifar100", "synthetic")
NO_ARGUMENT = ("digits", "photos")  # the sets that ship inside the dependencies
SHOWN = 3  # skipped files a one-line message names; the rest are counted (the run folder's skipped.txt lists all)
PUT_IMAGES = "any format Pillow reads: JPEG, PNG, ..."


def parse_spec(spec: str) -> tuple[str, str]:
    kind, _, arg = spec.partition(":")
    if kind not in SPEC_KINDS:
        raise PipelineError(f"unknown data SPEC {spec!r}: use photos, digits, folder:PATH, cifar10:PATH, cifar100:PATH or "
                            "synthetic:N")
    if kind in NO_ARGUMENT and arg:
        raise PipelineError(f"data SPEC `{kind}` takes no argument, got {spec!r}")
    if kind not in NO_ARGUMENT and not arg:
        raise PipelineError(f"data SPEC {spec!r} needs an argument, e.g. {kind}:{'N' if kind == 'synthetic' else 'PATH'}")
    return kind, arg


def synthetic_count(arg: str) -> int:
    try:
        n = int(arg)
    except ValueError:
        raise PipelineError(f"synthetic:N needs an integer N, got {arg!r}") from None
    if n <= 0:
        raise PipelineError(f"synthetic:N needs N > 0, got {n}")
    return n


def cifar_root(kind: str, root: Path) -> Path:
    """The folder holding the python-pickle batches (`root` itself or its cifar-10-batches-py / cifar-100-python)."""
    if not root.exists():
        raise PipelineError(f"{kind} path does not exist: {root}")
    inner = root / ("cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python")
    root = inner if inner.is_dir() else root
    missing = [f for f in cifar_files(kind) if not (root / f).is_file()]
    if missing:
        raise PipelineError(f"{root} is not a {kind} python-pickle folder: missing {', '.join(missing)}")
    return root


def cifar_files(kind: str) -> list[str]:
    if kind == "cifar10":
        return [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]
    return ["train", "test", "meta"]


def _visible_files(folder: Path, recursive: bool) -> list[Path]:
    found = folder.rglob("*") if recursive else folder.iterdir()
    return sorted(p for p in found if p.is_file() and not p.name.startswith("."))


def folder_files(root: Path) -> tuple[list[str], list[Path], list[int] | None, list[tuple[str, str]]]:
    """(classes, files, their class index or None for a flat folder, files skipped with why). A folder with
    subfolders is labelled, one class per subfolder (files directly in it are skipped); else every file is one
    unlabelled image. Hidden files and folders (.DS_Store, .git) are never images."""
    if not root.exists():
        raise PipelineError(f"folder does not exist: {root}")
    if not root.is_dir():
        raise PipelineError(f"folder:PATH must be a directory, got file {root}")
    class_dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not class_dirs:
        return [], _visible_files(root, False), None, []
    files, labels = [], []
    for ci, d in enumerate(class_dirs):
        inside = _visible_files(d, True)
        files += inside
        labels += [ci] * len(inside)
    skipped = [(str(f), "not inside a class folder") for f in _visible_files(root, False)]
    return [d.name for d in class_dirs], files, labels, skipped


def split_counts(per_class: list[int], val_fraction: float) -> tuple[list[int], list[int]]:
    """(train, val) images per class as make_split holds them out: each class its own round(n x val_fraction), so
    every class is in both halves. The job service counts an upload's split with this too, before it decodes a
    pixel (pipeline/serve/checks.py), so the two can never disagree."""
    val = [int(round(n * val_fraction)) for n in per_class]
    return [n - v for n, v in zip(per_class, val)], val


def image_header_error(path: Path) -> str | None:
    """Why Pillow cannot open `path` as an image (it reads the header only, not the pixels), or None."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):
            return None
    except UnidentifiedImageError:
        return "not an image Pillow reads"
    except Exception as e:  # PIL raises many types for damaged headers; an unreadable file raises OSError
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def named(skipped: list[tuple[str, str]], root: Path | None = None) -> str:
    """The first SHOWN skipped files with why, for a one-line message: 'a.txt (why), b.json (why) and 4 more'."""
    def name(f: str) -> str:
        try:
            return str(Path(f).relative_to(root)) if root else f
        except ValueError:
            return f

    shown = ", ".join(f"{name(f)} ({why})" for f, why in skipped[:SHOWN])
    return shown + (f" and {len(skipped) - SHOWN} more" if len(skipped) > SHOWN else "")


def no_usable_images(spec: str, root: Path, skipped: list[tuple[str, str]]) -> PipelineError:
    return PipelineError(f"dataset {spec!r} has no usable images in {root}: {n_files(len(skipped))} skipped, "
                         f"{named(skipped, root)}; put images in it ({PUT_IMAGES}), flat or one subfolder per class")


def n_files(n: int) -> str:
    return f"{n} file{'' if n == 1 else 's'}"


def check_folder(spec: str, root: Path) -> None:
    """A folder SPEC that cannot give a single image fails here: missing, a file, empty, class folders without
    files, or no file Pillow recognises. Stops at the first file that is an image, so a good folder costs one
    header read; a truncated image is only found when decoded (train/data.py)."""
    classes, files, _, skipped = folder_files(root)
    if not files:
        what = f"its class folders ({', '.join(classes[:SHOWN])}{', ...' if len(classes) > SHOWN else ''}) hold no files" \
            if classes else "it is empty"
        raise PipelineError(f"dataset {spec!r} has no usable images in {root}: {what}; put images in it "
                            f"({PUT_IMAGES}), flat or one subfolder per class")
    if not any_image(files, skipped):
        raise no_usable_images(spec, root, skipped)


def any_image(paths, skipped: list[tuple[str, str]]) -> bool:
    """Whether one of `paths` opens as an image, reading headers up to the first that does; the files before it go
    into `skipped` with why."""
    for f in paths:
        why = image_header_error(f)
        if why is None:
            return True
        skipped.append((str(f), why))
    return False


def check_spec(spec: str) -> None:
    """Every error a SPEC can have that shows without decoding an image, in well under a second."""
    kind, arg = parse_spec(spec)
    if kind == "synthetic":
        synthetic_count(arg)
    elif kind in ("cifar10", "cifar100"):
        cifar_root(kind, Path(arg))
    elif kind == "folder":
        check_folder(spec, Path(arg))


def check_image_folder(flag: str, folder: Path) -> None:
    """validate's --images: a folder of photos, searched recursively, that must hold at least one image."""
    if not folder.is_dir():
        raise PipelineError(f"{flag} {folder}: not a directory")
    skipped = []
    if any_image((p for p in _visible_files(folder, True) if not any(part.startswith(".") for part in p.parts)),
                 skipped):
        return
    detail = f"{n_files(len(skipped))} skipped, {named(skipped, folder)}" if skipped else "it holds no files"
    raise PipelineError(f"{flag} {folder}: no readable images ({detail})")
