"""The merged tables with the photos set's two cuts kept apart (see README.md): lines from the earlier calls (the
files one folder up) on `photos` are relabelled `photos-earlier-cut`, so recipe_summary.py pairs each trained line
with the random init of its own cut. Writes <backbone>-paired/results.jsonl and prints each summary.

    cd benchmarks/results/h200-backbone-recipes/more-seeds && python3 relabel.py  (from the repository's venv)
"""
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = {  # backbone -> (earlier calls' files, later calls' files), as the READMEs list them
    "mobilenet_v3_small": (["../mobilenet_v3_small-results.jsonl", "../mnv3s-seeds12/results.jsonl"], ["mnv3s-results.jsonl"]),
    "vit_t_16": (["../vit_t_16-results.jsonl"], ["vitt0-results.jsonl", "vitt12-results.jsonl", "vitt-s12-results.jsonl",
                                                 "../vb-textures-s2/vitt-results.jsonl"]),
    "mobilenet_v3_large": (["../mobilenet_v3_large-results.jsonl"], ["mnv3l-results.jsonl", "mnv3l-s2-results.jsonl"]),
    # ../more-backbones/README.md: the cells that ran out of GPU memory were run again in a later call
    "resnet34": ([], ["../more-backbones/r34-s0-results.jsonl", "../more-backbones/r34-knn-rerun-results.jsonl",
                      "../r34-eb0-seeds12/r34-eb0-s1-results.jsonl", "../r34-eb0-seeds12/r34-s2-results.jsonl"]),
    "efficientnet_b0": ([], ["../more-backbones/eb0-s0-results.jsonl", "../more-backbones/eb0-rerun-results.jsonl",
                             "../r34-eb0-seeds12/r34-eb0-s1-results.jsonl", "../r34-eb0-seeds12/eb0-s1-photos-results.jsonl",
                             "../r34-eb0-seeds12/eb0-s1-textures-results.jsonl", "../r34-eb0-seeds12/eb0-s2-results.jsonl"]),
    "convnext_tiny": ([], ["../more-backbones/cn-digits-s0-results.jsonl", "../cn-vs-seed0/cn-s0-results.jsonl",
                           "../cn-vs-seed0/cn-s0-rerun1-results.jsonl", "../cn-vs-seed0/cn-s0-rerun2-results.jsonl",
                           "../cn-vs-seeds12/cn-s1-results.jsonl", "../cn-vs-seeds12/cn-s2-results.jsonl",
                           "../cn-vs-seeds12/cn-s2-digits-results.jsonl"]),
    "vit_s_16": ([], ["../more-backbones/vs-digits-s0-results.jsonl", "../cn-vs-seed0/vs-s0-results.jsonl",
                      "../cn-vs-seed0/vs-s0-ds-results.jsonl", "../cn-vs-seed0/vs-s0-tx-results.jsonl",
                      "../cn-vs-seed0/vs-s0-ph-results.jsonl",
                      # ../cn-vs-seeds12/README.md: call 1 ran out of time on most of seed 1; call 2 ran those cells
                      "../cn-vs-seeds12/vs-s1-results.jsonl", "../cn-vs-seeds12/vs-s1-bm-results.jsonl",
                      "../cn-vs-seeds12/vs-s1-digits-results.jsonl", "../cn-vs-seeds12/vs-s2-a-results.jsonl",
                      "../cn-vs-seeds12/vs-s2-b-results.jsonl"]),
    # ../r50-vb/README.md: call 1 ran out of time on five ResNet-50 cells and one ViT-B/16 cell, run in calls 2 and 3
    # ../r50-vb-resumed/README.md: one grid of both backbones, resumed across two calls; its file holds every line
    # ../r50-seed2/README.md: the rest of ResNet-50 in two calls on two machines; its call B file holds every line
    "resnet50": ([], ["../r50-vb/r50-s0-results.jsonl", "../r50-vb/r50-call2-results.jsonl",
                      "../r50-vb/r50-call3-results.jsonl", "../r50-vb-resumed/callB-results.jsonl",
                      "../r50-seed2/callB-results.jsonl"]),
    # ../vb-more/README.md: four grids in two calls, each seeded with every line before it
    "vit_b_16": ([], ["../r50-vb/vb-digits-s0-results.jsonl", "../r50-vb/vb-call3-results.jsonl",
                      "../r50-vb-resumed/callB-results.jsonl", "../vb-more/ga-results.jsonl",
                      "../vb-more/gb-results.jsonl", "../vb-more/gc-results.jsonl", "../vb-more/gd-results.jsonl",
                      # ../vb-photos/README.md: two calls on an H100 in one OUT_DIR, the second's file holding every line
                      "../vb-photos/call2-results.jsonl",
                      # ../vb-photos-byol/README.md: one call on an H100, its new lines only
                      "../vb-photos-byol/results.jsonl",
                      # ../vb-photos-mocov3/README.md and ../vb-textures/README.md: one call each on an H100, new lines
                      "../vb-photos-mocov3/results.jsonl", "../vb-textures/results.jsonl",
                      # ../vb-digits-sizes-s2/, ../vb-textures-s1/, ../vb-textures-s2/ and ../vb-last-s2/README.md: one
                      # call each on an H100, seeded with every line before it; new lines only
                      "../vb-digits-sizes-s2/results.jsonl", "../vb-textures-s1/results.jsonl",
                      "../vb-textures-s2/results.jsonl", "../vb-last-s2/results.jsonl"]),
}
for backbone, (earlier, later) in SOURCES.items():
    seen, rows = set(), []
    for name in earlier + later:
        for line in (HERE / name).read_text().splitlines():
            r = json.loads(line)
            if "failed" in r:  # a cell that failed and was run again later (the READMEs say which and why)
                continue
            if r.get("backbone", backbone) != backbone:  # a grid of several backbones writes one file for all
                continue
            if name in earlier and r["dataset"] == "photos":
                r["dataset"] = "photos-earlier-cut"
            key = (r["dataset"], r["method"], r.get("seed"), r.get("variant"))
            if key not in seen:  # first line of a key wins: the earlier of two runs of one cell
                seen.add(key)
                rows.append(r)
    out = HERE / f"{backbone}-paired"
    out.mkdir(exist_ok=True)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"## {backbone}")
    sys.stdout.flush()
    subprocess.run([sys.executable, str(HERE.parents[2] / "recipe_summary.py"), str(out)], check=True)
