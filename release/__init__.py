"""``make release`` (``python -m release build``): every artifact of a release, locally.

Nothing is published from here. The output (``dist/release`` by default) holds:

- ``images/``: the two OCI image archives, their SPDX SBOMs and ``build-info.json``, from
  ``images.build.build`` (reused when ``dist/images`` is fresh);
- ``chart/``: the Helm chart packaged by ``helm package`` and re-stamped reproducibly, ready
  for ``helm push`` to an ``oci://`` registry;
- ``python/``: wheel and sdist of ``resilient-training-operator`` and ``rtj-shim``: each
  sdist built from the tree, each wheel built *from that sdist*, with the setuptools pinned
  in ``images/python.lock.json`` and ``SOURCE_DATE_EPOCH``; the wheels are byte for byte the
  ones inside the images (checked against the images' SBOMs);
- ``requirements/``: hash-pinned requirement files (our wheels by sha256 plus the locked
  dependencies of each image), so an install can never take one of our names from an index;
- ``release-info.json`` (names, versions, sizes, sha256, image manifest digests) and
  ``SHA256SUMS`` over every file.

Modules: ``common`` (paths, the error, running tools), ``checks`` (versions, chart images,
locked dependencies, before anything is built), ``artifacts`` (sdists, wheels, the chart,
requirement files), ``build`` (the order, staging, release-info.json and SHA256SUMS).

docs/release.md explains verifying, publishing and signing.
"""
