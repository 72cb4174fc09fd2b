"""The ``container`` mark: tests that build and run images with a real engine (``make docker-test``)."""


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "container: builds and runs images with podman or docker (skipped without one)"
    )
