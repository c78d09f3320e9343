import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from maskd_server import MaskdProcess, wait_serving  # noqa: E402


def pytest_addoption(parser):
    parser.addoption("--maskd", default=os.environ.get("MASKD_BIN", ""),
                     help="path of the maskd binary (default: env MASKD_BIN)")
    parser.addoption("--maskd-fake", default=os.environ.get("MASKD_FAKE_BIN", ""),
                     help="path of tests' maskd_fake (maskd around the fake engine; default: env "
                          "MASKD_FAKE_BIN), for the TLS/token tests")


def _in_ci():
    return os.environ.get("CI") == "true"


def _missing(what):
    # Under CI=true a missing prerequisite is a failure; elsewhere a loud skip.
    if _in_ci():
        pytest.fail(f"{what} (required under CI=true)")
    pytest.skip(f"*** {what}: SKIPPING the Python client end-to-end tests ***")


@pytest.fixture(scope="session")
def golden_dir():
    root = os.environ.get("MASKD_GOLDEN_DIR", "")
    if not root:
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..",
                                            "shared", "golden"))
    tiny = os.path.join(root, "tiny")
    if not os.path.isfile(os.path.join(tiny, "sam_tiny.pth")):
        _missing(f"golden model not found at {tiny}/sam_tiny.pth (set MASKD_GOLDEN_DIR)")
    return tiny


@pytest.fixture(scope="session")
def maskd_target(request, golden_dir):
    binary = request.config.getoption("--maskd")
    if not binary or not os.access(binary, os.X_OK):
        _missing(f"maskd binary not found ({binary!r}; pass --maskd or set MASKD_BIN)")
    with MaskdProcess(binary, os.path.join(golden_dir, "sam_tiny.pth")) as server:
        from maskd_client import MaskdClient
        with MaskdClient(server.target, timeout=120) as c:
            wait_serving(c)
        yield server.target


@pytest.fixture()
def client(maskd_target):
    from maskd_client import MaskdClient
    with MaskdClient(maskd_target, timeout=120) as c:
        yield c
