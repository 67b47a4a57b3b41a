import os
from pathlib import Path

from linmem._threads import configure_threads

# the `linmem` command's thread defaults, before torch loads: on a machine where another process
# is busy (a search in the background, a shared CI host) the suite then runs at a fair share of
# the CPU instead of 5-20x slower (benchmarks/contention.py)
configure_threads()

import pytest  # noqa: E402
import torch  # noqa: E402

# Triton's kernels (linmem.ops.gpu) run on CPU tensors under its interpreter where no GPU is, as
# CI runs them (tests/test_ops_gpu.py); Triton reads the switch when it is first imported
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from linmem.data import load_polyphonic  # noqa: E402

# CI and the tests read the real data from the shared folder beside the checkout.
DATA_DIR = Path(os.environ.get(
    "LINMEM_TEST_DATA", Path(__file__).resolve().parents[1].parent / "shared/data/polyphonic"))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not (DATA_DIR / "JSB_Chorales.mat").is_file():
        pytest.fail(f"the polyphonic data is not in {DATA_DIR}; set LINMEM_TEST_DATA")
    return DATA_DIR


@pytest.fixture(scope="session")
def jsb(data_dir):
    return load_polyphonic("jsb", root=data_dir)


@pytest.fixture(scope="session")
def small(jsb):
    """A slice of JSB Chorales (24 training, 10 validation, 10 test sequences): a training run
    takes a second or two."""
    return {"train": jsb["train"][:24], "valid": jsb["valid"][:10], "test": jsb["test"][:10]}
