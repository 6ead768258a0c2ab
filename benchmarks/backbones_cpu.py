"""Per backbone, on this machine's CPU: parameters, MACs at 224 px (ImageNet stem) and at 32 px (the small stem),
the whole chain on a tiny run (pretrain -> strip -> trace -> export -> validate, the CLI as a user types it) with
the artifacts' sizes and parity, `pipeline bench` training img/s, and inference img/s of the exported encoder at
the exported size (PyTorch eager fp32 and onnxruntime on the .onnx, batch 32, one thread each).

  PYTHONPATH=$PWD python benchmarks/backbones_cpu.py OUT_DIR [--backbones a,b] [--epochs N | --config YAML]
      [--skip-chain] [--skip-bench]

Writes OUT_DIR/backbones.jsonl (one line a backbone) and OUT_DIR/backbones.md (the table). The tiny run's numbers
are about export and speed, not about what the encoder learnt: 4 steps of 8 images an epoch, one epoch unless
--epochs says more; --config pretrains as that file says instead (configs/default.yaml: what `make all` trains,
with the backbone swapped), for a chain on an encoder trained as a user's would be (docs/benchmarks.md says why
the mobile nets need one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from train.backbones import BACKBONES, build_backbone  # noqa: E402

CHAIN_SIZE = 32
PRETRAIN = ["--data", "synthetic:48", "--image-size", str(CHAIN_SIZE), "--batch-size", "8",
            "--val-fraction", "0.34", "--device", "cpu", "--num-workers", "0", "--proj-hidden-dim", "64",
            "--proj-dim", "32", "--pred-hidden-dim", "64"]


def macs(name: str, size: int) -> tuple[int, int]:
    """(MACs of one image's forward, parameters) with the stem the pipeline uses at this size (small at <= 64 px)."""
    net, _ = build_backbone(name, size <= 64, size)
    net.eval()
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        net(torch.zeros(1, 3, size, size))
    return counter.get_total_flops() // 2, sum(p.numel() for p in net.parameters())


def pipeline(*args: str, log: Path) -> tuple[int, float]:
    """`python -m pipeline ARGS` with this checkout's code; (exit code, seconds); output appended to log."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    t0 = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"$ pipeline {' '.join(args)}\n")
        f.flush()
        rc = subprocess.run([sys.executable, "-m", "pipeline", *args], stdout=f, stderr=subprocess.STDOUT, env=env,
                            cwd=ROOT).returncode
    return rc, time.perf_counter() - t0


def chain(name: str, out: Path, epochs: int = 1, config: Path | None = None) -> dict:
    run, log = out / "runs" / name, out / "logs" / f"{name}.log"
    log.unlink(missing_ok=True)
    result = {"run": str(run)}
    how = ["--config", str(config), "--device", "cpu"] if config else [*PRETRAIN, "--epochs", str(epochs)]
    steps = [("pretrain", ["pretrain", "--backbone", name, *how, "--out", str(run)]),
             ("strip", ["strip", "--run", str(run)]), ("trace", ["trace", "--run", str(run)]),
             ("export", ["export", "--run", str(run)]), ("validate", ["validate", "--run", str(run)])]
    for step, args in steps:
        rc, secs = pipeline(*args, log=log)
        result[f"{step}_s"] = round(secs, 1)
        if rc != 0:
            lines = [line for line in log.read_text().splitlines() if line.startswith("error: ")]
            result[f"{step}_error"] = lines[-1] if lines else f"exit {rc}"
            if step != "validate":
                return result
    sidecar = json.loads((run / "export" / "encoder.json").read_text())
    result["artifacts"] = {a["format"]: {"mb": round(a["size_bytes"] / 1e6, 2), "precision": a["precision"],
                                         "target": a.get("deployment_target")} for a in sidecar["artifacts"]}
    parity = run / "validate" / "parity.json"
    if parity.is_file():
        rows = json.loads(parity.read_text())["rows"]
        result["parity"] = {r["artifact"]: {"passed": r["passed"], "worst_rel_l2": r.get("worst_rel_l2"),
                                            "topk": r.get("topk_agreement"), "failures": r.get("failures")} for r in rows}
    return result


def bench(name: str, out: Path) -> dict:
    log = out / "logs" / f"{name}-bench.log"
    env = dict(os.environ, PYTHONPATH=str(ROOT), TQDM_DISABLE="1")
    done = subprocess.run([sys.executable, "-m", "pipeline", "bench", "--device", "cpu", "--backbone", name, "--json"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    log.write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        return {"bench_error": (done.stdout + done.stderr).strip().splitlines()[-1]}
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return {"train_e2e_img_s": r["e2e_img_s"], "train_ceiling_img_s": r["ceiling_img_s"], "bench_batch": r["batch_size"]}


def inference(name: str, run: Path | None, batch: int = 32, reps: int = 3) -> dict:
    """img/s of the exported encoder at its size: eager fp32 (the encoder.pt module) and onnxruntime (the .onnx)."""
    from export.encoder import Encoder, load_encoder

    torch.set_num_threads(1)
    size = CHAIN_SIZE
    if run is not None and (run / "export" / "encoder.pt").is_file():
        enc, state = load_encoder(run / "export" / "encoder.pt")
        size = state["image_size"]  # the run's (--config may train at another size than the tiny run's)
    else:
        net, _ = build_backbone(name, True, CHAIN_SIZE)
        enc = Encoder(net, [0.5] * 3, [0.25] * 3).eval()
    x = torch.rand(batch, 3, size, size) * 255

    def rate(fn) -> float:
        fn()  # warm-up
        best = min(_timed(fn) for _ in range(reps))
        return round(batch / best, 1)

    with torch.no_grad():
        out = {"torch_img_s": rate(lambda: enc(x))}
    onnx_path = run / "export" / "encoder.onnx" if run is not None else None
    if onnx_path is not None and onnx_path.is_file():
        import onnxruntime as ort

        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        feed = {"image": x.numpy()}
        out["onnxruntime_img_s"] = rate(lambda: session.run(None, feed))
    out["inference_size"] = size
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def table(rows: list[dict]) -> str:
    head = ("| backbone | params (224 / 32 px) | MACs 224 px | MACs 32 px | fp16 .mlpackage | .mlmodel target | "
            "validate (fp16 ML Program worst rel-L2) | CPU train img/s (bench, e2e) | CPU inference img/s 32 px (torch / onnxruntime) |")
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        art = r.get("artifacts", {})
        par = r.get("parity", {})
        ok = "PASS" if par and all(p["passed"] for p in par.values()) else (
            "FAIL: " + "; ".join(f"{a} {', '.join(p['failures'] or [])}" for a, p in par.items() if not p["passed"])
            if par else r.get("validate_error") or r.get("export_error") or "not run")
        mlp = par.get("encoder.mlpackage", {}).get("worst_rel_l2")
        lines.append(
            f"| {r['backbone']} | {r['params_224'] / 1e6:.2f}M / {r['params_32'] / 1e6:.2f}M | {r['macs_224'] / 1e9:.2f} G "
            f"| {r['macs_32'] / 1e6:.0f} M | {art.get('mlpackage', {}).get('mb', '-')} MB | "
            f"{art.get('mlmodel', {}).get('target', '-')} | {ok}{f' ({mlp:.1e})' if mlp is not None else ''} | "
            f"{r.get('train_e2e_img_s', r.get('bench_error', '-'))} | "
            f"{r.get('torch_img_s', '-')} / {r.get('onnxruntime_img_s', '-')} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--backbones", default=",".join(BACKBONES))
    ap.add_argument("--epochs", type=int, default=1, help="the chain's pretraining epochs (4 steps each)")
    ap.add_argument("--config", type=Path, help="pretrain with this YAML (its backbone swapped) instead of the tiny run")
    ap.add_argument("--skip-chain", action="store_true")
    ap.add_argument("--skip-bench", action="store_true")
    args = ap.parse_args()
    out = args.out.resolve()
    (out / "logs").mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.backbones.split(","):
        row = {"backbone": name}
        row["macs_224"], row["params_224"] = macs(name, 224)
        row["macs_32"], row["params_32"] = macs(name, 32)
        if not args.skip_chain:
            row.update(chain(name, out, args.epochs, args.config and args.config.resolve()))
        if not args.skip_bench:
            row.update(bench(name, out))
        row.update(inference(name, Path(row["run"]) if "run" in row else None))
        rows.append(row)
        with open(out / "backbones.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    (out / "backbones.md").write_text(table(rows) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
