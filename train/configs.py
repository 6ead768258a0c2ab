"""The options of the stages that train or measure an encoder (pretrain, linear-eval, bench): one dataclass per
stage, each field with its default and the one-line reason for it (the shipping stages' are export/configs.py's).

Torch-free on purpose, with the few names their choices need: the CLI builds its flags from these classes, and
`pipeline --help` or a wrong flag must answer at once instead of after torch and torchvision load (seconds). The
method and backbone names come from their registries, which answer without importing torch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from core.config import Range, opt
from train import methods
from train.backbones import BACKBONES, MAX_IMAGE_SIZE  # the smallest side is each backbone row's

# each backbone row's steps from which compiling repays, and the methods compiled by default on it (its compile_repays
# and compile_methods: train/backbones.Backbone)
_COMPILE_REPAYS = ", ".join(f"{b.title} from {b.compile_repays:,} for {'/'.join(b.compile_methods)}"
                            for b in BACKBONES.values() if b.compile_repays)

AUGMENT_MODES = ("auto", "cpu", "device")  # where views are made (train.augment.augment_mode)
PREPROCESS_CHOICES = ("auto", "torch", "coreml")  # per-image preprocessing backend (train.preprocess)
RECIPE_CHOICES = ("auto", "small", "paper")  # hyper-parameter sets by scale (train.recipes)



def by_recipe(small: str, paper: str) -> str:
    """The help of an option the recipe fills when it is unset, with what each recipe sets it to. The values are
    train/recipes.py's (tests/pipeline/test_help.py holds them equal): importing them here would load torch."""
    return f"None = the recipe's (--recipe): small: {small}; paper: {paper}"


WEIGHTED_K = 200  # the protocol's k (Wu et al. 2018), used by every SSL paper that reports kNN accuracy
TEMPERATURE = 0.1  # the protocol's T: exp(sim / 0.1) makes the nearest neighbours count far more than the 200th
MAJORITY_K = 20  # the plain vote most papers list beside the weighted one


