"""Report stage: RUN/report.html, one self-contained page that shows a run instead of listing its JSON files.

Reads only the run directory (config.yaml, split.json, metrics.jsonl, checkpoints/last.pt for the device and wall
time in its meta, eval/linear.json and the features linear-eval cached beside it, export/encoder.json,
validate/parity.json) and the run's own images through train.data. A stage whose files are missing gets one line,
"not run yet: `pipeline ...`", in place of its section; the page is written whatever is missing.

The page is HTML with inline CSS and every picture an inline PNG (a data: URI): no JavaScript, no file or network
reference, so it opens offline, from disk, attached to a mail.

Template: the standard library's string.Template, not Jinja2. The page is one fixed skeleton; every loop and
condition lives in the Python section functions below, so the template only substitutes, and the project gains no
dependency for it. Escaping is explicit: every cell goes through `table`, which escapes anything not marked Raw.
"""

from __future__ import annotations

import base64
import datetime
import html
import json
import shlex
import statistics
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from export.formats import minimum_os
from export.targets import ipados
from core import rundir
from core.rundir import FEATURES, LINEAR_EVAL, PARITY, SIDECAR
from core.config import opt
from core.errors import PipelineError
from core import provenance
from train import verdict
from train.methods import METHODS

# numpy, torch, sklearn and matplotlib are imported where used: `pipeline --help` imports this module for
# ReportConfig's flags and should stay instant.
if TYPE_CHECKING:
    import numpy as np
THUMB_SIDE = 96  # larger images are shrunk to this in the grids: a grid of 88 photos stays a few hundred KB
SOURCE_SIDE = 192  # the worst parity image's source file is shown up to this size


@dataclass
class ReportConfig:
    queries: int = opt(8, "validation images in the retrieval grid: one screen, a different class each where possible")
    neighbours: int = opt(5, "training neighbours shown per query and backbone (the top-5 an app would retrieve)")
    tsne_max: int = opt(2000, "t-SNE only up to this many val images (PCA always): it costs ~10 s per 2,000 on a CPU")
    map_max: int = opt(5000, "embedding maps show at most this many val images (an even sample): more only blurs")
    seed: int = opt(0, "which val images the retrieval grid shows, and t-SNE's start")


class NotRun(Exception):
    """A section's input files are missing: the message is the command that makes them."""


class Raw(str):
    """HTML made here (a tag, an image): placed as is; every other cell is escaped."""


def esc(value: Any) -> str:
    return html.escape(str(value), quote=True)


def table(head: list[str], rows: list[list[Any]], cls: str = "") -> str:
    def cell(tag: str, v: Any) -> str:
        return f"<{tag}>{v if isinstance(v, Raw) else esc(v)}</{tag}>"

    out = [f'<table class="{cls}">' if cls else "<table>", "<tr>" + "".join(cell("th", h) for h in head) + "</tr>"]
    out += ["<tr>" + "".join(cell("td", v) for v in r) + "</tr>" for r in rows]
    return "\n".join(out + ["</table>"])


def img(png: bytes, alt: str, cls: str = "", title: str = "") -> Raw:
    data = base64.b64encode(png).decode("ascii")
    attrs = f' class="{cls}"' if cls else ""
    attrs += f' title="{esc(title)}"' if title else ""
    return Raw(f'<img src="data:image/png;base64,{data}" alt="{esc(alt)}"{attrs}>')


def pct(v: float | None, sign: str = "") -> str:
    return "n/a" if v is None else f"{100 * v:{sign}.1f}"


def mean_std(m: float | None, s: float | None, sign: str = "") -> str:
    return "n/a" if m is None or s is None else f"{100 * m:{sign}.1f} ± {100 * s:.1f}"


