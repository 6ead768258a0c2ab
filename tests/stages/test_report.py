"""Report stage: on a tiny finished run every section shows the run's own numbers (recomputed here from the run's
files, not copied from the report's code); on a partial run each missing stage is one "not run yet" line; the page
is self-contained (every image an inline PNG that decodes, no script, no outside reference); and a real headless
Chromium renders it with every image decoded and no console error."""

from __future__ import annotations

import base64
import fcntl
import html
import io
import json
import os
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from core import rundir
from core.config import load_config
from stages import report
from stages.report import ReportConfig
from tests import browser
from tests.cli_helpers import assert_one_line_error, cli
from tests.stages.test_validate import exported_run  # noqa: F401  the shared tiny run: pretrain -> export

pytestmark = pytest.mark.slow


def _quiet(*_):
    pass


def _link_tree(src: Path, dst: Path, names: list[str]) -> None:
    """dst/name -> src/name for each: the shared run is read-only, stages here write beside the links."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in names:
        if (src / name).exists():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            (dst / name).symlink_to((src / name).resolve())


def _finish(exported_run: Path, run: Path) -> None:
    from stages import linear_eval, validate

    _link_tree(exported_run, run, [rundir.CONFIG, rundir.SPLIT, rundir.METRICS, rundir.LAST_CHECKPOINT])
    (run / rundir.EXPORT).mkdir()
    for f in (exported_run / rundir.EXPORT).iterdir():
        (run / rundir.EXPORT / f.name).symlink_to(f.resolve())
    linear_eval.run(load_config(linear_eval.EvalConfig, None, {"labels_per_class": 3, "label_draws": 2, "device": "cpu"}),
                    run, say=_quiet)
    validate.run(load_config(validate.ValidateConfig, None, {"max_images": 16}), run, say=_quiet)  # enough for top-10
    report.run(ReportConfig(), run, say=_quiet)


@pytest.fixture(scope="session")
def finished_run(request, exported_run, tmp_path_factory) -> Path:  # noqa: F811
    """The shared exported run plus linear-eval (3 labels per class, 2 draws), validate and report: every stage
    done. Built once per session under a file lock, as exported_run is; read-only for tests (they copy or link)."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if hasattr(request.config, "workerinput") else base
    root = shared / "report_finished_run"
    with open(shared / "report_finished_run.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "done").exists():
            shutil.rmtree(root, ignore_errors=True)
            _finish(exported_run, root / "run")
            (root / "done").touch()
    return root / "run"


class Page(HTMLParser):
    """Sections by id (their text), and every <img> with its attributes."""

    def __init__(self, text: str):
        super().__init__()
        self.sections: dict[str, str] = {}
        self.images: list[dict] = []
        self.scripts = 0
        self.refs: list[str] = []
        self._section = None
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a["id"]
            self.sections[self._section] = ""
        if tag == "img":
            self.images.append({**a, "section": self._section})
        if tag == "script":
            self.scripts += 1
        if tag in ("td", "th", "tr", "p", "br", "figcaption", "h3", "pre", "summary") and self._section:
            self.sections[self._section] += " "  # cells and lines read as words, as a person sees them
        self.refs += [v for k, v in attrs if k in ("src", "href") and v and not v.startswith(("data:", "#"))]

    def handle_endtag(self, tag):
        if tag == "section":
            self._section = None

    def handle_data(self, data):
        if self._section:
            self.sections[self._section] += data


def _page(run: Path) -> Page:
    return Page((run / rundir.REPORT).read_text())


def _text(page: Page, section: str) -> str:
    return re.sub(r"\s+", " ", page.sections[section])


def test_self_contained_every_image_decodes(finished_run):
    page = _page(finished_run)
    assert page.scripts == 0 and page.refs == []  # opens offline: nothing to fetch, nothing to run
    assert len(page.images) > 50  # figures + the retrieval grid's thumbnails + the worst images
    for im in page.images:
        assert im["src"].startswith("data:image/png;base64,")
        with Image.open(io.BytesIO(base64.b64decode(im["src"].split(",", 1)[1]))) as decoded:
            decoded.load()
            assert decoded.width > 0 and decoded.height > 0
    assert "not run yet" not in "".join(page.sections.values())


def test_run_card_and_curves(finished_run):
    page = _page(finished_run)
    card = _text(page, "run")
    split = json.loads((finished_run / rundir.SPLIT).read_text())
    ckpt = torch.load(finished_run / rundir.LAST_CHECKPOINT, weights_only=False)
    assert "simclr" in card and "resnet18" in card and "16 px" in card
    assert f"synthetic:96: {len(split['train'])} train / {len(split['val'])} val images" in card
    assert f"steps {ckpt['step']} of {ckpt['meta']['total_steps']}" in card
    assert "device cpu" in card
    s = round(ckpt["meta"]["wall_s"])
    assert f"wall time {s} s" in card if s < 60 else f"wall time {s // 60} min {s % 60:02d} s" in card
    records = [json.loads(line) for line in (finished_run / rundir.METRICS).read_text().splitlines()]
    curves = _text(page, "curves")
    assert f"loss {records[0]['loss']:.4f} → {records[-1]['loss']:.4f}" in curves
    assert f"data wait (median) {100 * np.median([r['data_wait'] for r in records]):.1f} %" in curves
    assert sum(im["section"] == "curves" for im in page.images) == 1


def test_evaluation_table_and_few_label_spread(finished_run):
    text = _text(_page(finished_run), "evaluation")
    r = json.loads((finished_run / rundir.EVAL / "linear.json").read_text())
    for key in ("top1", "knn_top1", "knn_majority_top1"):
        a, b = 100 * r[key], 100 * r["baseline"][key]
        assert f"{a:.1f} {b:.1f} {a - b:+.1f}" in text, key
    few = r["labels_per_class"]
    assert few["k"] == 3 and few["draws"] == 2
    a = few["per_draw"]
    for key in ("top1", "knn_top1"):
        pre = [d[key] for d in a]
        base = [d["baseline"][key] for d in a]
        gain = [x - y for x, y in zip(pre, base)]
        cells = [f"{100 * np.mean(v):{sign}.1f} ± {100 * np.std(v):.1f}" for v, sign in ((pre, ""), (base, ""), (gain, "+"))]
        assert " ".join(cells) in text, key
    assert "2 draws" in text


def test_retrieval_neighbours_are_the_cosine_nearest_training_images(finished_run):
    page = _page(finished_run)
    split = json.loads((finished_run / rundir.SPLIT).read_text())
    shown = [im for im in page.images if im["section"] == "retrieval"]
    queries = [im for im in shown if "query" in im.get("class", "")]
    neighbours = [im for im in shown if im["alt"] == "neighbour"]
    assert len(queries) == 8 and len(neighbours) == 8 * 2 * 5
    labels = {}
    for which in ("pretrained", "random"):
        cached = torch.load(finished_run / rundir.EVAL / f"features_{which}.pt", weights_only=True)
        train, val = torch.nn.functional.normalize(cached["train"], dim=1), torch.nn.functional.normalize(cached["val"], dim=1)
        top = (val @ train.T).topk(5, dim=1).indices
        labels[which] = (val, top)
    val_pos = {s: i for i, s in enumerate(split["val_sources"])}
    for qi, q in enumerate(queries):
        row = neighbours[qi * 10:(qi + 1) * 10]
        for w, part in (("pretrained", row[:5]), ("random", row[5:])):
            expected = [split["train_sources"][j] for j in labels[w][1][val_pos[q["title"]]].tolist()]
            assert [im["title"] for im in part] == expected, (w, q["title"])
    text = _text(page, "retrieval")
    y = {part: np.array([int(s.split("#")[1]) for s in split[f"{part}_sources"]]) for part in ("train", "val")}
    from train.data import make_synthetic

    cls = make_synthetic(96, 16, 0).labels.numpy()
    for which, name in (("pretrained", "pretrained"), ("random", "random init")):
        agree = (cls[y["train"][labels[which][1].numpy()]] == cls[y["val"]][:, None]).mean()
        assert f"{name} {100 * agree:.1f} %" in text


def test_embedding_map_numbers(finished_run):
    from sklearn.decomposition import PCA

    text = _text(_page(finished_run), "embedding")
    for which, name in (("pretrained", "pretrained"), ("random", "random init")):
        val = torch.load(finished_run / rundir.EVAL / f"features_{which}.pt", weights_only=True)["val"].double().numpy()
        val /= np.linalg.norm(val, axis=1, keepdims=True)
        share = PCA(n_components=2).fit(val).explained_variance_ratio_.sum()
        assert f"{100 * share:.1f} % " in text and name in text
    assert "t-SNE: perplexity" in text


def test_parity_table_histograms_and_worst_image(finished_run):
    page = _page(finished_run)
    text = _text(page, "parity")
    p = json.loads((finished_run / rundir.VALIDATE / "parity.json").read_text())
    for r in p["rows"]:
        assert (f"{r['artifact']} {r['runtime']} {r['precision']} {r['worst_cosine']:.7f} {r['mean_cosine']:.7f} "
                f"{r['worst_rel_l2']:.2e} {r['max_abs']:.2e} {r['topk_agreement']:.3f} PASS") in text
        worst = r["per_image"]["rel_l2"][p["images"]["sources"].index(r["worst_image_source"])]
        assert f"{r['artifact']} ({r['runtime']}): rel L2 {worst:.2e}" in text
        assert r["worst_image_source"] in text
    assert f"L2 ≤ {p['config']['fp16_max_rel_l2']:g}" in text
    images = [im for im in page.images if im["section"] == "parity"]
    assert images[0]["alt"].startswith("per-image parity error histograms")
    assert {im["title"] for im in images[1:]} == {r["worst_image_source"] for r in p["rows"]}


def test_model_card_lists_every_artifact(finished_run):
    text = _text(_page(finished_run), "model")
    sidecar = json.loads((finished_run / rundir.EXPORT / "encoder.json").read_text())
    assert len(sidecar["artifacts"]) == 3
    for a in sidecar["artifacts"]:
        assert f"{a['file']} {a['format']} {a['precision']}" in text and a["sha256"] in text
    assert f"returns embedding, {sidecar['embedding_dim']} floats" in text
    assert "VNCoreMLRequest" in text


def _missing(page: Page, section: str) -> str:
    m = re.search(r"not run yet: (.*)", _text(page, section))
    return m.group(1).strip() if m else ""


def test_partial_run_says_what_to_run(exported_run, tmp_path):  # noqa: F811
    """Pretrained only: run card and curves are drawn, every later stage is one line naming its command."""
    run = tmp_path / "partial"
    _link_tree(exported_run, run, [rundir.CONFIG, rundir.SPLIT, rundir.METRICS, rundir.LAST_CHECKPOINT])
    report.run(ReportConfig(), run, say=_quiet)
    page = _page(run)
    assert "resnet18" in _text(page, "run") and "loss" in _text(page, "curves")
    for section in ("evaluation", "retrieval", "embedding"):
        assert _missing(page, section) == f"pipeline linear-eval --run {run}"
    assert _missing(page, "parity") == f"pipeline validate --run {run}"
    assert _missing(page, "model") == (f"pipeline strip --run {run} && pipeline trace --run {run} && "
                                       f"pipeline export --run {run} --to all")
    # after strip, only the rest of the chain is named
    _link_tree(exported_run, run, [f"{rundir.EXPORT}/encoder.pt"])
    report.run(ReportConfig(), run, say=_quiet)
    assert _missing(_page(run), "model") == f"pipeline trace --run {run} && pipeline export --run {run} --to all"


def test_eval_without_few_labels_names_the_flag(finished_run, tmp_path):
    run = tmp_path / "run"
    _link_tree(finished_run, run, [rundir.CONFIG, rundir.SPLIT, rundir.METRICS, rundir.LAST_CHECKPOINT,
                                   "eval/features_pretrained.pt", "eval/features_random.pt"])
    result = json.loads((finished_run / rundir.EVAL / "linear.json").read_text())
    del result["labels_per_class"]
    step = result["checkpoint"]["step"]
    result["checkpoint"]["step"] = step - 1  # as if training had gone on after linear-eval
    rundir.write_json_atomic(run / rundir.EVAL / "linear.json", result)
    report.run(ReportConfig(), run, say=_quiet)
    page = _page(run)
    assert _missing(page, "evaluation") == f"pipeline linear-eval --run {run} --labels-per-class 5"
    assert f"{100 * result['top1']:.1f}" in _text(page, "evaluation")
    assert (f"measured step {step - 1}, the checkpoint is at step {step}: re-run pipeline linear-eval --run {run}"
            in _text(page, "evaluation"))
    assert _missing(page, "retrieval") == "" and _missing(page, "embedding") == ""


def test_empty_run_directory_names_pretrain_everywhere_it_starts(tmp_path):
    run = tmp_path / "empty"
    run.mkdir()
    report.run(ReportConfig(), run, say=_quiet)
    page = _page(run)
    assert _missing(page, "run") == _missing(page, "curves") == f"pipeline pretrain --out {run}"


def test_cli_writes_the_page_and_show_prints_its_path(finished_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run, symlinks=True)
    (run / rundir.REPORT).unlink()
    res = cli("show", "--run", run)
    assert res.exit_code == 0 and f"report: not written yet: `pipeline report --run {run}`" in res.output
    res = cli("report", "--run", run, "--queries", "3", "--tsne-max", "0")
    assert res.exit_code == 0, res.output
    assert f"wrote {run / rundir.REPORT}" in res.output
    page = _page(run)
    assert sum("query" in im.get("class", "") for im in page.images) == 3
    assert "t-SNE left out" in _text(page, "embedding")
    res = cli("show", "--run", run)
    assert res.exit_code == 0 and f"report: {run / rundir.REPORT}" in res.output


@pytest.mark.parametrize("args, needle", [(("--queries", "0"), "--queries"), (("--tsne-max", "-1"), "--tsne-max"),
                                          (("--run", "/nonexistent/run"), "does not exist")])
def test_bad_input_is_one_line(tmp_path, args, needle):
    assert_one_line_error(cli("report", "--run", tmp_path, *args), needle)


def test_a_real_browser_renders_it(finished_run, tmp_path):
    """Debian's headless Chromium opens the page from disk: every image decodes, the console stays clean, and the
    screenshot shows a page (not a blank or an error page)."""
    if browser.find() is None:
        if os.geteuid() == 0:  # installable here, so missing is a setup fault, not a reason to skip
            pytest.fail("chromium/chromedriver missing: run `make browser` (make test does)")
        pytest.skip("chromium/chromedriver missing and not root, so they cannot be installed: "
                    "`sudo apt-get install -y chromium chromium-driver`")
    html = (finished_run / rundir.REPORT).read_text()
    with browser.chromium() as driver:
        result = browser.load(driver, finished_run / rundir.REPORT)
        shot = browser.screenshot(driver, tmp_path / "report.png")
    assert result["images"] == html.count("<img ") and result["broken"] == [] and result["errors"] == []
    assert result["scripts"] == 0
    with Image.open(shot) as im:
        px = np.asarray(im.convert("RGB"), dtype=np.float32)
    assert px.shape[1] == browser.WIDTH and px.shape[0] > 2000  # the whole page, every section
    assert px.std() > 20  # text and figures, not a blank page
    keep = os.environ.get("REPORT_SCREENSHOT")
    if keep:  # to look at it: REPORT_SCREENSHOT=/tmp/shot.png pytest ... -k browser
        shutil.copy(shot, keep)


def test_a_worst_image_from_a_file_is_shown_beside_the_file(tmp_path):
    """validate --images adds files: the worst one is shown as the model got it (16 px) and as the file itself."""
    photo = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (60, 90, 3), dtype=np.uint8)).save(photo)
    parity = {"image_size": 16, "rows": [{"artifact": "encoder.onnx", "runtime": "onnxruntime (CPU)",
                                         "worst_image_source": str(photo), "per_image": {"rel_l2": [1e-3, 4e-3]}}]}
    html = report.worst_images(report.Run(tmp_path, ReportConfig()), parity)
    page = Page(f'<section id="parity">{html}</section>')
    sizes = []
    for im in page.images:
        with Image.open(io.BytesIO(base64.b64decode(im["src"].split(",", 1)[1]))) as decoded:
            sizes.append(decoded.size)
    assert sizes == [(16, 16), (90, 60)]  # the model's center crop, then the whole file
    assert "rel L2 4.00e-03" in _text(page, "parity") and str(photo) in _text(page, "parity")


def test_the_run_card_names_byols_projector_bn_and_predictor_rate(tmp_path):
    """BYOL's small recipe trains with BN on the projector's output and a faster predictor: the card says so, and says
    nothing of either for a run that trained without them."""
    from tests.tiny_run import pretrain_tiny

    for over, said in (({}, True), ({"proj_last_bn": "off", "pred_lr": 1.0}, False)):
        out = tmp_path / str(said)
        pretrain_tiny(out, method="byol", max_steps=1, **over)
        card = html.unescape(re.sub(r"\s+", " ", report.run_card(report.Run(out, ReportConfig()))))
        assert ("BN on the projector's output" in card) is said and ("predictor lr × 10" in card) is said, card
        assert "target momentum 0.9 → 1" in card
