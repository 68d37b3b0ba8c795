# The install stage of every image that carries fluffy, written once: the builder
# (images/builder.py, dockerfile()) puts it in front of the image's own Dockerfile, which
# then copies /opt/fluffy from it.  Python packages come from wheels downloaded on the
# host (no index inside the build); fluffy's own source goes to /opt/fluffy/lib, found
# through a .pth file.  Built with the classic builder (no BuildKit features).
ARG PARENT_IMAGE
FROM ${PARENT_IMAGE} AS install
USER root
COPY requirements.lock /tmp/fluffy/requirements.lock
COPY wheels/ /tmp/fluffy/wheels/
RUN /opt/fluffy/venv/bin/pip install --no-index --no-cache-dir --disable-pip-version-check \
      --find-links /tmp/fluffy/wheels --requirement /tmp/fluffy/requirements.lock
COPY fluffy/ /opt/fluffy/lib/fluffy/
RUN python3 -m compileall -q /opt/fluffy/lib \
 && echo /opt/fluffy/lib > /opt/fluffy/venv/lib/python3.11/site-packages/fluffy-source.pth
