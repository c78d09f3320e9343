def pytest_addoption(parser):
    parser.addoption("--maskd", required=True, help="the maskd binary")
    parser.addoption("--maskctl", default=None, help="the maskctl binary")
    parser.addoption("--artefacts", default=None, help="folder for screenshots and logs")
