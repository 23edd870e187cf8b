# The services image: mint, write (Spark in local mode, or a cluster by `--master`), append, the
# demo's view job, the `mvsink` CLI, and Spark's standalone master and workers (the Spark inside
# PySpark). Two stages: the build stage installs the Python dependencies into a virtualenv (pip,
# network); the runtime stage is the same Debian base with only Python and a Java 17 runtime for
# Spark, plus that virtualenv and the source tree (the project is installed editable:
# `mvsink.core.codec` reads `schemas/` beside the package).
#
# BASE is any Debian bookworm image (`debian:bookworm-slim` from a registry, or one made with
# debootstrap where no registry answers: `mvsink compose verify` does that). BUILD_CA is an
# optional PEM bundle trusted by the build stage only (a TLS-intercepting proxy's CA), never
# copied into the runtime image.
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
ARG BUILD_CA=""
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY docker/trust-build-ca /usr/local/bin/
RUN trust-build-ca
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /opt/mvsink
# Dependencies first, from pyproject.toml alone, so a code change reuses this layer.
COPY pyproject.toml ./
RUN python3 -m venv venv \
 && venv/bin/pip install --quiet --upgrade pip \
 && python3 -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > /tmp/requirements.txt \
 && venv/bin/pip install --quiet -r /tmp/requirements.txt
COPY README.md ./
COPY schemas ./schemas
COPY services ./services
COPY mvsink ./mvsink
COPY examples ./examples
RUN venv/bin/pip install --quiet --no-deps -e . \
 && find /opt/mvsink -name __pycache__ -prune -exec rm -rf {} +

FROM ${BASE}
# Java's postinst links its man page; slim bases may lack the directory.
RUN mkdir -p /usr/share/man/man1 \
 && apt-get update \
 && apt-get install -y --no-install-recommends python3 openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --user-group --home-dir /var/lib/mvsink --create-home mvsink
COPY --from=build /opt/mvsink /opt/mvsink
# The healthchecks of the services and the Spark daemons (`docker-compose.yaml`).
COPY docker/http-ready /usr/local/bin/http-ready
ENV PATH=/opt/mvsink/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MVSINK_STATE_DIR=/var/lib/mvsink
# The Spark inside the installed PySpark (its jars and `bin/spark-class`): the compose file's
# spark-master and spark-worker run its standalone daemons.
ENV SPARK_HOME=/opt/mvsink/venv/lib/python3.11/site-packages/pyspark
USER mvsink
WORKDIR /var/lib/mvsink
ENTRYPOINT []
CMD ["mvsink", "--help"]
