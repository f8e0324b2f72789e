#!/usr/bin/env python3
"""Write a container image tarball from local static binaries and files -- no registry, no
Docker daemon, no base image.

usage: mkimage.py [options] NAME:TAG OUT.tar ENTRYPOINT SRC:DEST [SRC:DEST ...]

  ENTRYPOINT   path inside the image ("/revault-worker"), or a JSON array ('["/x","--y"]')
  SRC:DEST     copy local file SRC to DEST in the image (mode normalised to 0755 if SRC is
               executable, else 0644; owner root)
options:
  --user UID[:GID]   user the process runs as (default 65532:65532, "nonroot")
  --workdir DIR      working directory (default /)
  --env K=V          environment variable (repeatable; PATH defaults to /usr/local/bin:/usr/bin:/bin:/)
  --cmd ARG          default arguments after the entrypoint (repeatable; --cmd=--flag for dashes)
  --label K=V        image label (repeatable)
  --dir DEST[:MODE]  create an empty directory owned by --user (repeatable; MODE octal, default
                     0755). /tmp is always created, mode 1777.

The tarball is both a `docker save` archive (manifest.json + repositories) and an OCI image
layout (oci-layout + index.json + blobs/sha256/...), the same dual layout `docker save` writes
since Docker 25. It loads with `docker load`, `kind load image-archive` and
`ctr -n k8s.io images import`. Output is deterministic: identical inputs give a byte-identical
file (all timestamps are SOURCE_DATE_EPOCH, default 0; entries are sorted; owners fixed).
Prints "OUT NAME sha256:<image id>" on success.
"""
import argparse
import hashlib
import io
import json
import os
import platform
import sys
import tarfile
import tempfile
import time

EPOCH = int(os.environ.get("SOURCE_DATE_EPOCH", "0"))
CREATED = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(EPOCH))
ARCH = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
DEFAULT_PATH = "PATH=/usr/local/bin:/usr/bin:/bin:/"


def fail(msg):
    sys.exit("mkimage: ERROR: " + msg)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="mkimage.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="mkimage.py [options] NAME:TAG OUT.tar ENTRYPOINT SRC:DEST [SRC:DEST ...]")
    p.add_argument("--user", default="65532:65532")
    p.add_argument("--workdir", default="/")
    p.add_argument("--env", action="append", default=[])
    p.add_argument("--cmd", action="append", default=None)
    p.add_argument("--label", action="append", default=[])
    p.add_argument("--dir", action="append", default=[])
    p.add_argument("name")
    p.add_argument("out")
    p.add_argument("entrypoint")
    p.add_argument("files", nargs="+", metavar="SRC:DEST")
    a = p.parse_args(argv)
    if ":" not in a.name.rsplit("/", 1)[-1]:
        fail(f"image name {a.name!r} needs an explicit :TAG")
    if ":" not in a.user:
        a.user += ":" + a.user
    uid, gid = (int(x) for x in a.user.split(":", 1))
    a.uid, a.gid = uid, gid
    for kv in a.env + a.label:
        if "=" not in kv:
            fail(f"expected K=V, got {kv!r}")
    return a


