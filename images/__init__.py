"""Build the operator and resolver images as reproducible OCI image archives, offline.

``make images`` (``python -m images build``) writes ``dist/images/rtj-operator.oci.tar`` and
``dist/images/rtj-resolver.oci.tar``: ``oci-archive`` tarballs of an OCI image layout
(``oci-layout``, ``index.json``, ``blobs/sha256/...``) that ``ctr -n k8s.io images import``,
``skopeo copy oci-archive:...`` and ``crane push`` take as they are, plus an SPDX SBOM next to
each and ``build-info.json`` with the digests.

Why this tool and not buildah, BuildKit or crane
-------------------------------------------------
The machines this runs on have no container daemon, no registry and no fuse/overlay setup
for an unprivileged builder, but they do have Python and reach PyPI and the Debian archive.
An OCI image is a handful of JSON documents and gzipped tarballs named by their sha256, so
the assembler here is ~stdlib only (``tarfile``, ``gzip``, ``hashlib``, ``json``):

- **buildah** (Debian package) needs a storage driver (overlay with fuse-overlayfs or vfs),
  subuid/subgid maps or root, and a base image to start ``FROM``: with no registry that base
  would itself have to be assembled by hand first. Its output is reproducible only with
  care (``--timestamp``, and layers still carry whatever ``RUN`` wrote).
- **BuildKit daemonless** (``buildctl-daemonless.sh``, Go module) runs ``buildkitd`` with
  rootlesskit underneath; ``RUN`` steps need runc and namespaces, and every ``FROM`` needs
  a registry or an OCI layout we would again have to make ourselves.
- **go-containerregistry** (``crane append``) appends tarballs to a base image by digest;
  with no registry the base is again something we build. It would be a good fit for
  *pushing* (documented in docs/operations.md), not for building.

So the "pinned base by digest" of issue 22 becomes: the base is a distroless-style root
filesystem made from **Debian bookworm packages pinned by version and sha256** in
``images/debian.lock.json`` (the closure of the Depends fields of ``python3.11-minimal``,
``libpython3.11-stdlib``, ``ca-certificates``, ``netbase`` and ``base-files``, less what only
maintainer scripts need), and its layer digest is recorded in ``build-info.json`` and in
the manifest's annotations. It is the first layer of both images, byte for byte the same,
so a node stores it once. Python distributions come from ``images/python.lock.json`` (exact
wheels with sha256, resolved for CPython 3.11 / manylinux up to glibc 2.36, which is what
the Debian packages provide). Our two packages are built from the working tree with a
pinned setuptools, run by the image's own interpreter.

Nothing runs inside the image at build time (no ``RUN``): packages are unpacked with
``tarfile``/``lzma`` from the ``.deb`` (an ``ar`` archive), wheels are unzipped, console
scripts are written, and ``.pyc`` files are compiled by the image's own ``python3.11``
started through the image's own dynamic loader (``ld-linux-x86-64.so.2 --library-path``),
so no host Python or glibc leaks into the result. This works on an x86_64 build host for an
amd64 image; another architecture would need that one step under emulation.

Reproducible: every mtime is ``SOURCE_DATE_EPOCH`` (the lock's value unless the environment
sets one), tar entries are sorted, owners are numeric (0, except ``/home/nonroot``: 65532),
gzip headers carry no name or time, ``.pyc`` files are unchecked-hash based and compiled in
one process with ``PYTHONHASHSEED=0``, and nothing records a host path.
``tests/integration/images`` builds twice and compares digests. What the build host still
contributes is the assembler's own runtime: Python's ``tarfile`` (the layers' uncompressed
bytes, hence the diff_ids) and its zlib (the gzip bytes, hence the layer digests); the same
Python minor version and zlib give the same archives on another machine.

Runtime shape: user 65532:65532, no shell or coreutils in the root filesystem, nothing
written at run time (``PYTHONDONTWRITEBYTECODE=1`` and every module precompiled), so
``readOnlyRootFilesystem: true`` works.
"""
