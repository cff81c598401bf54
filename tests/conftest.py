import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder ($BIPRM_DATA, else ../shared/data beside the repository, as the commands read it); tests
    that need it skip without it."""
    from biprm.config import default_data_root

    path = Path(default_data_root())
    if not path.is_dir():
        pytest.skip(f"shared data folder not found at {path}; these tests read the real benchmark files")
    return path


@pytest.fixture(scope="module")
def backbone() -> str:
    """The tiny built-in backbone's folder."""
    from biprm.backbones import resolve_backbone

    return resolve_backbone("tiny")


@pytest.fixture(scope="module")
def bi_scorer():
    """A Scorer around an untrained tiny `bi` model (seeded): scores are arbitrary but fixed, enough to compare
    paths."""
    import torch

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone
    from biprm.scoring import Scorer

    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    torch.manual_seed(0)
    return Scorer(from_backbone(backbone, tok, mode="bi").eval(), tok)


def scored(scorer, trajs):
    """Scores of `trajs`, encoded through the scorer first (as every caller does)."""
    encs, _ = scorer.encode(trajs)
    return scorer.score(encs, progress=False)


def study_encoder(max_length: int):
    """The encoder a study builds once for all its runs (`replication.recipe.prepare`): the tiny backbone's
    tokenizer with the step tag added."""
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.data.encoding import Encoder, add_step_tag

    tokenizer = load_tokenizer(resolve_backbone("tiny"))
    return Encoder(tokenizer, add_step_tag(tokenizer), max_length)


def weights(path: Path) -> dict:
    """The tensors of `path`/model.safetensors."""
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


@contextlib.contextmanager
def serving(app) -> Iterator[str]:
    """`app` served by uvicorn on a free local port in a thread; yields its URL once it listens. A server that cannot
    start (another process took the port) fails the test instead of hanging it."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                pytest.fail(f"the test server on port {port} did not start")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


LAUNCHERS = {  # several CPU processes (gloo), each on a free port
    "torchrun": ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node"],
    # on a CPU, accelerate starts several processes only with --multi_gpu (else one, whatever --num_processes says)
    "accelerate": ["-m", "accelerate.commands.launch", "--multi_gpu", "--main_process_port", "0", "--num_processes"],
}


def launch(
    args: list[str], processes: int = 1, launcher: str = "torchrun", timeout: int = 600
) -> subprocess.CompletedProcess:
    """`python -m <args>` in one plain process, or in `processes` through `launcher`; one thread each, as the
    machine's cores are shared. Asserts nothing: callers check the return code."""
    start = [*LAUNCHERS[launcher], str(processes)] if processes > 1 else []
    return subprocess.run(
        [sys.executable, *start, "-m", *args],
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
