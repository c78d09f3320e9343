"""The Python client's TLS, mutual TLS and bearer-token options against a real server process
(maskd_fake: maskd's configuration, gRPC port and security around the fake engine), with
certificates made at test time by tests/make_test_certs.sh (issue #14, Security)."""
import os
import subprocess

import grpc
import pytest

from conftest import _missing
from maskd_server import MaskdProcess, wait_serving

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
TOKEN = "python-test-token-7f3a9c"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    subprocess.run(["bash", os.path.join(REPO, "tests", "make_test_certs.sh"), str(d)], check=True)
    (d / "tokens.txt").write_text(f"# test tokens\n{TOKEN}\n")
    (d / "token.txt").write_text(f"\n{TOKEN}\n")
    return d


@pytest.fixture(scope="module")
def fake_binary(request):
    binary = request.config.getoption("--maskd-fake")
    if not binary or not os.access(binary, os.X_OK):
        _missing(f"maskd_fake binary not found ({binary!r}; pass --maskd-fake or set MASKD_FAKE_BIN)")
    return binary


def _server(binary, pki, *extra):
    return MaskdProcess(binary, None, ["--models-dir", "/nonexistent-maskd-test-models",
                                       "--tls-cert", str(pki / "server.pem"),
                                       "--tls-key", str(pki / "server.key"), *extra],
                        startup_timeout=60)


@pytest.fixture(scope="module")
def tls_token_server(fake_binary, pki):
    with _server(fake_binary, pki, "--auth-tokens", str(pki / "tokens.txt")) as server:
        yield server


def test_tls_and_token_are_served(tls_token_server, pki, monkeypatch):
    from maskd_client import MaskdClient
    monkeypatch.delenv("MASKD_TOKEN", raising=False)
    with MaskdClient(tls_token_server.target, timeout=10, tls_ca=str(pki / "ca.pem"),
                     token=TOKEN) as c:
        wait_serving(c, timeout=30)
        assert c.info().version
    with MaskdClient(tls_token_server.target, timeout=10, tls_ca=str(pki / "ca.pem"),
                     token_file=str(pki / "token.txt")) as c:
        assert c.info().version
    monkeypatch.setenv("MASKD_TOKEN", TOKEN)
    with MaskdClient(tls_token_server.target, timeout=10, tls_ca=str(pki / "ca.pem")) as c:
        assert c.info().version


def test_missing_or_wrong_token_is_unauthenticated_without_detail(tls_token_server, pki, monkeypatch):
    from maskd_client import MaskdClient
    monkeypatch.delenv("MASKD_TOKEN", raising=False)
    for token in (None, "wrong", TOKEN + "x"):
        with MaskdClient(tls_token_server.target, timeout=10, tls_ca=str(pki / "ca.pem"),
                         token=token) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.info()
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert e.value.details() == ""
            # Health stays open to load balancers by default.
            assert c.health() == "SERVING"


def test_plaintext_client_fails_against_tls(tls_token_server, monkeypatch):
    from maskd_client import MaskdClient
    monkeypatch.delenv("MASKD_TOKEN", raising=False)
    with MaskdClient(tls_token_server.target, timeout=5) as c:
        with pytest.raises(grpc.RpcError) as e:
            c.info()
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_mutual_tls(fake_binary, pki, monkeypatch):
    from maskd_client import MaskdClient
    monkeypatch.delenv("MASKD_TOKEN", raising=False)
    with _server(fake_binary, pki, "--tls-client-ca", str(pki / "ca.pem")) as server:
        with MaskdClient(server.target, timeout=5, tls_ca=str(pki / "ca.pem")) as c:
            with pytest.raises(grpc.RpcError) as e:
                c.info()
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        with MaskdClient(server.target, timeout=10, tls_ca=str(pki / "ca.pem"),
                         tls_cert=str(pki / "client.pem"), tls_key=str(pki / "client.key")) as c:
            wait_serving(c, timeout=30)
            assert c.info().version


def test_option_errors_name_the_option_and_never_the_token(pki, monkeypatch):
    from maskd_client import MaskdClient
    monkeypatch.delenv("MASKD_TOKEN", raising=False)
    with pytest.raises(ValueError, match="without TLS") as e:
        MaskdClient("127.0.0.1:1", token=TOKEN)
    assert TOKEN not in str(e.value)
    with pytest.raises(ValueError, match="tls_cert and tls_key"):
        MaskdClient("127.0.0.1:1", tls_cert=str(pki / "client.pem"))
    with pytest.raises(ValueError, match="tls_ca = '/nonexistent/ca.pem' cannot be read"):
        MaskdClient("127.0.0.1:1", tls_ca="/nonexistent/ca.pem")
