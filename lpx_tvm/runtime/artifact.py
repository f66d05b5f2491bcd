"""Self-contained compiled-model artifacts: one folder, reloadable in a fresh process.

Layout of ``NAME/`` (see docs/artifact.md):

- ``manifest.json``: format version, the machine config (whole, so a user's own machine
  file need not travel beside it), precision, model inputs and outputs, regions (with
  their layer names), the offload report and the tuning summary (in the form the
  report has them, :mod:`.report`);
- ``cpu.so``: the Relax VM executable (CPU ops and the extern calls to the regions);
- ``regions/<region>.lpx``: each region's LPX program binary.

Files are written into a temporary folder next to the destination and moved into place
at the end, so a killed compile never leaves a half-written artifact under the name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile

import tvm
from tvm import relax

from ..errors import LPXError
from ..files import user_mode
from ..machine.config import parse_config
from ..machine.encoding import load_program, save_program
from .executable import LPXExecutable
from .compiled_region import CompiledRegion
from .report import Offload

FORMAT = "lpx-artifact"
VERSION = 1


class ArtifactError(LPXError):
    """A missing, incomplete or incompatible artifact."""


def _check_destination(path: str):
    """Refuse to write over what is not ours: ``path`` may be absent, an empty folder, or
    an artifact folder (which is replaced)."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ArtifactError(f"{path}: exists and is not a folder; an artifact is a folder: choose another path")
    entries = os.listdir(path)
    if not entries:
        return
    manifest = os.path.join(path, "manifest.json")
    try:
        with open(manifest, encoding="utf-8") as f:
            ours = json.load(f).get("format") == FORMAT
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise ArtifactError(f"{path}: a folder that is not an LPX artifact and not empty ({len(entries)} "
                            "entries); refusing to replace it: choose a new or empty folder")


def save_artifact(exe: LPXExecutable, inputs: list, outputs: list, path: str):
    """Write an executable and its model's ``inputs`` ``[(name, shape, dtype)]`` and
    ``outputs`` (names) to the folder ``path``.

    ``path`` must be new, an empty folder or an artifact: an artifact is replaced (the new
    one is written beside it and moved in; the old one is removed only once the new one is
    in place), anything else is refused and left as it is. The folder gets the user's
    umask, as any file the tool writes.
    """
    path = os.path.abspath(path)
    _check_destination(path)
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=parent, prefix=".lpx-artifact-")
    os.chmod(tmp, user_mode(0o777))  # mkdtemp makes it private (0700)
    try:
        os.makedirs(os.path.join(tmp, "regions"))
        exe.vm_exec.export_library(os.path.join(tmp, "cpu.so"))
        regions = []
        for name, r in exe.regions.items():
            save_program(r.program, os.path.join(tmp, "regions", f"{name}.lpx"))
            regions.append({"name": name, "inputs": [[n, list(s)] for n, s in r.inputs],
                            "outputs": [[n, list(s)] for n, s in r.outputs], "macs": r.macs, "ops": r.ops,
                            "weight_bytes": r.weight_bytes, "streamed_bytes": r.streamed_bytes,
                            "input_transforms": r.input_transforms, "layer_names": r.layer_names})
        manifest = {
            "format": FORMAT, "version": VERSION, "config": exe.config.to_json(), "precision": exe.precision,
            # Size and SHA-256 of every file, checked before anything is loaded (a truncated
            # cpu.so would otherwise crash the process inside the dynamic loader).
            "files": {rel: _file_digest(os.path.join(tmp, rel))
                      for rel in ["cpu.so"] + [f"regions/{name}.lpx" for name in exe.regions]},
            "inputs": [[n, list(s), str(d)] for n, s, d in inputs], "outputs": list(outputs),
            "regions": regions, "offload": (exe.offload or Offload()).to_json(), "tuning": exe.tuning,
        }
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        _check_destination(path)  # again: it may have changed while the artifact was written
        if os.path.isdir(path) and os.listdir(path):
            old = tempfile.mkdtemp(dir=parent, prefix=".lpx-artifact-old-")
            os.replace(path, os.path.join(old, "artifact"))
            try:
                os.replace(tmp, path)
            except BaseException:
                os.replace(os.path.join(old, "artifact"), path)  # put the old artifact back
                raise
            shutil.rmtree(old, ignore_errors=True)
        else:
            if os.path.isdir(path):
                os.rmdir(path)  # empty
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _file_digest(path: str) -> dict:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"size": os.path.getsize(path), "sha256": h.hexdigest()}


def _check_files(path: str, files: dict):
    """Every file the manifest lists is there, of its size and hash."""
    if not isinstance(files, dict):
        raise ArtifactError(f"{path}: corrupt manifest (files)")
    for rel, want in files.items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise ArtifactError(f"{path}: missing {rel}")
        size = os.path.getsize(full)
        if not isinstance(want, dict) or size != want.get("size"):
            raise ArtifactError(f"{path}: {rel} is {size} bytes, the manifest says {want.get('size')} "
                                "(truncated or replaced): compile the model again")
        if _file_digest(full)["sha256"] != want.get("sha256"):
            raise ArtifactError(f"{path}: {rel} does not match its checksum in the manifest (corrupt or "
                                "replaced): compile the model again")


def load_artifact(path: str) -> tuple:
    """Read an artifact folder back: ``(executable, inputs, outputs)``, runnable."""
    manifest_path = os.path.join(path, "manifest.json")
    if not os.path.isfile(manifest_path):
        raise ArtifactError(f"{path}: not an LPX artifact (no manifest.json)")
    try:
        with open(manifest_path) as f:
            manifest = json.load(f)
    except json.JSONDecodeError as e:
        raise ArtifactError(f"{manifest_path}: corrupt manifest ({e})") from None
    if manifest.get("format") != FORMAT or manifest.get("version") != VERSION:
        raise ArtifactError(f"{path}: artifact format {manifest.get('format')} v{manifest.get('version')}, "
                            f"this lpx_tvm reads {FORMAT} v{VERSION}")
    if "files" in manifest:  # artifacts written before the manifest listed its files have no list
        _check_files(path, manifest["files"])
    cfg = parse_config(manifest["config"], f"{path} config")
    regions = {}
    for r in manifest["regions"]:
        prog = load_program(os.path.join(path, "regions", f"{r['name']}.lpx"))
        regions[r["name"]] = CompiledRegion(r["name"], prog, [(n, tuple(s)) for n, s in r["inputs"]],
                                            [(n, tuple(s)) for n, s in r["outputs"]], r["macs"], r["ops"],
                                            r.get("weight_bytes", 0), r.get("streamed_bytes", 0),
                                            r.get("input_transforms", {}), r.get("layer_names", {}))
    so = os.path.join(path, "cpu.so")
    if not os.path.isfile(so):
        raise ArtifactError(f"{path}: missing cpu.so")
    vm_exec = relax.VMExecutable(tvm.runtime.load_module(so))
    exe = LPXExecutable(vm_exec, regions, cfg, manifest["precision"], Offload.from_json(manifest["offload"]),
                        manifest.get("tuning"))
    return exe, [(n, tuple(s), d) for n, s, d in manifest["inputs"]], manifest["outputs"]
