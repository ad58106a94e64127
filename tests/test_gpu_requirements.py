"""requirements/gpu.txt: what a bare GPU machine installs, checked against its image.

The machine's image already holds the packages below (its torch build among them); the file
pins only what the image lacks, so installing it never replaces the image's own builds.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")
ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "requirements" / "gpu.txt"
TRL_REQUIREMENTS = ROOT / "requirements" / "gpu-trl.txt"

# The image's packages (Python 3.12, x86-64, torch 2.11.0 / CUDA 13, transformers 5.17.0).
IMAGE_PACKAGES = """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs
botorch build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy
coverage cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython
diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools formulaic
frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities
linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl
meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti
nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile
nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client
propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks
pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels
sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile
tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics
torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
"""
IMAGE = set(IMAGE_PACKAGES.split())
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][A-Za-z0-9.+!-]*)$")


def normalise(name: str) -> str:
    """A distribution name as pip compares it (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path = REQUIREMENTS) -> dict[str, str]:
    """A requirements file as {normalised name: version}; fails on a line not pinned with ==."""
    pins: dict[str, str] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = PIN.match(line)
        assert match, f"{path.name} line {number} is not NAME==VERSION: {raw!r}"
        name = normalise(match.group(1))
        assert name not in pins, f"{path.name} names {name} twice"
        pins[name] = match.group(2)
    return pins


def test_every_line_is_pinned_exactly():
    assert len(pinned()) >= 10


def test_nothing_the_image_has_is_replaced():
    clash = sorted(set(pinned()) & {normalise(n) for n in IMAGE})
    assert not clash, f"the GPU image already has {clash}: leave them out of gpu.txt"


def test_mappa_base_dependencies_the_image_lacks_are_all_there():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    needed = {
        normalise(re.split(r"[<>=!~\[;\s]", dep, maxsplit=1)[0]) for dep in project["dependencies"]
    }
    missing = sorted(needed - {normalise(n) for n in IMAGE} - set(pinned()))
    assert not missing, f"gpu.txt lacks {missing}, which mappa needs and the GPU image lacks"


def test_vllm_stays_out():
    # One call to the machine carries 64 MiB; vLLM's wheel alone is 304 MB.
    assert "vllm" not in pinned()


def test_the_wheel_and_install_commands_read_this_file():
    assert "requirements/gpu.txt" in (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "requirements/gpu.txt" in (ROOT / "benchmarks" / "gpu_install.sh").read_text(
        encoding="utf-8"
    )


def test_the_trl_set_adds_trl_and_what_it_imports_and_nothing_the_image_or_gpu_txt_has():
    trl = pinned(TRL_REQUIREMENTS)
    assert {"trl", "datasets", "dill", "multiprocess"} <= set(trl)
    clash = sorted(set(trl) & ({normalise(n) for n in IMAGE} | set(pinned())))
    assert not clash, f"the GPU image or gpu.txt already has {clash}: leave them out of gpu-trl.txt"
    assert "vllm" not in trl


def test_the_trl_wheel_and_install_commands_read_the_trl_file():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert "gpu-wheels-trl: gpu-wheels" in makefile  # beside gpu.txt's wheels, not instead
    assert "requirements/gpu-trl.txt" in makefile
    install = (ROOT / "benchmarks" / "gpu_install.sh").read_text(encoding="utf-8")
    assert "requirements/gpu-trl.txt" in install
    assert "--trl)" in install