@dataclass
class PretrainConfig:
    method: str = opt("simclr", "SSL method", choices=methods.names())
    recipe: str = opt("auto", "hyper-parameters every unset option gets: small = the CIFAR-size benchmarks' (SGD; train/recipes.py), paper = the papers' ImageNet ones (LARS); auto = paper only at ImageNet scale (>= 100,000 train images, >= 30,000 steps, >= 65 px), else small. A flag or --config value always wins", choices=RECIPE_CHOICES)
    data: str = opt("digits", "data SPEC: photos (patches of ten photographs that ship inside scikit-learn, matplotlib and scikit-image) | digits | folder:PATH | cifar10:PATH | cifar100:PATH | synthetic:N")
    backbone: str = opt("resnet18", "torchvision network, random init, its classifier removed (ViT-S/Ti: DeiT's sizes); for an app: mobilenet_v3_large (6 MB in fp16) or mobilenet_v3_small (2 MB), with SimCLR (README: which backbone)", choices=tuple(BACKBONES))
    small_stem: str = opt("auto", "keep small images' pixels: ResNet 3x3 stride-1 stem without max-pool; MobileNetV3/EfficientNet first conv at stride 1; ConvNeXt 2x2 stride-2 stem; ViT patch 4 (the side a multiple of it); auto = on for images <= 64 px", choices=("auto", "on", "off"))
    image_size: int = opt(32, "training crop side in pixels; 32 = CIFAR's, where the small recipes were measured. On a "
                              "CPU it is slow: ~15 s of CPU time per step of 128 (2 free cores: the default 120 steps "
                              "take 15-20 min, hours on a busy machine; `make all` trains MobileNetV3-Small on photos at 64 px in minutes); "
                              "`pipeline bench --device cpu` times a step on yours", range=Range(1, MAX_IMAGE_SIZE))
    store_size: int = opt(0, "side at which images are decoded and kept; 0 = image size for array datasets, 8/7 x for folders", range=Range(0, 4096))
    epochs: int = opt(10, "passes over the train split", range=Range(1, 100_000))
    batch_size: int = opt(128, "global batch: images per step over all processes (each of N GPUs takes batch/N; each image gives its method's views: two for the three here)", range=Range(2, 65_536))
    lr: float | None = opt(None, "base learning rate per 256 images; " + by_recipe(
        "simclr 0.12, byol 0.03, mocov3 0.3", "simclr 0.3, byol 0.2, mocov3 0.6"), range=Range(0, 100, lo_open=True))
    lr_scaling: str = opt("linear", "peak lr = lr x batch/256 (linear, as the papers) or lr x sqrt(batch/256)", choices=("linear", "sqrt", "none"))
    optimizer: str | None = opt(None, by_recipe("sgd (momentum 0.9)", "lars") + "; auto picks small below ImageNet "
                                "scale, so sgd for any set of under 100,000 images", choices=("lars", "sgd", "adamw"))
    lars_eta: float = opt(0.001, "LARS trust coefficient: each weight matrix moves by about lr x eta of its norm per step (the papers' 0.001 suits their 100k+ steps; small data trains for a few thousand and wants more, e.g. 0.02)", range=Range(0, 1, lo_open=True))
    weight_decay: float | None = opt(None, by_recipe("simclr 5e-4, byol 2e-3, mocov3 5e-4", "simclr 1e-6, byol 1.5e-6, mocov3 1e-6"), range=Range(0, 1))
    warmup_epochs: float | None = opt(None, "linear warm-up before the cosine decay; None = the papers' 10 epochs, at most a tenth of the run", range=Range(0, 100_000))
    temperature: float | None = opt(None, "softmax temperature (SimCLR, MoCo v3); " + by_recipe(
        "simclr 0.5, mocov3 0.2", "simclr 0.5, mocov3 1"), range=Range(0, 100, lo_open=True))
    proj_dim: int | None = opt(None, "projector output size; " + by_recipe(
        "simclr 128, byol 256, mocov3 256", "simclr 128, byol 256, mocov3 256"), range=Range(1, 65_536))
    proj_hidden_dim: int | None = opt(None, "projector hidden size; " + by_recipe(
        "simclr 512, byol 1024, mocov3 4096", "simclr 2048, byol 4096, mocov3 4096"), range=Range(1, 65_536))
    pred_hidden_dim: int | None = opt(None, "predictor hidden size (BYOL, MoCo v3); " + by_recipe(
        "byol 1024, mocov3 4096", "byol 4096, mocov3 4096"), range=Range(1, 65_536))
    pred_lr: float | None = opt(None, "the predictor's learning rate as a multiple of --lr (BYOL, MoCo v3); " + by_recipe(
        "byol 10, mocov3 1", "byol 1, mocov3 1"), range=Range(0, 100, lo_open=True))
    proj_last_bn: str | None = opt(None, "BYOL only: BatchNorm without affine on the projector's output, as MoCo v3's "
                                         "and SimSiam's projectors; " + by_recipe("byol on", "byol off"), choices=("on", "off"))
    crop_min_scale: float | None = opt(None, "smallest random crop as a share of the image's area (RandomResizedCrop's "
                                             "scale[0]); " + by_recipe("simclr 0.08, byol 0.25, mocov3 0.25",
                                                                       "simclr 0.08, byol 0.08, mocov3 0.08"), range=Range(0, 1, lo_open=True))
    solarize_p: float | None = opt(None, "chance that the second view is solarized (the first view never is); " + by_recipe(
        "simclr 0, byol 0.2, mocov3 0.2", "simclr 0, byol 0.2, mocov3 0.2"), range=Range(0, 1))
    momentum_base: float | None = opt(None, "EMA start of the momentum network, rises to 1 on a cosine (BYOL, MoCo v3); "
                                      + by_recipe("byol 0.9, mocov3 0.9", "byol 0.99, mocov3 0.99"), range=Range(0, 1))
    queue_size: int | None = opt(None, "MoCo v3 only: extra negatives from a ring buffer of past keys (0 = none); "
                                 + by_recipe("mocov3 0", "mocov3 0"), range=Range(0, 1 << 20))
    val_fraction: float = opt(0.1, "held out for evaluation, never trained on (CIFAR uses its own test set)", range=Range(0, 1, hi_open=True))
    device: str = opt("auto", "auto picks mps > cuda > cpu", choices=("auto", "cpu", "cuda", "mps"))
    precision: str = opt("auto", "auto: bf16 on CUDA, fp16 backbone on MPS, fp32 on CPU; fp32 everywhere to debug; fp64 (CPU only): float64 weights and activations, for numbers that must agree across CPUs (float32 sums in another order per instruction set, and a few steps amplify that; the tests' pinned runs use it)", choices=("auto", "fp32", "fp64"))
    num_workers: int = opt(-1, "augmentation workers (cpu augment); -1 = one per spare core, up to 8", range=Range(-1, 64))
    augment: str = opt("auto", "where views are made: device = batched on the training GPU, cpu = per image in DataLoader workers (the reference); auto = device on cuda/mps", choices=AUGMENT_MODES)
    preprocess: str = opt("auto", "--augment cpu: where each view's jitter, grayscale and blur run: coreml = Core ML models on the Neural Engine/GPU (macOS), torch = uint8 Pillow/numpy ops in the workers; auto = coreml where Core ML runs", choices=PREPROCESS_CHOICES)
    channels_last: str = opt("auto", "NHWC memory format: about 2x faster bf16 convs on CUDA tensor cores; auto = on for CUDA only", choices=("auto", "on", "off"))
    cuda_graphs: str = opt("auto", "replay the step's forward and backward as CUDA graphs (one process with views of one size: the whole loss, momentum branch, heads and every gradient in one graph; otherwise the backbone's forward and backward), and the device views as one, instead of launching their hundreds of kernels from Python every step (the host, not the GPU, limits small-image steps on a fast GPU: docs/benchmarks.md); auto = on for CUDA (and, with several processes, without --sync-bn); a compiled backbone's kernels are captured", choices=("auto", "on", "off"))
    compile: bool | None = opt(None, f"torch.compile the backbone's forward, its kernels captured in the CUDA graphs. None = on where measured faster and trained to eager's kNN: one process with CUDA graphs on, a backbone that pays (ResNet-18, ResNet-50: +20-44 % end to end on one H200; MobileNetV3-Small, -Large, EfficientNet-B0: +26-32 % on one H100), a method whose 100-epoch runs compiled on it reached eager's kNN, and a run long enough to repay 20-50 s of compiling on a cold cache (epochs x steps an epoch at least the row's count: {_COMPILE_REPAYS}); the start line says what kept a run eager; cached on disk for the next run of the same shapes; --no-compile = eager (docs/benchmarks.md)")
    sync_bn: bool = opt(False, "several GPUs: BatchNorm statistics over the global batch (SimCLR's choice), at one all-reduce per BN layer; CUDA only")
    seed: int = opt(0, "seeds init, split, order and every augmentation draw", range=Range(0, 2**32 - 1))
    max_steps: int = opt(0, "stop after this many steps in all, counted from the run's start (0 = every epoch); at most the steps of --epochs: more is refused, as the learning-rate schedule spans the epochs (raise --epochs to train longer); a run cut short goes on exactly with --resume --max-steps 0", range=Range(0, 10**9))
    log_every: int = opt(10, "steps between metrics.jsonl lines", range=Range(1, 10**9))
    save_every: int = opt(0, "also keep checkpoints/epoch_NNNN.pt every N epochs (0 = only last.pt)", range=Range(0, 100_000))
    checkpoint_every_s: float = opt(120.0, "write checkpoints/last.pt at the first epoch end this many seconds after the last write, and at the end; a crash loses at most this much training (0 = every epoch: on small data one write, ~190 MB for BYOL, took longer than an epoch)", range=Range(0, 10**7))
    knn_every: int = opt(0, "kNN top-1 of val against train into metrics.jsonl every N epochs (0 = off: costs a pass over the data)", range=Range(0, 100_000))



