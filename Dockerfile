# One image for every mvsink service (mint, write, append) and the CLI.
# The write service runs Spark in local mode inside its container (or against --master), so the
# image carries a Java 17 runtime for the Spark driver.
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps \
 && rm -rf /var/lib/apt/lists/*

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MVSINK_STATE_DIR=/var/lib/mvsink

WORKDIR /opt/mvsink
COPY pyproject.toml README.md ./
COPY mvsink ./mvsink
COPY services ./services
COPY schemas ./schemas
RUN pip install -e . \
 && useradd --system --home /var/lib/mvsink --create-home mvsink
USER mvsink

ENTRYPOINT []
CMD ["mvsink", "--help"]