def size_text(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def duration(s: float) -> str:
    s = round(s)
    if s < 60:
        return f"{s} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min" if s >= 3600 else f"{s // 60} min {s % 60:02d} s"


# ---------------------------------------------------------------- what the run directory holds

@dataclass
class Run:
    """The run directory's files, each read once and only when a section asks."""
    dir: Path
    cfg: ReportConfig
    say: Callable = print
    _cache: dict = field(default_factory=dict)

    def cmd(self, *args: str) -> str:
        return shlex.join(["pipeline", *args[:1], "--run" if args[0] != "pretrain" else "--out", str(self.dir), *args[1:]])

    def _once(self, key: str, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def json(self, rel: str, what: str, missing: str) -> Any:
        path = self.dir / rel
        if not path.is_file():
            raise NotRun(missing)
        return self._once(rel, lambda: rundir.load_json(path, what))

    def config(self) -> dict:
        import yaml

        path = self.dir / rundir.CONFIG
        if not path.is_file():
            raise NotRun(self.cmd("pretrain"))

        def read():
            text = path.read_text()
            cfg = yaml.safe_load(text)
            if not isinstance(cfg, dict):
                raise PipelineError(f"{path} is not a config written by `pipeline pretrain`")
            header = [line[1:].strip() for line in text.splitlines() if line.startswith("#")]
            return {"values": cfg, "header": header, "text": text}

        return self._once("config", read)

    def split(self) -> dict:
        return self.json(rundir.SPLIT, "split", self.cmd("pretrain"))

    def metrics(self) -> list[dict]:
        path = self.dir / rundir.METRICS
        if not path.is_file():
            raise NotRun(self.cmd("pretrain"))

        def read():
            records = []
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash; the ones before it are intact
                    continue
                if isinstance(rec, dict) and isinstance(rec.get("step"), int):
                    records.append(rec)
            return records

        return self._once("metrics", read)

    def checkpoint_meta(self) -> dict | None:
        """step, epochs_done and meta of checkpoints/last.pt (device and wall time are recorded there), or None."""
        path = self.dir / rundir.LAST_CHECKPOINT
        if not path.is_file():
            return None

        def read():
            ckpt = rundir.load_checkpoint(path, mmap=True)  # the weights are never read, only the step and meta
            return {"step": ckpt.get(rundir.CKPT_STEP), "epochs_done": ckpt.get(rundir.CKPT_EPOCHS_DONE), **(ckpt.get(rundir.CKPT_META) or {})}

        return self._once("checkpoint", read)

    def linear(self) -> dict:
        return self.json(f"{rundir.EVAL}/{LINEAR_EVAL}", "linear-eval result", self.cmd("linear-eval"))

    def features(self) -> dict[str, tuple]:
        """{pretrained|random: (train N x D, val M x D)} as linear-eval cached them, checked to be the features of
        the weights eval/linear.json measured (a cache from another checkpoint would draw the wrong neighbours)."""
        import torch

        result = self.linear()
        expected = {"pretrained": result["checkpoint"]["weights_sha256"], "random": result["baseline_init"]["weights_sha256"]}

        def read():
            out = {}
            for which, name in FEATURES.items():
                path = self.dir / rundir.EVAL / name
                if not path.is_file():
                    raise NotRun(self.cmd("linear-eval"))
                cached = torch.load(path, map_location="cpu", weights_only=True)
                if cached.get("key", {}).get("weights_sha256") != expected[which]:
                    raise NotRun(self.cmd("linear-eval") + f"  (eval/{name} is from other weights than eval/{LINEAR_EVAL})")
                out[which] = (cached["train"].float().numpy(), cached["val"].float().numpy())
            return out

        return self._once("features", read)

    def data(self):
        """The run's labelled images (train.data), checked against split.json's sources."""
        from train.data import load_data
        from train.runspec import read_run, recorded_split, store_size_for

        def read():
            self.config(), self.split()  # a missing config.yaml or split.json says which command makes it
            cfg = read_run(self.dir)
            data = load_data(cfg.data, store_size_for(cfg), seed=cfg.seed)
            recorded_split(self.dir, data)  # refuses images that changed since the run
            return data

        return self._once("data", read)

    def views(self, indices) -> np.ndarray:
        """Images at the model's view (center crop at image_size, as evaluation and validate see them), N x S x S x 3."""
        import torch

        from train.augment import center_views

        data, size = self.data(), self.config()["values"]["image_size"]
        v = center_views(data.images[torch.as_tensor(list(indices), dtype=torch.long)], size)
        return v.permute(0, 2, 3, 1).numpy()


def thumb(pixels: np.ndarray, alt: str, title: str = "", extra_cls: str = "") -> Raw:
    from stages.report_figures import image_png

    small = max(pixels.shape[:2]) < 64  # tiny images are enlarged by the browser with hard pixel edges
    return img(image_png(pixels, THUMB_SIDE), alt, " ".join(c for c in ("px" if small else "", extra_cls) if c), title)


# ---------------------------------------------------------------- sections

def run_card(run: Run) -> str:
    conf = run.config()
    c = conf["values"]
    split = run.split() if (run.dir / rundir.SPLIT).is_file() else None
    ck = run.checkpoint_meta()
    total = ck.get("total_steps") if ck else None
    steps = "no checkpoint yet" if ck is None else f"{ck['step']:,}" + (f" of {total:,}" if total else "")
    epochs = "" if ck is None else f" ({ck.get('epochs_done')} of {c.get('epochs')} epochs)"
    device = (ck or {}).get("device")
    world = (ck or {}).get("world_size", 1)
    device_text = (f"{device}" + (f" × {world} processes" if world and world > 1 else "")) if device else \
        f"not recorded by this checkpoint (asked: {c.get('device')})"
    wall = (ck or {}).get("wall_s")
    recipe = [f"{c.get('optimizer')} optimizer"] + conf["header"][:1] + [
        f"weight decay {c.get('weight_decay'):g}", f"warm-up {c.get('warmup_epochs'):g} epochs, cosine decay"]
    recipe += METHODS[c["method"]].summary(c) if c.get("method") in METHODS else []
    if c.get("pred_lr") not in (None, 1.0):  # absent from runs made before --pred-lr
        recipe.append(f"predictor lr × {c['pred_lr']:g}")
    data = f"{c.get('data')}" + (f": {len(split['train']):,} train / {len(split['val']):,} val images"
                                 f" (split seed {split.get('seed')})" if split else "")
    rows = [["method", c.get("method")], ["backbone", f"{c.get('backbone')} (small stem: {c.get('small_stem')})"],
            ["data", data], ["image size", f"{c.get('image_size')} px"], ["batch", c.get("batch_size")],
            ["steps", steps + epochs], ["wall time", duration(wall) if wall is not None else "not recorded by this checkpoint"],
            ["device", device_text], ["recipe", "; ".join(str(r) for r in recipe)], ["seed", c.get("seed")]]
    return (table(["", ""], rows, "card") + f"\n<details><summary>resolved config ({esc(rundir.CONFIG)})</summary>"
            f"<pre>{esc(conf['text'])}</pre></details>")


def training_curves(run: Run) -> str:
    from stages.report_figures import training_curves as figure

    records = run.metrics()
    steps = [r for r in records if "loss" in r]
    if not steps:
        raise NotRun(run.cmd("pretrain") + f"  ({rundir.METRICS} has no logged step yet)")
    knn = [r for r in records if "knn_top1" in r]
    summary = [["steps logged", f"{len(steps)} (step {steps[0]['step']} to {steps[-1]['step']})"],
               ["loss", f"{steps[0]['loss']:.4f} → {steps[-1]['loss']:.4f}"],
               ["img/s (median)", f"{statistics.median(r['img_s'] for r in steps):,.0f}"],
               ["data wait (median)", f"{100 * statistics.median(r['data_wait'] for r in steps):.1f} %"],
               ["kNN monitor", f"{pct(knn[0]['knn_top1'])} % → {pct(knn[-1]['knn_top1'])} % top-1 (step "
                               f"{knn[0]['step']} to {knn[-1]['step']})" if knn else
                "not logged (pretrain with --knn-every N to follow kNN top-1 during training)"]]
    return str(img(figure(records), "training curves: loss, learning rate, img/s, data wait")) + table(["", ""], summary, "card")


def evaluation(run: Run) -> str:
    from stages.report_figures import few_label_draws

    r = run.linear()
    knn = r["protocol"]["knn"]
    names = {"top1": "linear top-1", "top5": "linear top-5",
             "knn_top1": f"kNN top-1 (k={knn['k_used']}, T={knn['temperature']:g})",
             "knn_majority_top1": f"kNN top-1 (k={knn['majority_k_used']}, majority)"}
    found = {(p.few, p.key): p for p in verdict.probes(r)}
    rows = [marked([name, pct(r[k]), pct(r["baseline"][k]),
                    "n/a" if r[k] is None or r["baseline"][k] is None else f"{100 * (r[k] - r['baseline'][k]):+.1f}"],
                   found.get((False, k)))
            for k, name in names.items()]
    ck = r["checkpoint"]
    out = [table(["metric", "pretrained %", "random init %", "gain (points)", "reading"], rows, "num"),
           f"<p class=note>{r['num_train']:,} train / {r['num_val']:,} val images, {r['num_classes']} classes, "
           f"{esc(r['protocol']['data'])}; {esc(ck['method'])}/{esc(ck['backbone'])} at step {ck['step']}; the random "
           f"init is the network this run started from (same seed). Linear: {esc(r['protocol']['linear']['model'])}, "
           f"C chosen on train rows only.</p>"]
    last = newest_step(run)
    if last is not None and last != ck["step"]:
        out.append(f"<p class=warn>measured step {ck['step']}, the checkpoint is at step {last}: re-run "
                   f"<code>{esc(run.cmd('linear-eval'))}</code></p>")
    few = r.get("labels_per_class")
    if not few or "per_draw" not in few:
        out.append(unread_note(found.values()))
        out.append(f"<h3>Few labels</h3>\n<p class=missing>not run yet: <code>{esc(run.cmd('linear-eval', '--labels-per-class', '5'))}"
                   f"</code></p>")
        return "\n".join(out)
    fk = {"top1": "linear top-1", "knn_top1": f"kNN top-1 (k={few['knn_k_used']}, T={knn['temperature']:g})",
          "knn_majority_top1": f"kNN top-1 (k={few['majority_k_used']}, majority)"}
    rows = [marked([f"{name}, {few['k']}/class", mean_std(few[k], few["std"]["pretrained"][k]),
                    mean_std(few["baseline"][k], few["std"]["baseline"][k]), mean_std(few["gain"][k], few["gain_std"][k], "+")],
                   found.get((True, k)))
            for k, name in fk.items()]
    charted = [(k, name) for k, name in fk.items() if getattr(found.get((True, k)), "outcome", "") != "unreadable"]
    draws = [(name, [d[k] for d in few["per_draw"]], [d["baseline"][k] for d in few["per_draw"]]) for k, name in charted]
    out += [f"<h3>Few labels: {few['k']} per class, {few['draws']} draws</h3>",
            table(["metric", "pretrained %", "random init %", "paired gain (points)", "reading"], rows, "num"),
            f"<p class=note>mean ± std over {few['draws']} draws of {few['k']} labelled train images per class (the "
            f"same images for both backbones in each draw); the gain is the mean ± std of the per-draw differences. "
            f"Dots: each draw; squares and bars: mean ± std"
            f"{'; probes marked not read are not charted' if len(charted) < len(fk) else ''}.</p>"]
    if draws:
        out.append(str(img(few_label_draws(draws), "few-label top-1 per draw, pretrained vs random init")))
    return "\n".join(out + [unread_note(found.values())])


def marked(row: list, probe) -> list:
    """A table row of one probe, with its reading: better / level / worse, or greyed and "not read: why"."""
    if probe is None:
        return row + [""]
    if probe.outcome != "unreadable":
        return row + [Raw(f'<span title="level = a gain within ±{probe.level_within:.1f} points">{probe.outcome}</span>')]
    grey = [Raw(f'<span class="unread">{esc(v)}</span>') for v in row[1:]]
    return [row[0], *grey, Raw(f'<span class="unread-why">not read: {esc(probe.why)}</span>')]


def unread_note(found) -> str:
    """What each reason for not reading a probe means, once, below the tables."""
    reasons = sorted({p.reason for p in found if p.outcome == "unreadable"})
    return "".join(f"<p class=note><b>Not read</b> ({esc(', '.join(p.title for p in found if p.reason == why))}): "
                   f"{esc(verdict.EXPLAIN[why])}; left out of the verdict.</p>" for why in reasons)


def newest_step(run: Run) -> int | None:
    """The step of the newest training state: the last metrics.jsonl line (cheaper than opening the checkpoint)."""
    try:
        records = run.metrics()
    except NotRun:
        return None
    return records[-1]["step"] if records else None


def cosine_neighbours(bank: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Indices of each query's k most cosine-similar bank rows, most similar first (ties by index)."""
    import numpy as np

    b = bank / np.maximum(np.linalg.norm(bank, axis=1, keepdims=True), 1e-12)
    q = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    return np.argsort(-(q @ b.T), axis=1, kind="stable")[:, :k]


def pick_queries(labels: np.ndarray, n: int, seed: int) -> list[int]:
    """n val positions in a seeded order, a different class each until every class has one."""
    import numpy as np

    order = np.random.default_rng(seed).permutation(len(labels))
    picked, seen = [], set()
    for i in order:
        if labels[i] not in seen:
            picked.append(int(i))
            seen.add(labels[i])
        if len(picked) == n:
            return picked
    rest = [int(i) for i in order if int(i) not in set(picked)]
    return picked + rest[: n - len(picked)]


def labels_of(run: Run) -> tuple[np.ndarray, np.ndarray, list[str]]:
    data, split = run.data(), run.split()
    return data.labels[split["train"]].numpy(), data.labels[split["val"]].numpy(), data.classes


def retrieval(run: Run) -> str:
    feats = run.features()
    split, cfg = run.split(), run.cfg
    train_y, val_y, classes = labels_of(run)
    k = min(cfg.neighbours, len(train_y))
    nbrs = {w: cosine_neighbours(feats[w][0], feats[w][1], k) for w in feats}
    # over every val image, not only the shown ones: how often a neighbour has the query's class
    agree = {w: float((train_y[nbrs[w]] == val_y[:, None]).mean()) for w in nbrs}
    queries = pick_queries(val_y, min(cfg.queries, len(val_y)), cfg.seed)
    shown = sorted({split["val"][q] for q in queries} | {split["train"][j] for w in nbrs for q in queries for j in nbrs[w][q]})
    pics = dict(zip(shown, run.views(shown)))
    right = {w: 0 for w in nbrs}
    rows = []
    for q in queries:
        qi = split["val"][q]
        row = [Raw(f'<figure>{thumb(pics[qi], "query", split["val_sources"][q], "query")}'
                   f'<figcaption>{esc(classes[val_y[q]])}</figcaption></figure>')]
        for w in ("pretrained", "random"):
            for j in nbrs[w][q]:
                ok = train_y[j] == val_y[q]
                right[w] += int(ok)
                ti = split["train"][j]
                row.append(Raw(f'<figure class="{"ok" if ok else "bad"} {w}">'
                               f'{thumb(pics[ti], "neighbour", split["train_sources"][j])}'
                               f'<figcaption>{esc(classes[train_y[j]])} {"✓" if ok else "✗"}</figcaption></figure>'))
        rows.append(row)
    head = (f'<tr><th>val image</th><th colspan="{k}" class="pretrained">pretrained: top-{k} training neighbours</th>'
            f'<th colspan="{k}" class="random">random init: top-{k} training neighbours</th></tr>')
    body = "\n".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    n = len(queries) * k
    return (f'<table class="grid">{head}\n{body}</table>\n<p class=note>Cosine similarity of the cached features '
            f'(eval/); ✓ = the neighbour has the query\'s class. Shown: pretrained {right["pretrained"]}/{n} right, random '
            f'init {right["random"]}/{n}. Over all {len(val_y):,} val images, top-{k} neighbours with the query\'s class: '
            f'<b>pretrained {pct(agree["pretrained"])} %</b>, random init {pct(agree["random"])} %. Hover an image for '
            f'its source.</p>')


def embedding_map(run: Run) -> str:
    import numpy as np
    from sklearn.decomposition import PCA

    from stages.report_figures import embedding_maps

    feats, cfg = run.features(), run.cfg
    _, val_y, classes = labels_of(run)
    n = len(val_y)
    keep = np.arange(n) if n <= cfg.map_max else np.linspace(0, n - 1, cfg.map_max).round().astype(int)
    maps, explained = [], {}
    for w, title in (("pretrained", "pretrained"), ("random", "random init")):
        x = feats[w][1][keep].astype(np.float64)
        x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)  # the cosine geometry kNN uses
        pca = PCA(n_components=2, random_state=cfg.seed).fit(x)
        explained[w] = float(pca.explained_variance_ratio_.sum())
        maps.append((f"PCA, {title}", pca.transform(x)))
    tsne_note = (f"t-SNE left out: {len(keep):,} images is more than --tsne-max {cfg.tsne_max:,}"
                 if len(keep) > cfg.tsne_max else f"t-SNE left out: {len(keep):,} images are too few for its perplexity")
    if len(keep) <= cfg.tsne_max and len(keep) > 5:
        from sklearn.manifold import TSNE
        from threadpoolctl import threadpool_limits

        for w, title in (("pretrained", "pretrained"), ("random", "random init")):
            x = feats[w][1][keep]
            x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
            perplexity = min(30.0, (len(keep) - 1) / 3)
            # One OpenMP thread: t-SNE's gradient on a few hundred points is microseconds of work per thread, and
            # on a busy machine threads waiting for each other made each of its 1000 steps take 0.1 s.
            with threadpool_limits(limits=1):
                xy = TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=cfg.seed).fit_transform(x)
            maps.append((f"t-SNE, {title}", xy))
        tsne_note = f"t-SNE: perplexity {min(30.0, (len(keep) - 1) / 3):.1f}, seed {cfg.seed}"
    return (str(img(embedding_maps(maps, val_y[keep], classes), "embedding maps of the val images")) +
            f"\n<p class=note>{len(keep):,} val embeddings (L2-normalised), coloured by class. PCA: the two components "
            f"explain <b>{pct(explained['pretrained'])} %</b> of the variance (pretrained) and {pct(explained['random'])} % "
            f"(random init). {esc(tsne_note)}.</p>")


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def parity(run: Run) -> str:
    from stages.report_figures import parity_histograms

    p = run.json(f"{rundir.VALIDATE}/{PARITY}", "parity result", run.cmd("validate"))
    g = p["config"]
    k = max((r.get("top_k") or 0 for r in p["rows"]), default=0)
    rows = [[r["artifact"], r["runtime"], r["precision"], _fmt(r.get("worst_cosine"), ".7f"), _fmt(r.get("mean_cosine"), ".7f"),
             _fmt(r.get("worst_rel_l2"), ".2e"), _fmt(r.get("max_abs"), ".2e"), _fmt(r.get("topk_agreement"), ".3f"),
             Raw('<span class="pass">PASS</span>') if r["passed"] else Raw(f'<span class="fail">FAIL</span>: {esc("; ".join(r["failures"]))}')]
            for r in p["rows"]]
    out = [table(["artifact", "runtime", "precision", "worst cos", "mean cos", "worst rel L2", "max abs", f"top-{k} agree",
                  "result"], rows, "num"),
           f"<p class=note>{p['images']['count']:,} images at {p['image_size']}×{p['image_size']} against "
           f"{esc(p['reference'])}; real Core ML runtime {esc(p['coreml_runtime'])}. Gates: fp16 worst per-image relative "
           f"L2 ≤ {g['fp16_max_rel_l2']:g} and top-{k} agreement ≥ {g['fp16_min_topk']:g}; fp32 max abs ≤ "
           f"{g['fp32_max_abs']:g} and worst cosine ≥ {g['fp32_min_cosine']:g}.</p>"]
    panels = []
    for r in p["rows"]:
        per = r.get("per_image")
        if not per or r["precision"] == "compressed":  # gated on use, not on per-image error: the size picture below
            continue
        fp16 = r["precision"] == "fp16"
        panels.append({"title": f"{r['artifact']} ({r['runtime']}, {r['precision']})",
                       "values": per["rel_l2"] if fp16 else per["max_abs"], "gate": g["fp16_max_rel_l2"] if fp16 else g["fp32_max_abs"],
                       "xlabel": "per-image relative L2" if fp16 else "per-image max abs error (the fp32 gate)"})
    if panels:
        out.append(str(img(parity_histograms(panels), "per-image parity error histograms with the gates")))
        out.append("<p class=note>Per artifact, the per-image error its gate is on: relative L2 ‖a − r‖ / ‖r‖ for fp16, "
                   "max abs for fp32; the red line is the gate.</p>")
    out.append(compression_picture(p))
    out.append(worst_images(run, p))
    return "\n".join(out)


def compression_picture(p: dict) -> str:
    """Size against retrieval agreement and kNN/probe drop, per artifact, when any artifact is compressed: the
    picture to choose the smallest model that keeps the answers from."""
    from export.parity import too_few_labelled  # numpy: not at import, which `pipeline --help` does
    from stages.report_figures import compression_tradeoff

    rows = [r for r in p["rows"] if r.get("size_bytes") and not r["runtime"].startswith("coreml ")]
    if not any(r["precision"] == "compressed" for r in rows):
        return ""
    g = p["config"]
    gates = {"topk": g.get("compressed_min_topk"), "knn": g.get("compressed_max_knn_drop")}
    points = [{"label": f"{r['artifact']} ({r['size_bytes'] / 1e6:.1f} MB)", "size_mb": r["size_bytes"] / 1e6,
               "agreement": r.get("topk_agreement"), "knn_drop": r.get("knn_drop"), "probe_drop": r.get("probe_drop"),
               "gates": gates if None not in gates.values() else None} for r in rows]
    k = max((r.get("top_k") or 0 for r in rows), default=0)
    lines = [[r["artifact"], r.get("compression", "fp16"), f"{r['size_bytes'] / 1e6:.2f}", _fmt(r.get("topk_agreement"), ".3f"),
              _fmt(r.get("knn_top1"), ".3f"), _fmt(r.get("knn_drop"), "+.3f"), _fmt(r.get("probe_top1"), ".3f"),
              _fmt(r.get("probe_drop"), "+.3f")] for r in rows]
    n = max((r.get("labelled_images") or 0 for r in rows), default=0)  # 0: a parity.json from before it was kept
    needed = too_few_labelled(n, g.get("compressed_max_knn_drop"), g.get("compressed_max_probe_drop"))
    coarse = (f" On {n} images one image that changes its answer moves a drop by {1 / n:.3f}, past the bounds, "
              f"which need {needed} images or more to tell one image from a loss (docs/export.md)."
              if needed else "")
    return "\n".join([
        "<h3>Compressed weights: size against answers</h3>",
        str(img(compression_tradeoff(points), "artifact size against retrieval agreement and kNN / probe top-1 drop")),
        table(["artifact", "compression", "MB", f"top-{k} agree", "kNN top-1", "kNN drop", "probe top-1", "probe drop"],
              lines, "num"),
        f"<p class=note>Against the fp32 encoder on the {f'{n} ' if n else ''}labelled val images: top-{k} neighbour "
        f"agreement, leave-one-out kNN top-1, and the val top-1 of each model's own linear probe (fitted on its "
        f"features of the train images, as an app fits its classifier on the model it ships). "
        f"Compressed artifacts pass with agreement ≥ {g.get('compressed_min_topk')}, drops ≤ "
        f"{g.get('compressed_max_knn_drop')} (kNN) and {g.get('compressed_max_probe_drop')} (probe), worst cosine ≥ "
        f"{g.get('compressed_min_cosine')} (red lines: the first two).{coarse} Pick the smallest file whose answers "
        f"you can live with.</p>"])


def worst_images(run: Run, p: dict) -> str:
    """Each distinct worst image: as the model received it, beside its source (the file itself when it is one)."""
    by_source: dict[str, list[dict]] = {}
    for r in p["rows"]:
        if r.get("worst_image_source") is not None and r.get("per_image"):
            by_source.setdefault(r["worst_image_source"], []).append(r)
    if not by_source:
        return ""
    split = run.split() if (run.dir / rundir.SPLIT).is_file() else {"val": [], "val_sources": []}
    val_pos = {s: i for i, s in enumerate(split["val_sources"])}
    size = p["image_size"]
    cards = []
    for source, rows in by_source.items():
        pics, label = [], ""
        try:
            if source in val_pos:
                pos = val_pos[source]
                pics.append((run.views([split["val"][pos]])[0], f"model input, {size}×{size}"))
                data = run.data()
                if data.labels is not None:
                    label = f", class {data.classes[int(data.labels[split['val'][pos]])]}"
            else:
                from train.data import decode_image

                pics.append((decode_image(Path(source), size), f"model input, {size}×{size}"))
            if Path(source).is_file():
                pics.append((source_picture(Path(source)), "source file"))
        except (PipelineError, OSError) as e:
            pics = []
            label = f" (cannot show it: {e})"
        # validate's worst image is the one of largest relative L2 (export/parity.py)
        what = "; ".join(f"{r['artifact']} ({r['runtime']}): rel L2 {max(r['per_image']['rel_l2']):.2e}" for r in rows)
        figs = "".join(f"<figure>{thumb(px, cap, source)}<figcaption>{esc(cap)}</figcaption></figure>" for px, cap in pics)
        cards.append(f'<div class="worst">{figs}<p>worst image of {esc(what)}<br>source: <code>{esc(source)}</code>'
                     f'{esc(label)}</p></div>')
    return "<h3>Worst images</h3>\n" + "\n".join(cards)


def source_picture(path: Path) -> np.ndarray:
    """The source file as a person sees it: upright (EXIF), whole (not cropped), at most SOURCE_SIDE."""
    import numpy as np
    from PIL import Image, ImageOps

    with Image.open(path) as im:
        im = ImageOps.exif_transpose(im).convert("RGB")
        im.thumbnail((SOURCE_SIDE, SOURCE_SIDE))
        return np.asarray(im)


def model_card(run: Run) -> str:
    export = run.dir / rundir.EXPORT
    chain = [("strip", run.dir / rundir.ENCODER, []), ("trace", export / rundir.TRACE_INFO, []),
             ("export", export / SIDECAR, ["--to", "all"])]
    missing = [(name, extra) for name, path, extra in chain if not path.is_file()]
    if missing:
        first = chain.index(next(c for c in chain if c[0] == missing[0][0]))
        raise NotRun(" && ".join(run.cmd(name, *extra) for name, _, extra in chain[first:]))
    side = run.json(f"{rundir.EXPORT}/{SIDECAR}", "export sidecar", run.cmd("export", "--to", "all"))
    arts = side.get("artifacts") or []
    rows = [[a.get("file"), a.get("format"), a.get("precision"), size_text(a.get("size_bytes") or 0),
             Raw(f'<code class="sha">{esc(a.get("sha256"))}</code>')] for a in arts]
    skip = {"artifacts", "sha256_of_directory"}
    meta_rows = [[k, v if isinstance(v, str) else json.dumps(v)] for k, v in side.items()
                 if k not in skip and not isinstance(v, dict)]
    size, dim = side.get("image_size"), side.get("embedding_dim")

    def runs_on(key: str) -> str:  # the target the file was written for, as encoder.json lists it
        entry = next((a for a in arts if a.get("format") == key), {})
        return ipados(entry.get("deployment_target") or minimum_os(key, {}))

    inp, outp = side.get("input_name", "image"), side.get("output_name", "embedding")
    swift = ("let request = VNCoreMLRequest(model: try VNCoreMLModel(for: encoder(configuration: MLModelConfiguration()).model))\n"
             "request.imageCropAndScaleOption = .centerCrop\n"
             "try VNImageRequestHandler(cvPixelBuffer: frame).perform([request])\n"
             f"let embedding = (request.results?.first as? VNCoreMLFeatureValueObservation)?.featureValue.multiArrayValue  // [1, {dim}]")
    return "\n".join([
        table(["artifact", "format", "precision", "size", "sha256"], rows),
        "<h3>Metadata (in every artifact and in export/encoder.json)</h3>",
        table(["key", "value"], meta_rows, "card meta"),
        "<h3>In the iPad demo</h3>",
        f"<p>Drag <code>encoder.mlpackage</code> ({esc(runs_on('mlpackage'))}; <code>encoder.mlmodel</code> for "
        f"{esc(runs_on('mlmodel'))}) into the Xcode "
        f"project. It takes an RGB image <code>{esc(inp)}</code> of {esc(size)}×{esc(size)} pixels, 0..255 (normalisation "
        f"is inside the model), and returns <code>{esc(outp)}</code>, {esc(dim)} floats"
        f"{', L2-normalised: cosine similarity is a dot product' if side.get('l2_normalized') else ''}. Vision scales and "
        f"center-crops camera frames to it:</p>",
        f"<pre>{esc(swift)}</pre>",
    ])


SECTIONS: tuple[tuple[str, str, Callable[[Run], str]], ...] = (
    ("run", "Run", run_card),
    ("curves", "Training curves", training_curves),
    ("evaluation", "Evaluation: pretrained vs random init", evaluation),
    ("retrieval", "Retrieval: nearest training images", retrieval),
    ("embedding", "Embedding map", embedding_map),
    ("parity", "Parity: exported models vs PyTorch", parity),
    ("model", "Model card", model_card),
)

STYLE = """
body { font: 14px/1.45 -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; margin: 0 auto; max-width: 1180px;
       padding: 16px 24px; color: #1d232a; background: #fff; }
h1 { font-size: 22px; margin: 4px 0 2px; } h2 { font-size: 18px; border-bottom: 2px solid #e3e7eb; padding-bottom: 3px;
margin-top: 28px; } h3 { font-size: 15px; margin: 18px 0 6px; }
nav a { margin-right: 12px; color: #1f6fb5; text-decoration: none; } .sub { color: #5b6670; margin: 0 0 8px; }
table { border-collapse: collapse; margin: 6px 0; } th, td { padding: 3px 9px; border-bottom: 1px solid #e3e7eb;
text-align: left; vertical-align: top; } th { background: #f4f6f8; font-weight: 600; }
table.num td:not(:first-child) { text-align: right; font-variant-numeric: tabular-nums; }
table.card td:first-child { color: #5b6670; white-space: nowrap; } table.card th { display: none; }
table.meta td { font-size: 12px; } code.sha { font-size: 11px; }
img { max-width: 100%; } img.px { image-rendering: pixelated; }
table.grid td { padding: 2px; border: none; text-align: center; min-width: 62px; } table.grid figure { margin: 0; }
table.grid img { width: 56px; height: 56px; object-fit: cover; border: 3px solid transparent; display: block;
max-width: none; margin: 0 auto; }
table.grid figure.ok img { border-color: #2e9e55; } table.grid figure.bad img { border-color: #d64541; }
table.grid img.query { border-color: #1d232a; } table.grid figcaption { font-size: 11px; overflow-wrap: anywhere; }
table.grid td:nth-child(7) { border-left: 2px solid #c7ced4; }
th.pretrained { color: #1f6fb5; } th.random { color: #d9822b; }
.worst { display: flex; gap: 14px; align-items: center; margin: 6px 0; } .worst figure { margin: 0; text-align: center; }
.worst img { width: 112px; height: auto; } .worst figcaption { font-size: 11px; color: #5b6670; }
.note { color: #5b6670; font-size: 13px; } .warn { color: #a14b00; } .missing { color: #a14b00; font-weight: 600; }
.verdict { font-size: 15px; font-weight: 600; margin: 6px 0 10px; }
.unread { color: #9aa3ab; text-decoration: line-through; } .unread-why { color: #a14b00; }
.pass { color: #2e9e55; font-weight: 700; } .fail { color: #d64541; font-weight: 700; }
pre { background: #f4f6f8; padding: 8px 10px; overflow-x: auto; font-size: 12px; }
details summary { cursor: pointer; color: #1f6fb5; }
"""

PAGE = string.Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
$provenance
<title>$title</title>
<style>$style</style>
</head>
<body>
<h1>$title</h1>
<p class="sub">$subtitle</p>
$verdict
<nav>$nav</nav>
$sections
</body>
</html>
""")


def validate(cfg: ReportConfig) -> None:
    if cfg.queries < 1 or cfg.neighbours < 1:
        raise PipelineError(f"--queries and --neighbours must be >= 1, got {cfg.queries} and {cfg.neighbours}")
    if cfg.tsne_max < 0 or cfg.map_max < 2:
        raise PipelineError(f"--tsne-max must be >= 0 and --map-max >= 2, got {cfg.tsne_max} and {cfg.map_max}")


def verdict_paragraph(run: Run) -> str:
    """The page's first line: what the evaluation found (train/verdict.py), the same line `pipeline show` prints."""
    try:
        return f'<p class="verdict">{esc(verdict.verdict_line(run.linear()))}</p>'
    except NotRun as e:
        return f'<p class="verdict missing">verdict: not evaluated yet: <code>{esc(e)}</code></p>'
    except PipelineError as e:
        return f'<p class="verdict warn">verdict: cannot read the evaluation: {esc(e)}</p>'


def build(cfg: ReportConfig, run_dir: Path, say=print) -> str:
    """The page's HTML. A section whose files are missing becomes a "not run yet" line; one that cannot be drawn
    from files that are there (changed images, a damaged file) says why in its place, and on the terminal."""
    run = Run(Path(run_dir), cfg, say)
    parts, nav = [], []
    for anchor, title, section in SECTIONS:
        try:
            body = section(run)
        except NotRun as e:
            body = f"<p class=missing>not run yet: <code>{esc(e)}</code></p>"
        except PipelineError as e:
            say(f"warning: report section {title!r} left out: {e}")
            body = f"<p class=warn>cannot draw this section: {esc(e)}</p>"
        parts.append(f'<section id="{anchor}">\n<h2>{esc(title)}</h2>\n{body}\n</section>')
        nav.append(f'<a href="#{anchor}">{esc(title.split(":")[0])}</a>')
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return PAGE.substitute(title=esc(f"Run report: {run.dir.resolve().name}"), style=STYLE, nav="".join(nav),
                           provenance=provenance.report_tag(run.dir), verdict=verdict_paragraph(run),
                           subtitle=esc(f"{run.dir} · written {when} by `pipeline report`"), sections="\n".join(parts))


def run(cfg: ReportConfig, run_dir: Path, say=print) -> Path:
    validate(cfg)
    run_dir = Path(run_dir)
    provenance.check_results(run_dir)  # a page never shows an earlier checkpoint's results beside this one
    page = build(cfg, run_dir, say)
    path = run_dir / rundir.REPORT
    rundir.write_text_atomic(path, page)
    say(f"wrote {path} ({size_text(len(page.encode()))})")
    return path
