"""Thread counts sized for the work (precisionlab.runtime.threads) and the --threads option."""

import pytest

from helpers import cli
from precisionlab.runtime import threads
from precisionlab.errors import UsageError
from precisionlab.experiments import compare


def test_small_work_gets_one_thread_and_large_work_at_most_the_cores():
    assert threads.for_work(0) == 1
    assert threads.for_work(threads.FLOPS_PER_THREAD - 1) == 1
    assert threads.for_work(2 * 4096**3) == threads.cores()
    # the embedded model's decoding step and compare op's default shapes are small
    assert threads.for_work(compare.op_flops("softmax", (64, 4096))) == 1
    assert threads.for_work(compare.op_flops("matmul", (256, 1024, 256))) <= 2


def test_override_and_its_validation():
    assert threads.choose(3, 1.0) == 3
    assert threads.choose(None, 1.0) == 1
    with pytest.raises(UsageError, match="--threads must be at least 1"):
        threads.choose(0, 1.0)
    assert threads.workers(10, 1) == 1 and threads.workers(1) == 1


def test_torch_scope_restores_the_count():
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    with threads.torch_scope():
        assert threads.fit_torch(None, 1.0) == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


@pytest.mark.parametrize("args", [["compare", "model", "--steps", "1", "--threads", "0"],
                                  ["compare", "op", "softmax", "--device", "cpu", "--threads", "-1"],
                                  ["tf32", "--device", "cpu", "--threads", "0"]])
def test_threads_below_one_is_a_usage_error(args):
    r = cli(*args)
    assert r.code == 2 and "--threads must be at least 1" in r.err and r.err.count("\n") == 1