@dataclass
class EvalConfig:
    data: str = opt("", "labelled data SPEC to evaluate on; empty = the run's own data on its recorded split")
    device: str = opt("auto", "where features are extracted; always fp32", choices=("auto", "cpu", "cuda", "mps"))
    labels_per_class: int = opt(0, "also probe with only K labelled train images per class (0 = off; K >= 2)")
    label_draws: int = opt(5, "independent K-per-class draws averaged: one draw of a few images is mostly noise")
    batch_size: int = opt(256, "images per feature-extraction batch; memory only (eval-mode BN: no batch effects)")
    holdout_fraction: float = opt(0.2, "part of each train class held out to choose C (k-fold when a class is small)")
    knn_k: int = opt(WEIGHTED_K, "neighbours of the weighted kNN (Wu et al. 2018, as SSL papers report it)")
    knn_temperature: float = opt(TEMPERATURE, "T of the weighted kNN's exp(sim / T) votes")
    majority_k: int = opt(MAJORITY_K, "neighbours of the plain majority-vote kNN")
    seed: int | None = opt(None, "seed of the held-out part/folds and of the K-per-class draws; None = the run's seed")



def as_in(cls, name: str, default=dataclasses.MISSING):
    """Another config's option, reused as it is declared there (its default unless given, reason, choices): an
    option two stages share is declared once."""
    f = cls.__dataclass_fields__[name]
    return dataclasses.field(default=f.default if default is dataclasses.MISSING else default, metadata=f.metadata)


