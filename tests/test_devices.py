"""vcd_helpers.devices. Device splitting needs a fresh process: TensorFlow allows it
only before its devices are initialised, which this test process has already done."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

from vcd_helpers import devices


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_split_before_initialisation_gives_n_logical_cpus():
    result = _run("""
        from vcd_helpers import devices
        names = devices.split_physical_device(3)
        assert names == ['/device:CPU:0', '/device:CPU:1', '/device:CPU:2'], names
        assert devices.split_physical_device(3) == names   # re-running the cell is harmless
        print(devices.format_device_summary())
    """)
    assert result.returncode == 0, result.stderr
    assert "logical devices: /device:CPU:0, /device:CPU:1, /device:CPU:2" in result.stdout


def test_split_after_initialisation_raises_a_clear_error():
    result = _run("""
        import tensorflow as tf
        from vcd_helpers import devices
        tf.constant(1.0) + 1.0
        devices.split_physical_device(2)
    """)
    assert result.returncode != 0
    assert "was called after TensorFlow initialised its devices" in result.stderr
    assert "restart the kernel" in result.stderr


def test_split_rejects_bad_counts():
    with pytest.raises(ValueError, match="num_logical=0 is invalid"):
        devices.split_physical_device(0)
    with pytest.raises(ValueError, match="memory_limit_mb is required"):
        devices.split_physical_device(2, "GPU")


def test_device_summary_lists_this_machine():
    summary = devices.device_summary()
    assert summary["tensorflow"] == tf.__version__
    assert any(d.startswith("CPU") for d in summary["physical_devices"])


def test_code_version_counts_only_edits_to_the_code(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    (tmp_path / "vcd_helpers").mkdir()
    (tmp_path / "vcd_helpers" / "model.py").write_text("x = 1\n")
    (tmp_path / "chapter.ipynb").write_text("{}\n")
    git("init", "-q")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    clean = devices.code_version(tmp_path)
    assert len(clean["commit"]) == 40 and clean["dirty"] is False
    (tmp_path / "chapter.ipynb").write_text('{"outputs": []}\n')  # a notebook re-executed
    assert devices.code_version(tmp_path)["dirty"] is False
    (tmp_path / "vcd_helpers" / "model.py").write_text("x = 2\n")
    assert devices.code_version(tmp_path) == {"commit": clean["commit"], "dirty": True}


def test_compute_threads_follow_the_intra_op_setting(monkeypatch):
    monkeypatch.setenv("TF_NUM_INTRAOP_THREADS", "3")
    assert devices.compute_threads() == 3
    monkeypatch.delenv("TF_NUM_INTRAOP_THREADS")
    configured = tf.config.threading.get_intra_op_parallelism_threads()
    assert devices.compute_threads() == (configured or os.cpu_count())
