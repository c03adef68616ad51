# pepsi-dispatch in a container, built from this repository:
#
#   docker build -t pepsi-dispatch .
#   docker run --rm -e PEPSI_DSN=postgresql://... pepsi-dispatch pepsi-queue migrate
#   docker run -d -v $PWD/pepsi.conf:/etc/pepsi.conf:ro pepsi-dispatch
#
# Stage programs live in an image of your own: FROM pepsi-dispatch, COPY them in
# and name them in pepsi.conf. tini is PID 1: it forwards SIGTERM to the
# dispatcher (which stops its workers and releases their rows) and reaps any
# orphaned grandchildren of stage programs.

FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE alembic.ini ./
COPY migrations ./migrations
COPY sql ./sql
COPY man ./man
COPY pepsi_dispatch ./pepsi_dispatch
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin pepsi
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
# Already the service user: the dispatcher has no privileges to drop.
USER pepsi
ENV PEPSI_CONFIG=/etc/pepsi.conf
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["pepsi-dispatch", "serve"]
