"""`dfim train` refuses a batch that cannot fit memory and warns when validation has no files (issue 35)."""

from __future__ import annotations

import shutil
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from dfim.commands import train as train_command
from dfim.commands.checks import InputError
from dfim.engine.training.data import Root, build
from dfim.engine.training.examples import ExampleSettings
from dfim.engine.training.train import make_val_batches
from tests.engine.training.test_train_smoke import TOKENIZER_JSON, parse

GIB = 1024**3


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("shards")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    build(
        out, TOKENIZER_JSON, [Root(stdlib / "json", "dir")], workers=1, val_fraction=0.5, log=lambda *_: None
    )
    return out


def test_a_cpu_run_whose_batch_cannot_fit_is_refused_with_a_batch_that_does(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(train_command, "available_memory", lambda device: (20 * GIB, "available RAM"))
    args = parse("--data", str(data_dir), "--out", str(tmp_path / "run"), "--model-config", "small")
    args.device = "cpu"
    with pytest.raises(InputError, match=r"--batch-size 128: .* GiB of available RAM; try --batch-size 32"):
        train_command.check_args(args)
    args.batch_size = 32
    train_command.check_args(args)  # fits: no refusal
    args.batch_size, args.skip_memory_check = 128, True
    train_command.check_args(args)  # the user's word


def test_a_model_that_cannot_fit_one_example_says_so(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(train_command, "available_memory", lambda device: (GIB // 100, "available RAM"))
    args = parse("--data", str(data_dir), "--out", str(tmp_path / "run"), "--model-config", "small")
    with pytest.raises(InputError, match="even one example does not fit"):
        train_command.check_args(args)


def test_the_default_small_model_on_cpu_needs_more_than_a_laptop():
    """The estimate that refuses batch 128 on a CPU (OOM-killed at 128 on a 23 GiB machine)."""
    from dfim.engine.training.presets import model_config

    config = model_config("small", 8192, 128)
    need = train_command.step_memory(config, 15_500_000, 128, 512, 128, gpu=False)
    assert 24 * GIB < need < 64 * GIB
    assert train_command.step_memory(config, 15_500_000, 128, 512, 128, gpu=True) < 20 * GIB


def test_no_validation_files_is_a_loud_warning(data_dir, tmp_path, capsys):
    empty = tmp_path / "data"
    shutil.copytree(data_dir, empty)
    np.save(empty / "val_docs.npy", np.zeros((0, 3), dtype=np.int64))
    args = parse(
        "--data", str(empty), "--out", str(tmp_path / "run"), "--batch-size", "2", "--val-batches", "1"
    )
    settings = ExampleSettings(context_tokens=128, buckets=(16,))
    assert len(make_val_batches(args, settings, str(TOKENIZER_JSON))) == 1
    assert "no validation files" in capsys.readouterr().err
    make_val_batches(
        parse("--data", str(data_dir), "--out", "x", "--batch-size", "2", "--val-batches", "1"),
        settings,
        str(TOKENIZER_JSON),
    )
    assert "WARNING" not in capsys.readouterr().err  # a split with files: no warning
