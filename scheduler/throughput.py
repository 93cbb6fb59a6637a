"""Throughput of data-parallel training versus parallelism, per model.

Iteration time at ``n`` GPUs for a fixed global batch ``B``::

    t(n) = B/n * t_sample + t_fixed  +  s * [ 2(n-1)/n * bytes / bw(n) + 2(n-1) * alpha ]
           (compute of the per-GPU share)   (ring all-reduce; s >= 1 is link sharing)

``bw(n)`` is the intra-server bandwidth while the job fits in one server and
the per-GPU network bandwidth otherwise.  The mixture-of-experts model also
sends an all-to-all of ``a2a_bytes`` per iteration.  Throughput is ``B/t(n)``
samples/s; it rises and then flattens (or falls) as in EDL's Figure 1, and the
per-GPU efficiency ``thr(n) / (n thr(1))`` falls.

Per GPU type: a type's ``speed`` (:class:`scheduler.gpu_types.GpuType`; 1.0 for the
reference type) multiplies the compute rate (``t_sample / speed``) and leaves the
communication term as it is (the same NICs and NVLink), so a faster type gains
less from each GPU more and its curve flattens at fewer GPUs: it reaches its
network limit sooner (:func:`typed_model`).  Every function below that takes a
model name takes ``speed`` too (1.0: the reference figures, as before).

Per-model figures: parameter counts (fp32 bytes) and single-V100 fp32
training rates from ``MODELS.md``; where no figure was found the rate is our
estimate, marked below.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """One model: parameter bytes, seconds per sample on a reference V100, global batch."""

    name: str
    param_bytes: float
    samples_per_s: float
    batch: int
    a2a_bytes: float = 0.0


#: TensorFlow-benchmark models the papers used, and an all-to-all MoE model.
MODELS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec("resnet50", 102e6, 367.0, 256),
        ModelSpec("resnet101", 179e6, 220.0, 256),  # rate: our estimate between r50 and r152
        ModelSpec("resnet152", 242e6, 167.0, 256),
        ModelSpec("vgg16", 553e6, 249.0, 256),
        ModelSpec("vgg19", 575e6, 210.0, 256),  # rate: our estimate (vgg16 x 0.85)
        ModelSpec("inception3", 95e6, 273.0, 256),
        ModelSpec("alexnet", 244e6, 5132.0, 1024),
        ModelSpec("googlenet", 26.5e6, 1100.0, 256),  # rate: our estimate
        ModelSpec("bert", 1.32e9, 39.0, 64),  # bert-large, seq 128
        ModelSpec("moe", 1.0e9, 30.0, 64, a2a_bytes=400e6),  # our choice: dense 1 GB + a2a
    )
}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


@dataclass(frozen=True, slots=True)
class NetworkSpec:
    """Bandwidths in bytes/s: inside a server (NVLink ring) and per GPU NIC; per-hop latency."""

    gpus_per_server: int = 8
    intra_bytes_per_s: float = 50e9
    network_bytes_per_s: float = 12.5e9  # 100 Gbps, one NIC per GPU (the vClos testbed)
    alpha_s: float = 30e-6
    fixed_s: float = 0.005  # per-iteration framework overhead


DEFAULT_NETWORK = NetworkSpec()


def iteration_time(
    model: ModelSpec, n: int, net: NetworkSpec = DEFAULT_NETWORK, slowdown: float = 1.0
) -> float:
    """Seconds per iteration of the global batch on ``n`` GPUs (``slowdown`` scales communication)."""
    if n <= 0:
        raise ValueError("n must be positive")
    compute = model.batch / n / model.samples_per_s + net.fixed_s
    if n == 1:
        return compute
    bw = net.intra_bytes_per_s if n <= net.gpus_per_server else net.network_bytes_per_s
    ring = 2.0 * (n - 1) / n * model.param_bytes / bw + 2.0 * (n - 1) * net.alpha_s
    a2a = (n - 1) / n * model.a2a_bytes / bw if model.a2a_bytes else 0.0
    return compute + slowdown * (ring + a2a)


def throughput(
    model: ModelSpec, n: int, net: NetworkSpec = DEFAULT_NETWORK, slowdown: float = 1.0
) -> float:
    """Samples per second on ``n`` GPUs."""
    return model.batch / iteration_time(model, n, net, slowdown)


def contention_pace(
    model: ModelSpec, n: int, net: NetworkSpec = DEFAULT_NETWORK, slowdown: float = 1.0
) -> float:
    """Progress rate on ``n`` GPUs with communication slowed by ``slowdown``, relative to none."""
    if slowdown <= 1.0 or n <= 1:
        return 1.0
    return iteration_time(model, n, net) / iteration_time(model, n, net, slowdown)


def efficiency(model: ModelSpec, n: int, net: NetworkSpec = DEFAULT_NETWORK) -> float:
    """Per-GPU efficiency: throughput(n) / (n * throughput(1))."""
    return throughput(model, n, net) / (n * throughput(model, 1, net))


def get_model(name: str) -> ModelSpec:
    """A model by name; unknown names (e.g. the Tiresias trace's vgg11) map to the closest family."""
    if name in MODELS:
        return MODELS[name]
    low = name.lower()
    for prefix, target in (
        ("vgg", "vgg16"),
        ("resnet", "resnet50"),
        ("inception", "inception3"),
        ("bert", "bert"),
    ):
        if low.startswith(prefix):
            return MODELS[target]
    return MODELS["resnet50"]


def typed_model(model: ModelSpec, speed: float) -> ModelSpec:
    """``model`` on a GPU type ``speed`` times as fast as the reference at compute
    (communication unchanged); the model itself at 1.0."""
    return model if speed == 1.0 else replace(model, samples_per_s=model.samples_per_s * speed)


@lru_cache(maxsize=4096)
def speed_table(
    model_name: str, requested: int, top: int, gpus_per_server: int = 8, speed: float = 1.0
) -> tuple[float, ...]:
    """Progress rate on 0..top GPUs relative to ``requested`` GPUs (1.0 there), on a GPU
    type of ``speed``."""
    model = typed_model(get_model(model_name), speed)
    net = NetworkSpec(gpus_per_server=gpus_per_server)
    ref = throughput(model, requested, net)
    return (0.0, *(throughput(model, n, net) / ref for n in range(1, top + 1)))


@lru_cache(maxsize=4096)
def speedup_over_one(
    model_name: str, n: int, gpus_per_server: int = 8, speed: float = 1.0
) -> float:
    """throughput(n)/throughput(1): the job's contribution to cluster efficiency on n GPUs
    (of a GPU type of ``speed``)."""
    if n <= 0:
        return 0.0
    model = typed_model(get_model(model_name), speed)
    net = NetworkSpec(gpus_per_server=gpus_per_server)
    return throughput(model, n, net) / throughput(model, 1, net)


@lru_cache(maxsize=4096)
def type_speedup(model_name: str, n: int, gpus_per_server: int = 8, speed: float = 1.0) -> float:
    """How many times faster ``n`` GPUs of a type of ``speed`` train than ``n`` reference
    GPUs: ``speed`` on one GPU, less as communication weighs more."""
    model = get_model(model_name)
    net = NetworkSpec(gpus_per_server=gpus_per_server)
    return throughput(typed_model(model, speed), n, net) / throughput(model, n, net)


def curve(
    model_name: str, top: int, gpus_per_server: int = 8, speed: float = 1.0
) -> dict[int, float]:
    """throughput for 1..top GPUs of a type of ``speed`` (a profile a JobView can carry)."""
    model = typed_model(get_model(model_name), speed)
    net = NetworkSpec(gpus_per_server=gpus_per_server)
    return {n: throughput(model, n, net) for n in range(1, top + 1)}


def curve_on_type(
    curve: Mapping[int, float],
    model_name: str,
    from_speed: float,
    to_speed: float,
    gpus_per_server: int = 8,
) -> dict[int, float]:
    """``curve`` (samples/s by GPU count, measured or profiled on a GPU type of
    ``from_speed``) as it would be on a type of ``to_speed``.

    Each point is multiplied by how much faster ``n`` GPUs of the one type train the
    model than ``n`` of the other (:func:`type_speedup`, the model's curve with each
    type's speed): the job keeps its own scale (a measured curve is samples/s of its
    own program), and a faster type gains less from each GPU more, as the model says.
    The same speed: the curve as it is.
    """
    if from_speed == to_speed:
        return dict(curve)
    return {
        n: rate
        * type_speedup(model_name, n, gpus_per_server, to_speed)
        / type_speedup(model_name, n, gpus_per_server, from_speed)
        if n > 0
        else rate
        for n, rate in curve.items()
    }


def curves_by_type(
    curve: Mapping[int, float],
    model_name: str,
    measured_on: str,
    speeds: Mapping[str, float],
    gpus_per_server: int = 8,
) -> dict[str, Mapping[int, float]] | None:
    """A job's curve on each GPU type of ``speeds`` (type -> speed; a type not named is 1.0):
    ``curve`` itself on ``measured_on``, the type it was measured on ("" or a type not in
    ``speeds``: the reference, 1.0), :func:`curve_on_type` on every other type.  None when
    every type runs at ``measured_on``'s speed (one curve serves them all:
    ``JobView.throughput`` alone)."""
    own = speeds.get(measured_on, 1.0)
    if all(speed == own for speed in speeds.values()):
        return None
    return {
        name: curve
        if speed == own
        else curve_on_type(curve, model_name, own, speed, gpus_per_server)
        for name, speed in speeds.items()
    }
