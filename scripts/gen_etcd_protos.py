"""Regenerate aioelastic/_etcd/_pb/*_pb2.py(i) from aioelastic/_etcd/protos/*.proto.

The one command (from the repository root, with the pinned generator)::

    pip install grpcio-tools==1.66.2 && python scripts/gen_etcd_protos.py

grpcio-tools 1.66.2 emits protobuf gencode 5.27.2, which imports on protobuf 5.27.2 through 7.x;
a newer grpcio-tools would force a newer protobuf floor on users. Only messages are generated: the
gRPC bindings are written by hand in ``aioelastic/_etcd/_rpc.py`` (no ``grpcio>=X`` import check,
wire paths kept as etcd's). The protos are staged under ``aioelastic/_etcd/_pb/`` in a temporary
tree so that the generated imports read ``from aioelastic._etcd._pb import kv_pb2``.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCES = ROOT / "aioelastic" / "_etcd" / "protos"
PACKAGE = pathlib.PurePosixPath("aioelastic/_etcd/_pb")
NAMES = ("kv.proto", "rpc.proto")


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        stage = pathlib.Path(tmp) / PACKAGE
        stage.mkdir(parents=True)
        for name in NAMES:
            shutil.copy(SOURCES / name, stage / name)
        command = [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{tmp}",
            f"--python_out={ROOT}",
            f"--pyi_out={ROOT}",
            *(str(PACKAGE / name) for name in NAMES),
        ]
        print(" ".join(command))
        return subprocess.call(command, cwd=tmp)


if __name__ == "__main__":
    sys.exit(main())