@dataclass
class BenchConfig:
    # The options of the step it times are pretraining's own (PretrainConfig, above).
    method: str = as_in(PretrainConfig, "method")
    backbone: str = as_in(PretrainConfig, "backbone")
    image_size: int = as_in(PretrainConfig, "image_size")
    batch_size: int | None = opt(None, "global batch; None = 512 on a GPU, 8 on a CPU (finishes within a minute on 2 cores)",
                                 range=PretrainConfig.__dataclass_fields__["batch_size"].metadata["range"])  # its bounds
    store_size: int = opt(0, "side of the stored images; 0 = the crop side up to 64 px (CIFAR-like), 8/7 of it above (ImageNet-like)")
    device: str = as_in(PretrainConfig, "device")
    augment: str = as_in(PretrainConfig, "augment")
    num_workers: int = as_in(PretrainConfig, "num_workers")
    channels_last: str = as_in(PretrainConfig, "channels_last")
    compile: bool = as_in(PretrainConfig, "compile")
    cuda_graphs: str = as_in(PretrainConfig, "cuda_graphs")
    precision: str = as_in(PretrainConfig, "precision")
    warmup: int | None = opt(None, "untimed steps before each phase (cuDNN autotuning, allocator growth, worker start); None = 10 on a GPU, 1 on a CPU", range=Range(0))
    windows: int | None = opt(None, "timed windows per phase, median reported; None = 5 on a GPU, 3 on a CPU", range=Range(1))
    window_steps: int | None = opt(None, "steps per window; None = 20 on a GPU, 1 on a CPU", range=Range(1))
    seed: int = as_in(PretrainConfig, "seed")
    profile: str = opt("", "CUDA: also record one window of each phase with torch.profiler into this folder (Chrome traces) and report GPU-busy %, host ms per step and the top kernels: tells a host-bound step from a GPU-bound one")
    preprocess: str | None = opt(None, "instead of training, time each per-image preprocessing op (jitter, grayscale, blur, a training item's views) on this backend: torch, or coreml (macOS); batch x window-steps images per window", choices=("torch", "coreml"))
