import os

import pytest

# Never touch the network, and keep caches (warm-up weights, converted models) inside the test session.
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session", autouse=True)
def _relax_cache(tmp_path_factory):
    # Warm-up caches are keyed by config hash, so sharing the user's cache is safe and saves minutes;
    # RELAX_TEST_CACHE isolates a CI run completely when set.
    if os.environ.get("RELAX_TEST_CACHE"):
        os.environ["RELAX_CACHE"] = os.environ["RELAX_TEST_CACHE"]
    yield


@pytest.fixture
def local_ray():
    """A private local Ray instance for one test (its own temp dir), always shut down."""
    from relax.cluster import RaySession

    with RaySession(num_cpus=4) as session:
        yield session


@pytest.fixture
def tmp_results(tmp_path):
    return tmp_path / "results"
