"""Which notebook platform this kernel runs on, and what that platform offers.

Each platform is one rule record: the environment variables and marker files that identify
it, its persistent and scratch folders, and its documented session limits. A single
matcher walks the rules in priority order; the first rule with any matching signal wins,
and nothing matching means a local machine. Detection never raises.

The limits are the documented figures for the free tier; paid tiers and self-managed
instances are usually longer or configurable. Each figure names its source beside it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

from ipycloud.runtime.machine.cgroup import CgroupLimits, read_cgroup_limits
from ipycloud.runtime.machine.system_files import is_dir, is_file, read_text

_MINUTE = 60
_HOUR = 60 * _MINUTE
# Words in /proc/1/cgroup that show PID 1 lives in a container (podman's is "libpod").
_CONTAINER_WORDS = ("docker", "kubepods", "containerd", "lxc", "libpod")
_CONTAINER_FILES = (".dockerenv", "run/.containerenv")


@dataclass(frozen=True)
class Platform:
    """The notebook platform this kernel runs on, with its folders and limits."""

    key: str  # "colab", "kaggle", ..., or "local"
    name: str  # human name, e.g. "Google Colab"
    persistent_dir: Path | None  # survives the end of the session; None where nothing does
    scratch_dir: Path  # fast folder lost at session end
    session_limit_s: int | None  # hard maximum session length; None when none or unknown
    idle_timeout_s: int | None  # idle disconnect; None when none or unknown
    in_container: bool  # docker/k8s/podman markers or a cgroup limit
    evidence: tuple[str, ...]  # the signals that matched, e.g. ("env COLAB_RELEASE_TAG",)

    def to_dict(self) -> dict[str, object]:
        """The platform as a JSON-ready dict: paths as str, evidence as a list."""
        return {field.name: _jsonable(getattr(self, field.name)) for field in fields(self)}


@dataclass(frozen=True)
class _Rule:
    """How to recognise one platform, and what it offers once recognised."""

    key: str
    name: str
    persistent: str | None  # absolute, or "~/..." under the user's home; None: nothing persists
    scratch: str | None  # absolute; None: the system temp folder
    session_limit_s: int | None = None
    idle_timeout_s: int | None = None
    env: tuple[str, ...] = ()  # any of these set to a non-empty value
    env_values: tuple[tuple[str, str], ...] = ()  # (variable, exact value)
    files: tuple[str, ...] = ()  # absolute paths, looked up under ``root``
    dirs: tuple[str, ...] = ()


# Priority order: the first rule with any matching signal wins.
_RULES: tuple[_Rule, ...] = (
    _Rule(
        key="colab",
        name="Google Colab",
        persistent="/content/drive/MyDrive",  # where drive.mount("/content/drive") puts Drive
        scratch="/content",
        # Colab FAQ (research.google.com/colaboratory/faq.html): free notebooks "can run for
        # at most 12 hours, depending on availability and your usage patterns".
        session_limit_s=12 * _HOUR,
        # Unconfirmed: the FAQ only says idle VMs are disconnected, without a figure; 90 min
        # is the value reported by third-party write-ups.
        idle_timeout_s=90 * _MINUTE,
        env=("COLAB_RELEASE_TAG", "COLAB_BACKEND_VERSION", "COLAB_GPU"),
        # A bare /content could be anyone's folder; the sample data is Colab's own.
        dirs=("/content/sample_data",),
    ),
    _Rule(
        key="kaggle",
        name="Kaggle",
        # Kaggle docs (kaggle.com/docs/notebooks): "20 Gigabytes of auto-saved disk space
        # (/kaggle/working)"; the rest of the disk is scratch "that will not be saved".
        persistent="/kaggle/working",
        scratch="/tmp",
        # Same page, Technical Specifications: "12 hours execution time for CPU and GPU
        # notebook sessions and 9 hours for TPU notebook sessions".
        session_limit_s=12 * _HOUR,
        # Unconfirmed: "60 minute idle timeout limit" is quoted from kaggle.com/docs/
        # efficient-gpu-usage by a third party; the page itself was not read.
        idle_timeout_s=60 * _MINUTE,
        env=("KAGGLE_KERNEL_RUN_TYPE", "KAGGLE_URL_BASE", "KAGGLE_DATA_PROXY_TOKEN"),
        dirs=("/kaggle/working",),
    ),
    _Rule(
        key="paperspace",
        name="Paperspace Gradient",
        persistent="/storage",  # shared persistent storage; /notebooks holds the notebook repo
        scratch="/tmp",
        # Paperspace docs, "Free Instances" (github.com/Paperspace/Docs,
        # instances/free-instances.md): "Notebooks will automatically shutdown after 6 hours
        # per session". Paid machines use an auto-shutdown the user picks.
        session_limit_s=6 * _HOUR,
        env=("PAPERSPACE_NOTEBOOK_REPO_ID", "PAPERSPACE_CLUSTER_ID",
             "PAPERSPACE_METRIC_WORKLOAD_ID"),
    ),
    _Rule(
        key="studiolab",
        name="SageMaker Studio Lab",
        persistent="/home/studio-lab-user",  # the project folder, kept between sessions
        scratch="/tmp",
        # AWS docs, "Amazon SageMaker Studio Lab components overview" (docs.aws.amazon.com/
        # sagemaker/latest/dg/studio-lab-overview.html): CPU "up to 4 hours at a time with a
        # limit of 8 hours in a 24-hour period", GPU "up to 4 hours at a time". Both are
        # 4 h per session, so the figure does not depend on the compute type.
        session_limit_s=4 * _HOUR,
        env_values=(("HOME", "/home/studio-lab-user"),),
        dirs=("/home/studio-lab-user",),
    ),
    _Rule(
        key="sagemaker",
        name="SageMaker notebook instance",
        persistent="/home/ec2-user/SageMaker",  # the instance's EBS volume
        scratch="/tmp",
        # No limits: the instance runs until stopped; idle stop needs a lifecycle script.
        files=("/opt/ml/metadata/resource-metadata.json",),
        dirs=("/home/ec2-user/SageMaker",),
    ),
    _Rule(
        key="vertex",
        name="Vertex AI Workbench",
        persistent="/home/jupyter",  # the instance's data disk
        scratch="/tmp",
        # No fixed limits: idle shutdown is set per instance and can be turned off.
        env=("DL_ANACONDA_HOME",),
        files=("/opt/deeplearning/metadata/env_version",),
    ),
    _Rule(
        key="azureml",
        name="Azure ML compute instance",
        persistent="~/cloudfiles/code",  # the workspace file share mounted in the home
        scratch="/tmp",
        # No fixed limits: idle shutdown and schedules are set per compute instance.
        # Azure ML docs (how-to-r-deploy-r-model) use $CI_RESOURCE_GROUP and $CI_WORKSPACE
        # "from a compute instance".
        env=("CI_RESOURCE_GROUP", "CI_WORKSPACE"),
    ),
    _Rule(
        key="binder",
        name="Binder",
        persistent=None,  # nothing survives a Binder session
        scratch="/tmp",
        # mybinder.org user guidelines (mybinder.readthedocs.io/en/latest/about/
        # user-guidelines.html): "up to six hours of session time per user session" and
        # sessions "that have more than 10 minutes of inactivity" are shut down.
        session_limit_s=6 * _HOUR,
        idle_timeout_s=10 * _MINUTE,
        env=("BINDER_SERVICE_HOST", "BINDER_REPO_URL", "BINDER_LAUNCH_HOST", "BINDER_REF_URL"),
    ),
    _Rule(
        key="jupyterhub",
        name="JupyterHub",
        persistent="~",  # the user's home volume; culling and limits are set per hub
        scratch="/tmp",
        env=("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER", "JUPYTERHUB_SERVICE_PREFIX"),
    ),
)

_LOCAL = _Rule(key="local", name="Local machine", persistent="~", scratch=None)


def detect_platform(
    environ: Mapping[str, str] | None = None, root: str | os.PathLike[str] = "/",
    limits: CgroupLimits | None = None,
) -> Platform:
    """Detect the notebook platform from environment variables and marker files.

    ``environ`` defaults to ``os.environ``; ``root`` redirects where marker files are looked
    up (for tests), while the returned paths stay real absolute paths. ``limits`` are the
    cgroup limits already read, if the caller has them.
    """
    env = os.environ if environ is None else environ
    base = Path(root)
    rule, evidence = next(
        ((rule, found) for rule in _RULES if (found := _signals(rule, env, base))), (_LOCAL, ())
    )
    home = _home(env)
    return Platform(
        key=rule.key,
        name=rule.name,
        persistent_dir=_resolve(rule.persistent, home),
        scratch_dir=Path(rule.scratch or tempfile.gettempdir()),
        session_limit_s=rule.session_limit_s,
        idle_timeout_s=rule.idle_timeout_s,
        in_container=_in_container(env, base, limits),
        evidence=evidence,
    )


def _signals(rule: _Rule, environ: Mapping[str, str], root: Path) -> tuple[str, ...]:
    """Every signal of ``rule`` present here, in a readable form."""
    return (
        *(f"env {name}" for name in rule.env if _env(environ, name)),
        *(f"env {name}={value}" for name, value in rule.env_values if _env(environ, name) == value),
        *(f"file {path}" for path in rule.files if is_file(_under(root, path))),
        *(f"dir {path}" for path in rule.dirs if is_dir(_under(root, path))),
    )


def _in_container(environ: Mapping[str, str], root: Path, limits: CgroupLimits | None) -> bool:
    """Whether container markers, a container cgroup of PID 1 or a cgroup limit are present."""
    if _env(environ, "KUBERNETES_SERVICE_HOST"):
        return True
    if any(is_file(root / marker) for marker in _CONTAINER_FILES):
        return True
    pid1_cgroup = read_text(root / "proc/1/cgroup") or ""
    if any(word in pid1_cgroup for word in _CONTAINER_WORDS):
        return True
    limits = read_cgroup_limits(root) if limits is None else limits
    return limits.memory_limit is not None or limits.cpu_limit is not None


def _env(environ: Mapping[str, str], name: str) -> str:
    """The variable's value, or "" when it is unset or not a string."""
    value = environ.get(name)
    return value if isinstance(value, str) else ""


def _home(environ: Mapping[str, str]) -> Path | None:
    """The user's home: HOME from ``environ``, else the account's, else None."""
    home = _env(environ, "HOME")
    if home:
        return Path(home)
    try:
        return Path.home()
    except (RuntimeError, KeyError, OSError):
        return None


def _resolve(spec: str | None, home: Path | None) -> Path | None:
    """An absolute folder from a rule, with a leading "~" taken as the user's home."""
    if spec is None:
        return None
    if spec.startswith("~"):
        return None if home is None else home / spec[1:].lstrip("/")
    return Path(spec)


def _under(root: Path, path: str) -> Path:
    """Where the absolute ``path`` lies below ``root``."""
    return root / path.lstrip("/")


def _jsonable(value: object) -> object:
    """Paths as str and tuples as lists; everything else as it is."""
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value
