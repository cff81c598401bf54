from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder (../shared/data beside the repository); tests that need it skip without it."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data folder not found at {path}; these tests read the real benchmark files")
    return path
