"""The per-image CPU augmentation path (`--augment cpu`) against torchvision's transforms on PIL images,
in one process and one run, so both see the same machine at the same time.

Paths, each making the two SimCLR views of one image (the project's recipe: RandomResizedCrop 0.08-1, flip 0.5,
colour jitter 0.8/0.8/0.8/0.2 in a random order with p 0.8, grayscale 0.2, blur p 0.5 with sigma 0.1-2 at 224 px
and off at 32 px):
- project: augment.ViewDataset, what DataLoader workers run (uint8 views; normalised per batch later);
- project float reference: the same Dataset with the float torchvision-on-tensor ops (the path `augment.apply_view` keeps as the reference);
- torchvision on PIL: lightly's SimCLR recipe written with torchvision.transforms.v2 on PIL images (PIL's
  GaussianBlur, as lightly's), ending in ToImage + ToDtype(float) + Normalize as lightly's does; and the same
  ending in PILToTensor (uint8, normalised per batch as the project's views are), its cheapest form;
- lightly: lightly.transforms.SimCLRTransform itself, when lightly is importable (blur probability set to the
  project's: 0 at 32 px).
The torchvision paths start from PIL images already in memory (free for them); the project's from its uint8
tensor store, as in training.

Per image: ms per item (two views) in the calling thread with one torch thread (as a DataLoader worker), wall
clock and thread CPU time, the paths interleaved in rotating order, median over --repeats windows.
End to end: a DataLoader with --workers workers, --batch images a batch, to normalised float batches on
--device (the project: augment.cpu_view_batches, what pretraining iterates), this process with one torch thread
as it only consumes the batches, img/s from the first batch to the
last (worker start-up excluded), and CPU ms per image of the whole epoch (this process and its workers, from
getrusage), paths interleaved, medians over --e2e-repeats.

--coreml adds the per-image path with `--preprocess coreml` (jitter's blends, grayscale and blur as Core ML models,
train/preprocess_models.py), twice: its calls run by the project's reference evaluator (export/mil_eval.py, as
the tests do off macOS: PyTorch executing the models' ops, nothing like Core ML's speed), and its calls answered
for free (the input handed back at once): what the worker's CPU still does per item with the offload on (crop,
flip and hue in float torch, the fp32 copies to and from each call), a lower bound of the offload's cost on a Mac
before Core ML itself does anything.

Usage (from the repository root): python3 benchmarks/cpu_augment_vs_torchvision.py [--sizes 32 224] [--workers 2]
[--device cpu|cuda] [--coreml] [--json FILE]. lightly without installing it into the environment: pip install --no-deps
--target DIR the wheels (lightly, lightly-utils, lightning-utilities, hydra-core, omegaconf,
antlr4-python3-runtime, aenum) and put DIR on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's stages/, whatever is installed

import numpy as np  # noqa: E402
import PIL  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
import torchvision.transforms.v2 as T  # noqa: E402
from PIL import Image, ImageFilter  # noqa: E402

from train import augment, preprocess  # noqa: E402


class PilGaussianBlur:
    """lightly's GaussianBlur: with probability p, PIL's GaussianBlur with a radius (= sigma) uniform in sigmas."""

    def __init__(self, p: float, sigmas: tuple[float, float]):
        self.p, self.sigmas = p, sigmas

    def __call__(self, im: Image.Image) -> Image.Image:
        if np.random.random_sample() < self.p:
            im = im.filter(ImageFilter.GaussianBlur(radius=np.random.uniform(*self.sigmas)))
        return im


def torchvision_recipe(r: augment.ViewRecipe, size: int, uint8: bool) -> T.Compose:
    ops = [T.RandomResizedCrop(size, scale=r.crop_scale, ratio=r.crop_ratio, antialias=True),
           T.RandomHorizontalFlip(r.flip_p),
           T.RandomApply([T.ColorJitter(r.brightness, r.contrast, r.saturation, r.hue)], p=r.jitter_p),
           T.RandomGrayscale(r.gray_p),
           PilGaussianBlur(r.blur_p, r.blur_sigma)]
    if uint8:
        return T.Compose([*ops, T.PILToTensor()])
    return T.Compose([*ops, T.ToImage(), T.ToDtype(torch.float32, scale=True), T.Normalize(augment.MEAN, augment.STD)])


def lightly_transform(size: int, blur_p: float):
    try:
        from lightly.transforms import SimCLRTransform
    except ImportError:
        return None
    return SimCLRTransform(input_size=size, gaussian_blur=blur_p)


class PilTwoViews(torch.utils.data.Dataset):
    """The torchvision-style Dataset: item i -> the transform applied twice to PIL image i."""

    def __init__(self, images: list, transform, multi_view: bool = False):
        self.images, self.transform, self.multi_view = images, transform, multi_view

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int):
        if self.multi_view:  # lightly's MultiViewTransform: one call, a list of views
            return tuple(self.transform(self.images[i]))
        return self.transform(self.images[i]), self.transform(self.images[i])


class CoreMLStandIn:
    """core.coreml_runtime's load and predict for the Core ML backend off macOS: `evaluator` runs each model's
    program with the reference evaluator (as tests/train/test_preprocess.py does); `free` hands the image back."""

    def __init__(self, how: str):
        self.how = how

    def __enter__(self):
        from core import coreml_runtime
        from export import mil_eval

        self.saved = {k: getattr(coreml_runtime, k) for k in ("coreml_can_predict", "coreml_load", "coreml_predict_arrays")}
        coreml_runtime.coreml_can_predict = lambda: (True, "")
        if self.how == "evaluator":
            coreml_runtime.coreml_load = lambda path, units: mil_eval.load_mlpackage(path)
            coreml_runtime.coreml_predict_arrays = lambda model, feeds, output: mil_eval.run_program(
                model, {k: torch.from_numpy(v) for k, v in feeds.items()})[output].numpy()
        else:
            coreml_runtime.coreml_load = lambda path, units: path
            coreml_runtime.coreml_predict_arrays = lambda model, feeds, output: feeds["image"]
        return self

    def __exit__(self, *exc):
        from core import coreml_runtime

        for k, v in self.saved.items():
            setattr(coreml_runtime, k, v)


def coreml_paths(images: torch.Tensor, recipes, size: int, args) -> dict:
    """Per-item fns of the --preprocess coreml path, each run inside its stand-in; each has its own backend, as
    each keeps the models it loaded (the evaluator's programs, or nothing)."""
    fns = {}
    for how, label in (("evaluator", "project, --preprocess coreml (calls by the reference evaluator)"),
                       ("free", "project, --preprocess coreml (calls free: the worker's CPU share)")):
        backend = preprocess.CoreMLPreprocess(size, args.coreml_cache or None)  # builds (or finds) the models
        ds = augment.ViewDataset(images, recipes, size, seed=0, epoch=0, preprocess=backend)

        def item(i: int, ds=ds, how=how):
            with CoreMLStandIn(how):
                return ds[i]
        fns[label] = item
    return fns


def per_image(fns: dict, items: dict, repeats: int) -> dict:
    """ms per item (wall, thread CPU) of each fn over its items, interleaved; medians over repeats."""
    wall = {k: [] for k in fns}
    cpu = {k: [] for k in fns}
    names = list(fns)
    for name in names:  # warm-up: first calls build caches and tables
        for i in range(min(3, items[name])):
            fns[name](i)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            n = items[name]
            t0, c0 = time.perf_counter(), time.thread_time()
            for i in range(n):
                fns[name](i)
            wall[name].append(1000 * (time.perf_counter() - t0) / n)
            cpu[name].append(1000 * (time.thread_time() - c0) / n)
    return {k: {"wall_ms": round(statistics.median(wall[k]), 4), "cpu_ms": round(statistics.median(cpu[k]), 4),
                "items": items[k], "wall_windows": [round(v, 4) for v in wall[k]]} for k in fns}


def _cpu_s(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def loader_rate(batches, batch: int, device: torch.device) -> tuple[float, float]:
    """(img/s from the first batch to the last, CPU ms per image of the whole epoch): the CPU time of this process
    and of its DataLoader workers (joined when the epoch ends, so counted as finished children), start-up included.
    The CPU figure is what the other sessions' load on a shared machine disturbs least."""
    cpu0 = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN)
    it = iter(batches)
    next(it)  # worker start-up and the first batch: not timed
    t0, n = time.perf_counter(), 0
    for x1, x2 in it:
        n += batch
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    rate = n / (time.perf_counter() - t0)
    cpu = _cpu_s(resource.RUSAGE_SELF) + _cpu_s(resource.RUSAGE_CHILDREN) - cpu0
    return rate, 1000 * cpu / (n + batch)


def end_to_end(makers: dict, batch: int, device: torch.device, repeats: int) -> dict:
    rates = {k: [] for k in makers}
    cpu = {k: [] for k in makers}
    names = list(makers)
    for r in range(repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:
            rate, ms = loader_rate(makers[name](r), batch, device)
            rates[name].append(rate)
            cpu[name].append(ms)
    return {k: {"img_s": round(statistics.median(v), 1), "windows": [round(x, 1) for x in v],
                "cpu_ms_per_img": round(statistics.median(cpu[k]), 3)} for k, v in rates.items()}


def run_size(size: int, args, device: torch.device) -> dict:
    store = size if size <= 64 else round(size * 8 / 7)  # as `pipeline bench`: ImageNet-like stores are 8/7 of the crop
    recipes = augment.recipes_for("simclr", size)
    n = max(args.items(size), args.e2e_images(size))
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, store, store), dtype=torch.uint8, generator=g)
    pils = [Image.fromarray(im.permute(1, 2, 0).numpy()) for im in images]
    tv_float = torchvision_recipe(recipes[0], size, uint8=False)
    tv_uint8 = torchvision_recipe(recipes[0], size, uint8=True)
    light = lightly_transform(size, recipes[0].blur_p)
    project = augment.ViewDataset(images, recipes, size, seed=0, epoch=0)
    reference = augment.ViewDataset(images, recipes, size, seed=0, epoch=0, preprocess=preprocess.TORCH_PREPROCESS)
    fns = {
        "project": project.__getitem__,
        "project float reference (before)": reference.__getitem__,
        "torchvision on PIL (lightly's recipe)": lambda i: (tv_float(pils[i]), tv_float(pils[i])),
        "torchvision on PIL, uint8 out": lambda i: (tv_uint8(pils[i]), tv_uint8(pils[i])),
    }
    if light is not None:
        fns["lightly SimCLRTransform"] = lambda i: light(pils[i])
    if args.coreml:
        fns.update(coreml_paths(images, recipes, size, args))
    items = {k: args.items(size) for k in fns}
    for slow in ("project float reference (before)", "project, --preprocess coreml (calls by the reference evaluator)"):
        if slow in items:
            items[slow] = max(4, args.items(size) // args.reference_share)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    np.random.seed(0)
    try:
        per = per_image(fns, items, args.repeats)
    finally:
        torch.set_num_threads(threads)

    batch, total = args.batch(size), args.e2e_images(size)
    ep_images = images[:total]
    cuda = device.type == "cuda"

    def torchvision_loader(transform, multi_view: bool, normalise: bool):
        def make(r: int):
            loader = torch.utils.data.DataLoader(
                PilTwoViews(pils[:total], transform, multi_view), batch_size=batch, shuffle=True, drop_last=True,
                num_workers=args.workers, pin_memory=cuda, prefetch_factor=4 if args.workers else None,
                generator=torch.Generator().manual_seed(r))
            for v1, v2 in loader:
                if normalise:  # uint8 views: normalised per batch in the main process, as the project's
                    yield augment.normalize(v1, device), augment.normalize(v2, device)
                else:
                    yield v1.to(device, non_blocking=True), v2.to(device, non_blocking=True)
        return make

    makers = {
        "project": lambda r: augment.cpu_view_batches(ep_images, recipes, size, batch, 0, r, 0, device, args.workers),
        "torchvision on PIL (lightly's recipe)": torchvision_loader(tv_float, False, False),
        "torchvision on PIL, uint8 out": torchvision_loader(tv_uint8, False, True),
    }
    if light is not None:
        makers["lightly SimCLRTransform"] = torchvision_loader(light, True, False)
    torch.set_num_threads(1)  # this process only consumes batches here: more intra-op threads would spin on the
    try:                      # project's per-batch normalise (20 x its CPU on 2 busy cores) and rob the workers
        e2e = end_to_end(makers, batch, device, args.e2e_repeats) if args.e2e_repeats else {}
    finally:
        torch.set_num_threads(threads)
    return {"size": size, "store": store, "blur_p": recipes[0].blur_p, "per_image": per, "e2e": e2e,
            "e2e_setup": {"workers": args.workers, "batch": batch, "images": total, "device": str(device)}}


def report(results: list[dict], env: dict) -> str:
    lines = [f"per-image SimCLR views, {env['platform']}, {env['cpus']} CPUs, torch {env['torch']}, torchvision "
             f"{env['torchvision']}, Pillow {env['pillow']}, lightly {env['lightly']}; load average "
             f"{env['load_before']} before, {env['load_after']} after"]
    for r in results:
        base = r["per_image"]["torchvision on PIL (lightly's recipe)"]["wall_ms"]
        lines += ["", f"{r['size']} px views from {r['store']} px (blur p {r['blur_p']}): per item (two views), one torch "
                      "thread, median of the windows",
                  "| path | wall ms/item | CPU ms/item | lightly's recipe / path (wall) |", "| --- | ---: | ---: | ---: |"]
        for name, v in r["per_image"].items():
            lines.append(f"| {name} | {v['wall_ms']:.3f} | {v['cpu_ms']:.3f} | {base / v['wall_ms']:.2f} x |")
        if r["e2e"]:
            s = r["e2e_setup"]
            base = r["e2e"]["torchvision on PIL (lightly's recipe)"]["img_s"]
            lines += ["", f"{r['size']} px end to end: {s['workers']} DataLoader workers, batch {s['batch']}, "
                          f"{s['images']} images an epoch, normalised batches on {s['device']}, median img/s",
                      "| path | img/s | windows | path / lightly's recipe | CPU ms/img (workers + main) |",
                      "| --- | ---: | --- | ---: | ---: |"]
            for name, v in r["e2e"].items():
                lines.append(f"| {name} | {v['img_s']:,.0f} | {', '.join(f'{x:,.0f}' for x in v['windows'])} | "
                             f"{v['img_s'] / base:.2f} x | {v['cpu_ms_per_img']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 224])
    ap.add_argument("--repeats", type=int, default=7, help="per-image windows per path")
    ap.add_argument("--items-small", type=int, default=256, help="items a per-image window at <= 64 px")
    ap.add_argument("--items-large", type=int, default=32, help="items a per-image window above 64 px")
    ap.add_argument("--reference-share", type=int, default=1,
                    help="the slow paths (float reference, evaluator) time 1/this of the items (fewer items: the "
                         "float blur's cost varies with sigma, so a few items give a biased figure)")
    ap.add_argument("--workers", type=int, default=2, help="DataLoader workers, the same for every path")
    ap.add_argument("--e2e-repeats", type=int, default=3, help="end-to-end epochs per path (0: skip)")
    ap.add_argument("--e2e-small", type=int, default=2048, help="images an end-to-end epoch at <= 64 px")
    ap.add_argument("--e2e-large", type=int, default=256, help="images an end-to-end epoch above 64 px")
    ap.add_argument("--batch-small", type=int, default=256)
    ap.add_argument("--batch-large", type=int, default=32)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--coreml", action="store_true", help="also time the --preprocess coreml path (see above)")
    ap.add_argument("--coreml-cache", default="", help="where its models are built; default: the project's cache")
    ap.add_argument("--json", default="", help="also write the results here")
    args = ap.parse_args()
    args.items = lambda s: args.items_small if s <= 64 else args.items_large
    args.e2e_images = lambda s: args.e2e_small if s <= 64 else args.e2e_large
    args.batch = lambda s: args.batch_small if s <= 64 else args.batch_large
    try:
        import lightly
        lightly_version = lightly.__version__
    except ImportError:
        lightly_version = "not importable"
    env = {"platform": f"{platform.system()} {platform.machine()}", "cpus": os.cpu_count(), "torch": torch.__version__,
           "torchvision": torchvision.__version__, "pillow": PIL.__version__, "lightly": lightly_version,
           "load_before": round(os.getloadavg()[0], 1), "argv": sys.argv[1:]}
    device = torch.device(args.device)
    results = []
    for s in args.sizes:
        print(f"timing {s} px ...", file=sys.stderr, flush=True)
        results.append(run_size(s, args, device))
    env["load_after"] = round(os.getloadavg()[0], 1)
    print(report(results, env))
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "results": results}, indent=1))


if __name__ == "__main__":
    main()