def normalize_ref(name):
    """docker.io/library/ prefixing as docker and containerd do, for index.json's
    io.containerd.image.name annotation."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        return "docker.io/library/" + name
    if "." not in first and ":" not in first and first != "localhost":
        return "docker.io/" + name
    return name


def tarinfo(name, kind=tarfile.REGTYPE, mode=0o644, size=0, uid=0, gid=0):
    ti = tarfile.TarInfo(name)
    ti.type, ti.mode, ti.size, ti.mtime = kind, mode, size, EPOCH
    ti.uid, ti.gid, ti.uname, ti.gname = uid, gid, "", ""
    return ti


def build_layer(a, fileobj):
    """Write the single filesystem layer (uncompressed tar) to fileobj."""
    files = []
    for spec in a.files:
        if ":" not in spec:
            fail(f"expected SRC:DEST, got {spec!r}")
        src, dest = spec.split(":", 1)
        if not os.path.isfile(src):
            fail(f"no such file: {src}")
        files.append((src, dest.strip("/")))
    dests = [d for _, d in files]
    if len(set(dests)) != len(dests):
        fail("the same DEST is given twice")

    entries = {}  # path -> TarInfo (+ source path for files); a dict keeps one entry per path

    def add_parents(path):
        d = os.path.dirname(path)
        while d and d not in entries:
            entries[d] = (tarinfo(d, tarfile.DIRTYPE, 0o755), None)
            d = os.path.dirname(d)

    entries["tmp"] = (tarinfo("tmp", tarfile.DIRTYPE, 0o1777), None)
    for spec in a.dir:
        dest, _, mode = spec.partition(":")
        dest = dest.strip("/")
        add_parents(dest)
        entries[dest] = (tarinfo(dest, tarfile.DIRTYPE, int(mode or "755", 8), uid=a.uid, gid=a.gid), None)
    # A minimal passwd/group so the non-root user has a name and a home (like distroless).
    if "etc/passwd" not in dests:
        passwd = b"root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
        group = b"root:x:0:\nnonroot:x:65532:\n"
        add_parents("etc/passwd")
        entries["etc/passwd"] = (tarinfo("etc/passwd", size=len(passwd)), passwd)
        if "etc/group" not in dests:
            entries["etc/group"] = (tarinfo("etc/group", size=len(group)), group)
    for src, dest in files:
        add_parents(dest)
        mode = 0o755 if os.access(src, os.X_OK) else 0o644
        entries[dest] = (tarinfo(dest, mode=mode, size=os.path.getsize(src)), src)

    with tarfile.open(fileobj=fileobj, mode="w", format=tarfile.PAX_FORMAT) as t:
        for path in sorted(entries):
            ti, data = entries[path]
            if data is None:
                t.addfile(ti)
            elif isinstance(data, bytes):
                t.addfile(ti, io.BytesIO(data))
            else:
                with open(data, "rb") as f:
                    t.addfile(ti, f)


def sha256_file(f):
    h = hashlib.sha256()
    f.seek(0)
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    f.seek(0)
    return h.hexdigest()


def main(argv):
    a = parse_args(argv)
    entry = json.loads(a.entrypoint) if a.entrypoint.startswith("[") else [a.entrypoint]
    env = [] if any(e.startswith("PATH=") for e in a.env) else [DEFAULT_PATH]
    env += a.env

    with tempfile.TemporaryFile(dir=os.path.dirname(os.path.abspath(a.out))) as layer:
        build_layer(a, layer)
        layer_size = layer.seek(0, os.SEEK_END)
        layer_sha = sha256_file(layer)

        cfg = {"architecture": ARCH, "os": "linux", "created": CREATED,
               "config": {"User": a.user, "Env": env, "Entrypoint": entry, "WorkingDir": a.workdir},
               "rootfs": {"type": "layers", "diff_ids": ["sha256:" + layer_sha]},
               "history": [{"created": CREATED, "created_by": "hack/mkimage.py"}]}
        if a.cmd is not None:
            cfg["config"]["Cmd"] = a.cmd
        if a.label:
            cfg["config"]["Labels"] = dict(kv.split("=", 1) for kv in sorted(a.label))
        cfg_b = json.dumps(cfg, sort_keys=True, separators=(",", ":")).encode()
        cfg_sha = hashlib.sha256(cfg_b).hexdigest()

        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": "sha256:" + cfg_sha, "size": len(cfg_b)},
                    "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                                "digest": "sha256:" + layer_sha, "size": layer_size}]}
        man_b = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
        man_sha = hashlib.sha256(man_b).hexdigest()
        repo, tag = a.name.rsplit(":", 1)
        index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                 "manifests": [{"mediaType": manifest["mediaType"], "digest": "sha256:" + man_sha,
                                "size": len(man_b),
                                "annotations": {"io.containerd.image.name": normalize_ref(a.name),
                                                "org.opencontainers.image.ref.name": tag}}]}
        docker_manifest = [{"Config": "blobs/sha256/" + cfg_sha, "RepoTags": [a.name],
                            "Layers": ["blobs/sha256/" + layer_sha]}]
        meta = {
            "oci-layout": {"imageLayoutVersion": "1.0.0"},
            "index.json": index,
            "manifest.json": docker_manifest,
            "repositories": {repo: {tag: layer_sha}},
        }

        tmp_out = a.out + ".tmp"
        with tarfile.open(tmp_out, "w", format=tarfile.PAX_FORMAT) as t:
            for d in ("blobs", "blobs/sha256"):
                t.addfile(tarinfo(d, tarfile.DIRTYPE, 0o755))
            blobs = {cfg_sha: cfg_b, man_sha: man_b}
            for sha in sorted([cfg_sha, man_sha, layer_sha]):
                name = "blobs/sha256/" + sha
                if sha == layer_sha:
                    t.addfile(tarinfo(name, size=layer_size), layer)
                else:
                    t.addfile(tarinfo(name, size=len(blobs[sha])), io.BytesIO(blobs[sha]))
            for name in sorted(meta):
                b = json.dumps(meta[name], sort_keys=True, separators=(",", ":")).encode()
                t.addfile(tarinfo(name, size=len(b)), io.BytesIO(b))
        os.replace(tmp_out, a.out)
    print(a.out, a.name, "sha256:" + cfg_sha)


if __name__ == "__main__":
    main(sys.argv[1:])
