"""Write the environment as a self-contained Space folder: ``openenv push`` and ``openenv validate`` take it as is.

The environment's Dockerfile builds from the repository root (it installs this package from source
beside the environment). A Space, and OpenEnv's validator, build from the folder they are given. So
the folder holds exactly what the Dockerfile copies -- read from its ``COPY`` lines, less what its
``.dockerignore`` excludes -- in the same layout, with the Dockerfile at its root (its context is
now the folder), the environment's README as the Space card, and a manifest that declares how
OpenEnv's runtime checks run an episode (``validation.execution`` and ``validation/runtime.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from openenv_harness.space.dockerfile import copied_sources, ignore_patterns, ignored, parse_dockerfile

ENV_DIR = "envs/harness_env"
DOCKERFILE = f"{ENV_DIR}/server/Dockerfile"
#: one episode OpenEnv's runtime graders run: the embedded reference engine solves fix-add with Pi
RUNTIME_PLAN: dict[str, Any] = {
    "plan_schema_version": "1",
    "reset": {"episode_id": "openenv-validate-0", "seed": 0, "options": {"task_id": "fix-add", "harness": "pi"}},
    "actions": [{"timeout_s": 300.0}],
}


class SpaceBuildError(RuntimeError):
    """The folder cannot be built (no source checkout, an occupied destination, a missing source)."""


def source_root() -> Path:
    """The checkout this package runs from (a Space is built from sources, not from an installed wheel)."""
    root = Path(__file__).resolve().parents[2]
    if not (root / DOCKERFILE).is_file() or not (root / "pyproject.toml").is_file():
        raise SpaceBuildError(f"no source checkout at {root} (it needs {DOCKERFILE}): build the Space from a clone "
                              "of the repository")
    return root


def space_sources(root: Path) -> list[str]:
    """Every file the image's build context provides to its ``COPY`` lines, context-relative and sorted."""
    dockerfile = root / DOCKERFILE
    patterns = ignore_patterns(dockerfile.with_name(dockerfile.name + ".dockerignore"))
    files: list[str] = []
    for source in copied_sources(parse_dockerfile(dockerfile)):
        path = root / source
        if not path.exists():
            raise SpaceBuildError(f"the Dockerfile copies {source}, which {root} does not have")
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [rel for p in candidates if not ignored(rel := p.relative_to(root).as_posix(), patterns)]
    return sorted(set(files))


def space_manifest(root: Path) -> dict[str, Any]:
    """The environment's manifest, with the runtime binding OpenEnv's validator needs to run an episode."""
    manifest = yaml.safe_load((root / ENV_DIR / "openenv.yaml").read_text())
    validation = dict(manifest.get("validation") or {})
    validation["execution"] = {"kind": "openenv_ws", "probe_path": "validation/runtime.json",
                               "dockerfile": "Dockerfile", "context": "."}
    return {**manifest, "validation": validation}


def build_space(out: Path, root: Path | None = None) -> list[str]:
    """Write the Space folder at ``out`` (absent or empty) and return the files written, sorted."""
    root = root or source_root()
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SpaceBuildError(f"{out} exists and is not an empty folder")
    files = space_sources(root)
    for rel in files:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    written = list(files)
    extra = {
        "Dockerfile": (root / DOCKERFILE).read_text(),
        "openenv.yaml": yaml.safe_dump(space_manifest(root), sort_keys=False),
        "validation/runtime.json": json.dumps(RUNTIME_PLAN, indent=2) + "\n",
    }
    # the Space card: the environment's README (its front matter says sdk: docker, app_port: 8000); the
    # package's pyproject names README.md as its readme, and the card serves there too
    extra["README.md"] = (root / ENV_DIR / "README.md").read_text()
    for rel, text in extra.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(text)
    return sorted(set(written) | set(extra))
