"""Installed, Reverie is one top-level package, ``reverie``: the repository's flows/,
tasks/, models/ and deployments/ must not land on a user's path as ``models`` or
``tasks``, where they would collide with the user's own modules."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.store_independent(
    "what the package installs")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_wheel_holds_one_top_level_package_and_the_command(tmp_path: Path) -> None:
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--quiet", "--wheel-dir", str(tmp_path), str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = tmp_path.glob("reverie-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert "reverie" in tops and all(
        t == "reverie" or (t.startswith("reverie-") and t.endswith(".dist-info")) for t in tops)
    for module in ("flows/catalog.py", "tasks/dedup.py", "models/store.py",
                   "deployments/cli.py", "demo/sample/sample_store.jsonl",
                   "models/migrations/alembic.ini"):
        assert f"reverie/{module}" in names
    # Every package of the checkout is in the wheel (a new folder must be listed in
    # pyproject.toml, or an installed Reverie cannot import it).
    packages = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.rglob("__init__.py")
                if not {"tests", ".venv", "build"} & set(p.relative_to(ROOT).parts)}
    missing = {p for p in packages if f"reverie/{p}/__init__.py".replace("/./", "/")
               not in names and p != "."}
    assert not missing, f"packages missing from the wheel: {sorted(missing)}"
    assert not any(n.startswith("reverie/tests/") for n in names)
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "reverie = reverie.deployments.executable:console" in (
        zipfile.ZipFile(wheel).read(entry_points).decode())


def test_outside_the_checkout_only_reverie_is_importable(tmp_path: Path) -> None:
    probe = (
        "import importlib.util as u, reverie.flows.catalog as c; "
        "print(c.FLOWS['decay'].name, "
        "[m for m in ('flows', 'tasks', 'models', 'deployments') if u.find_spec(m)])"
    )
    done = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["decay", "[]"]
