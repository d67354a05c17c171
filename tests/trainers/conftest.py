import pytest


@pytest.fixture(scope="session")
def single(tmp_path_factory):
    """The 2-step run of the Megatron trainer on one rank (test_megatron_group_cpu.py: the reference the worker
    groups must match), shared with test_megatron_trainer_cpu.py (the Actor trains with Megatron end to end)."""
    from test_megatron_group_cpu import _run

    return _run(tmp_path_factory.mktemp("single"), "single")
