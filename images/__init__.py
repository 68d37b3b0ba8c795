"""fluffy's container images: definitions, content-hash tags, and the local builder.

Images are built on this machine from ordinary Dockerfiles (one folder each, beside
this file).  The base ``debian:bookworm-slim`` is pulled when a registry answers and
otherwise made with debootstrap and imported (:mod:`fluffy.images.base`).  Python
packages come from a wheelhouse downloaded on the host (:mod:`fluffy.images.wheelhouse`)
against pinned locks in ``requirements/``.  Each image is tagged with a hash of
everything that goes into it (:mod:`fluffy.images.hashing`), so an unchanged image is
never rebuilt.
"""

from fluffy.images.spec import IMAGES, ImageSpec, spec_for_template

__all__ = ["IMAGES", "ImageSpec", "spec_for_template"]
